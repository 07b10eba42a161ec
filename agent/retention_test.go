package agent

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/store"
)

// TestRetentionPolicy: deletes what is past max_age or beyond max_count
// (oldest first), keeps active missions, and the result survives reopen.
func TestRetentionPolicy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missions.db")
	db, err := store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	now := time.Now()
	add := func(i int, state driver.State, age time.Duration) string {
		at := now.Add(-age)
		id := fmt.Sprintf("%024d", i)
		m := &driver.Mission{ID: id, Type: "t", State: state, Version: 1, Seq: 1,
			Steps:   []driver.Step{{ID: "a", Kind: "k"}},
			Results: []driver.StepResult{{Status: driver.StepSucceeded}},
			Meta:    driver.Metadata{Created: at, Updated: at}}
		if state.Terminal() {
			m.Meta.Finished = at
		}
		if _, _, err := db.Create(ctx, m, []driver.Event{{MissionID: id, Seq: 1, Input: driver.InSubmit, To: state, Time: at}}); err != nil {
			t.Fatal(err)
		}
		return id
	}
	ancient := add(1, driver.StateSucceeded, 40*24*time.Hour)
	var recent []string
	for i := range 5 {
		recent = append(recent, add(10+i, driver.StateFailed, time.Duration(5-i)*time.Hour))
	}
	active := add(99, driver.StatePaused, 50*24*time.Hour)

	n, err := prune(ctx, db, RetentionOptions{MaxAge: 30 * 24 * time.Hour, MaxCount: 3}, now)
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 { // the ancient one by age, the two oldest recent ones by count
		t.Errorf("deleted %d, want 3", n)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db, err = store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := db.Close(); err != nil {
			t.Errorf("close store: %v", err)
		}
	}()
	gone := []string{ancient, recent[0], recent[1]}
	kept := []string{recent[2], recent[3], recent[4], active}
	for _, id := range gone {
		if _, err := db.Get(ctx, id); err == nil {
			t.Errorf("mission %s survived retention", id)
		}
	}
	for _, id := range kept {
		if _, err := db.Get(ctx, id); err != nil {
			t.Errorf("mission %s deleted: %v", id, err)
		}
	}
}

// TestRetentionByBytesGivesSpaceBack: a byte budget deletes the oldest
// finished missions until the data fits, and the file, grown past the
// budget by a burst, is rewritten to give the space back.
func TestRetentionByBytesGivesSpaceBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missions.db")
	db, err := store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	}()
	ctx := context.Background()
	now := time.Now()
	params := []byte(`{"device":"living-light","action":"turn_on","params":{"brightness":80},"note":"` + fmt.Sprintf("%0400d", 0) + `"}`)
	for i := range 4000 {
		at := now.Add(time.Duration(i-4000) * time.Minute)
		id := fmt.Sprintf("%024d", i)
		m := &driver.Mission{ID: id, Type: "t", State: driver.StateSucceeded, Version: 1, Seq: 1,
			Steps:   []driver.Step{{ID: "a", Kind: "k", Params: params}},
			Results: []driver.StepResult{{Status: driver.StepSucceeded}},
			Meta:    driver.Metadata{Created: at, Updated: at, Finished: at, TraceID: fmt.Sprintf("%032x", i)}}
		if _, _, err := db.Create(ctx, m, []driver.Event{{MissionID: id, Seq: 1, Input: driver.InSubmit, To: m.State, Time: at}}); err != nil {
			t.Fatal(err)
		}
	}
	full, err := db.Stats()
	if err != nil {
		t.Fatal(err)
	}
	budget := full.FileSize / 4
	r := RetentionOptions{MaxBytes: budget}
	n, err := prune(ctx, db, r, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := reclaim(ctx, db, r.MaxBytes); err != nil {
		t.Fatal(err)
	}
	st, err := db.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d missions in %d bytes; budget %d: deleted %d, %d left in %d bytes (%d free)", full.Missions, full.FileSize, budget, n, st.Missions, st.FileSize, st.FreeBytes)
	if n == 0 || st.Missions == 0 || st.FileSize > budget+budget/4 {
		t.Errorf("after a byte budget of %d: %d missions in a %d-byte file", budget, st.Missions, st.FileSize)
	}
	if _, err := db.Get(ctx, fmt.Sprintf("%024d", 3999)); err != nil {
		t.Errorf("the newest mission was deleted: %v", err)
	}
}
