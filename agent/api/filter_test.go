package api

import (
	"net/url"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/store"
)

// FuzzMissionFilter: any query either parses into a filter the store
// accepts or is refused with an error; it never panics.
func FuzzMissionFilter(f *testing.F) {
	for _, q := range []string{"", "state=running,FAILED&scene=go_home", "since=2h&until=2025-03-01T21:30:00Z", "limit=0", "limit=1000", "cursor=zz", "state=", "since=-1h", "x=1"} {
		f.Add(q)
	}
	now := time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		flt, err := missionFilter(q, now)
		if err != nil {
			return
		}
		if flt.Limit < 0 || flt.Limit > store.MaxLimit {
			t.Errorf("limit %d accepted from %q", flt.Limit, raw)
		}
		for _, s := range flt.States {
			if !s.Valid() {
				t.Errorf("state %q accepted from %q", s, raw)
			}
		}
	})
}
