package store

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/store/internal/wal"
)

// TestHooksReportCommitsCheckpointsAndPrunes: OnCommit hears every group
// commit (as many as Stats.Commits), before the writes return;
// OnCheckpoint every checkpoint (Stats.Checkpoints); OnPrune each
// deletion by state, as many as Prune and PruneBytes return.
func TestHooksReportCommitsCheckpointsAndPrunes(t *testing.T) {
	var mu sync.Mutex
	var commits, checkpoints int
	var took []time.Duration
	pruned := map[driver.State]int{}
	opts := testOptions()
	opts.OnCommit = func(d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		commits++
		took = append(took, d)
	}
	opts.OnCheckpoint = func(time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		checkpoints++
	}
	opts.OnPrune = func(s driver.State, n int) {
		mu.Lock()
		defer mu.Unlock()
		pruned[s] += n
	}
	db, err := Open(filepath.Join(t.TempDir(), "sortie.db"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mustClose(t, db) })
	ctx := context.Background()
	for i := range 6 {
		finish(t, db, i) // three commits each
	}
	failed := newMission("failed")
	mustCreate(t, db, failed)
	failed = mustSave(t, db, failed, driver.StateRunning)
	mustSave(t, db, failed, driver.StateFailed)
	mustCreate(t, db, newMission("live"))
	mu.Lock()
	if commits != 6*3+4 {
		t.Errorf("OnCommit called %d times after 22 lone commits, want 22", commits)
	}
	for _, d := range took {
		if d <= 0 {
			t.Errorf("a commit took %v", d)
		}
	}
	mu.Unlock()

	n, err := db.Prune(ctx, t0.Add(3*time.Minute), 0) // 0, 1, 2 and the failed one
	if err != nil {
		t.Fatal(err)
	}
	m, err := db.PruneBytes(ctx, 0) // every finished one left
	if err != nil {
		t.Fatal(err)
	}
	s, err := db.Stats()
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := map[driver.State]int{driver.StateSucceeded: 6, driver.StateFailed: 1}; n != 4 || m != 3 ||
		len(pruned) != len(want) || pruned[driver.StateSucceeded] != 6 || pruned[driver.StateFailed] != 1 {
		t.Errorf("Prune %d, PruneBytes %d, OnPrune %v; want 4, 3, %v", n, m, pruned, want)
	}
	if uint64(commits) != s.Commits {
		t.Errorf("OnCommit called %d times, Stats.Commits %d", commits, s.Commits)
	}
	if checkpoints == 0 || uint64(checkpoints) != s.Checkpoints {
		t.Errorf("OnCheckpoint called %d times, Stats.Checkpoints %d", checkpoints, s.Checkpoints)
	}
}

// TestFileSizes: the store file's size and its log's, preallocated, as
// the file system has them.
func TestFileSizes(t *testing.T) {
	db := openTest(t)
	mustCreate(t, db, newMission("m"))
	file, log, err := db.FileSizes()
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(db.Path())
	if err != nil {
		t.Fatal(err)
	}
	li, err := os.Stat(wal.Path(db.Path()))
	if err != nil {
		t.Fatal(err)
	}
	if file != fi.Size() || log != li.Size() || log < wal.Prealloc {
		t.Errorf("FileSizes = %d, %d; the files are %d and %d bytes (the log at least %d)", file, log, fi.Size(), li.Size(), wal.Prealloc)
	}
}
