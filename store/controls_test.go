package store

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
)

// TestControlAnswersSurviveReopenAndKeepTheLatest pins what a restarted
// gateway reads: the first answer to each request, across a reopen, for
// the latest MaxControls requests.
func TestControlAnswersSurviveReopenAndKeepTheLatest(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.db")
	db := openAt(t, path)
	for i := range MaxControls + 10 {
		if err := db.RememberControl(ctx, fmt.Sprintf("c%d", i), fmt.Appendf(nil, `{"n":%d}`, i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.RememberControl(ctx, "c20", []byte(`{"n":"second"}`)); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openAt(t, path)
	for i := range MaxControls + 10 {
		got, ok, err := db.RecallControl(ctx, fmt.Sprintf("c%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if want := i >= 10; ok != want {
			t.Errorf("c%d remembered = %v, want %v", i, ok, want)
			continue
		}
		if ok && string(got) != fmt.Sprintf(`{"n":%d}`, i) {
			t.Errorf("c%d answer = %s, want the first one", i, got)
		}
	}
	if err := db.RememberControl(ctx, "a/b", nil); err == nil {
		t.Error("an invalid request ID was kept")
	}
}
