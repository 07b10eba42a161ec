package agent

import (
	"net/http"
	"testing"

	"github.com/sortie-edge/sortie/agent/api"
)

// TestAPIShortIDs: the 8-character IDs the progress view prints work in
// the API (and so in the CLI); too short or unknown ones do not.
func TestAPIShortIDs(t *testing.T) {
	f := newAPIFixture(t, "")
	id := f.submit(t, "many", "short-1")
	var got struct {
		Mission struct {
			ID string `json:"id"`
		} `json:"mission"`
	}
	if code := f.do(t, "GET", "/api/missions/"+id[len(id)-8:], "", &got); code != http.StatusOK || got.Mission.ID != id {
		t.Fatalf("GET by short ID: %d %+v, want %s", code, got, id)
	}
	// Its start, as copied from a list, when it is the only match (a
	// second mission shares the leading time digits, so take enough).
	f.submit(t, "many", "short-2")
	if code := f.do(t, "GET", "/api/missions/"+id[:16], "", &got); code != http.StatusOK || got.Mission.ID != id {
		t.Fatalf("GET by ID prefix: %d %+v, want %s", code, got, id)
	}
	f.wantError(t, "GET", "/api/missions/"+id[:6], "", http.StatusBadRequest, api.CodeBadRequest)
	f.wantError(t, "GET", "/api/missions/"+id[len(id)-3:], "", http.StatusNotFound, api.CodeNotFound)
	f.wantError(t, "GET", "/api/missions/zzzzzzzz", "", http.StatusNotFound, api.CodeNotFound)
}
