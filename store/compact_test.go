package store_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/store"
)

func TestCompactShrinksAndKeepsData(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missions.db")
	db, err := store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	old := time.Now().Add(-time.Hour)
	var keep string
	for i := range 400 {
		id := fmt.Sprintf("%024d", i)
		m := &driver.Mission{ID: id, Type: "t", State: driver.StateSucceeded, Version: 1, Seq: 1,
			Steps:   []driver.Step{{ID: "a", Kind: "k", Params: []byte(`{"pad":"0123456789012345678901234567890123456789"}`)}},
			Results: []driver.StepResult{{Status: driver.StepSucceeded}},
			Meta:    driver.Metadata{Created: old, Updated: old, Finished: old}}
		if _, _, err := db.Create(ctx, m, []driver.Event{{MissionID: id, Seq: 1, Input: driver.InSubmit, To: driver.StateSucceeded, Time: old}}); err != nil {
			t.Fatal(err)
		}
		keep = id
	}
	if _, err := db.Prune(ctx, time.Now(), 1); err != nil {
		t.Fatal(err)
	}
	// While the store is open, compaction must refuse rather than wait.
	if _, _, err := store.Compact(path, store.Options{Timeout: 50 * time.Millisecond}); !errors.Is(err, store.ErrLocked) {
		t.Fatalf("compact of an open store: %v, want ErrLocked", err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	before, after, err := store.Compact(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if after >= before {
		t.Errorf("compaction did not shrink the file: %d -> %d bytes", before, after)
	}
	db, err = store.Open(path, store.Options{})
	if err != nil {
		t.Fatalf("reopen after compaction: %v", err)
	}
	defer func() {
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	}()
	if m, err := db.Get(ctx, keep); err != nil || m.State != driver.StateSucceeded {
		t.Fatalf("kept mission after compaction: %v %v", m, err)
	}
	if evs, err := db.Timeline(ctx, keep); err != nil || len(evs) != 1 {
		t.Fatalf("timeline after compaction: %v %v", evs, err)
	}
	if _, err := db.Get(ctx, fmt.Sprintf("%024d", 0)); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("pruned mission came back: %v", err)
	}
}
