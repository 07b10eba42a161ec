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
