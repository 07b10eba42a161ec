package store_test

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/store"
)

// finishedStore creates a store of n finished missions, each with pad
// bytes of parameters that do not compress, at path and returns it open, with the ID of the
// last.
func finishedStore(t *testing.T, path string, n, pad int) (db *store.DB, last string) {
	t.Helper()
	db, err := store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	old := time.Now().Add(-time.Hour)
	for i := range n {
		last = fmt.Sprintf("%024d", i)
		m := &driver.Mission{ID: last, Type: "t", State: driver.StateSucceeded, Version: 1, Seq: 1,
			Steps:   []driver.Step{{ID: "a", Kind: "k", Params: []byte(`{"pad":"` + hex.EncodeToString(noise(i, pad/2)) + `"}`)}},
			Results: []driver.StepResult{{Status: driver.StepSucceeded}},
			Meta:    driver.Metadata{Created: old, Updated: old, Finished: old}}
		if _, _, err := db.Create(ctx, m, []driver.Event{{MissionID: last, Seq: 1, Input: driver.InSubmit, To: driver.StateSucceeded, Time: old}}); err != nil {
			t.Fatal(err)
		}
	}
	return db, last
}

func TestCompactShrinksAndKeepsData(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missions.db")
	db, keep := finishedStore(t, path, 400, 40)
	ctx := context.Background()
	if _, err := db.Prune(ctx, time.Now(), 1); err != nil {
		t.Fatal(err)
	}
	// While the store is open, compaction must refuse rather than wait.
	if _, err := store.Compact(path, store.Options{Timeout: 50 * time.Millisecond}); !errors.Is(err, store.ErrLocked) {
		t.Fatalf("compact of an open store: %v, want ErrLocked", err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	res, err := store.Compact(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.After >= res.Before || res.Kept {
		t.Errorf("compaction did not shrink the file: %+v", res)
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

// TestCompactNeverGrowsAPrunedFile: a store that retention pruned from
// 1,000 missions to 460 (of 10 KB each) and then rewrote (Reclaim, as
// the retention loop does) has nothing to give back; compacting it
// leaves the file as it was, and says so. (agent compact once turned
// such a file of 6.2 MiB into one of 8.0 MiB: bbolt's default
// allocation rounds a copy up to a power of two, here 3.8 MiB to 4.)
func TestCompactNeverGrowsAPrunedFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missions.db")
	db, keep := finishedStore(t, path, 1000, 10000)
	ctx := context.Background()
	if _, err := db.Prune(ctx, time.Now(), 460); err != nil {
		t.Fatal(err)
	}
	if _, _, err := db.Reclaim(ctx); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	res, err := store.Compact(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("1,000 missions pruned to 460 and reclaimed, then compacted: %+v", res)
	switch {
	case res.After > res.Before || fi.Size() != res.After:
		t.Fatalf("compaction grew the file: %+v, %d bytes on disk", res, fi.Size())
	case !res.Kept && res.After >= res.Before:
		t.Fatalf("a compaction that gained nothing replaced the file: %+v", res)
	}
	if _, err := os.Stat(path + ".compact"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the dropped copy is left behind: %v", err)
	}
	db, err = store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }() // read only
	if _, err := db.Get(ctx, keep); err != nil {
		t.Errorf("kept mission after compaction: %v", err)
	}
}

// noise is n bytes that do not compress, the same for the same seed.
func noise(seed, n int) []byte {
	b := make([]byte, n)
	_, _ = rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)}).Read(b) // ChaCha8 never fails
	return b
}
