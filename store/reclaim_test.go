package store

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
)

// finishMission stores one mission through its life: created, running,
// then succeeded, each a commit of its own, as the driver makes them.
func finishMission(tb testing.TB, db *DB, i int) *driver.Mission {
	tb.Helper()
	m := newMission(fmt.Sprintf("%012x%012x", i, i))
	m.Meta.RequestKey = fmt.Sprintf("req-%d", i)
	m.Meta.Created = t0.Add(time.Duration(i) * time.Second)
	mustCreate(tb, db, m)
	m = mustSave(tb, db, m, driver.StateRunning)
	m.Meta.Finished = m.Meta.Created.Add(time.Second)
	return mustSave(tb, db, m, driver.StateSucceeded)
}

func fileBytes(tb testing.TB, path string) int64 {
	tb.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		tb.Fatal(err)
	}
	return fi.Size()
}

// TestDiskStaysFlatUnderRetention: with retention keeping the newest
// 1,000 finished missions, the file stops growing once retention is in
// steady state; bbolt's reuse of the pages deletions free is enough.
func TestDiskStaysFlatUnderRetention(t *testing.T) {
	const keep, total = 1000, 8000
	db := openUnsynced(t, filepath.Join(t.TempDir(), "sortie.db"))
	var steady int64
	for i := 1; i <= total; i++ {
		finishMission(t, db, i)
		if i%250 == 0 {
			if _, err := db.Prune(t.Context(), t0.Add(time.Duration(total+10)*time.Second), keep); err != nil {
				t.Fatal(err)
			}
			if err := db.checkpoint(); err != nil {
				t.Fatal(err)
			}
			if i == 3*keep {
				steady = fileBytes(t, db.path)
			}
		}
	}
	end := fileBytes(t, db.path)
	st, err := db.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("file %d B after %d missions (steady state from %d B at %d); %d B per kept mission, %d B free", end, total, steady, 3*keep, end/keep, st.FreeBytes)
	if st.Missions != keep {
		t.Errorf("%d missions stored, want %d", st.Missions, keep)
	}
	if end > steady {
		t.Errorf("the file grew from %d to %d bytes in steady state", steady, end)
	}
}

// TestReclaimGivesSpaceBackWhileOpen: after retention deletes most
// missions, Reclaim shrinks the file while the store stays open; what
// was stored, including writes still in the log, reads back the same,
// and writes go on, before and after a reopen.
func TestReclaimGivesSpaceBackWhileOpen(t *testing.T) {
	path := t.TempDir() + "/sortie.db"
	db := openUnsynced(t, path)
	for i := 1; i <= 3000; i++ {
		finishMission(t, db, i)
	}
	if _, err := db.Prune(t.Context(), t0.Add(time.Hour*24), 100); err != nil {
		t.Fatal(err)
	}
	kept := finishMission(t, db, 3001) // in the log only
	live := newMission(mid(9))
	mustCreate(t, db, live)
	if err := db.checkpoint(); err != nil { // the two above are in the file now
		t.Fatal(err)
	}
	st, err := db.Stats()
	if err != nil {
		t.Fatal(err)
	}
	pauseCheckpoints(t, db)
	live = mustSave(t, db, live, driver.StateRunning) // stays in the log
	before, after, err := db.Reclaim(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("file %d -> %d bytes (%d free before)", before, after, st.FreeBytes)
	if after >= before/2 || after != fileBytes(t, path) {
		t.Errorf("Reclaim: %d -> %d bytes (file %d), want less than half", before, after, fileBytes(t, path))
	}
	sameJSON(t, mustGet(t, db, kept.ID), kept)
	sameJSON(t, mustGet(t, db, live.ID), live)
	if m, err := db.Lookup(t.Context(), "req-3001"); err != nil || m.ID != kept.ID {
		t.Errorf("Lookup after Reclaim = %v, %v", m, err)
	}
	live = mustSave(t, db, live, driver.StateSucceeded)
	if err := db.checkpoint(); err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, db)
	counts, err := db.StateCounts(t.Context())
	if err != nil || counts[driver.StateSucceeded] != 102 || len(counts) != 1 {
		t.Errorf("counts after Reclaim = %v, %v; want 102 SUCCEEDED", counts, err)
	}
	mustClose(t, db)
	db = openUnsynced(t, path)
	sameJSON(t, mustGet(t, db, live.ID), live)
	tl, err := db.Timeline(t.Context(), live.ID)
	if err != nil || len(tl) != 3 {
		t.Errorf("timeline after reopen = %d events, %v; want 3", len(tl), err)
	}
	finishMission(t, db, 4000)
}

// TestReclaimWhileWriting: commits and reads running while Reclaim
// swaps the file all complete, and everything they wrote is there.
func TestReclaimWhileWriting(t *testing.T) {
	db := openTest(t)
	for i := 1; i <= 500; i++ {
		finishMission(t, db, i)
	}
	if _, err := db.Prune(t.Context(), t0.Add(time.Hour*24), 10); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	var mu sync.Mutex
	var written []*driver.Mission
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				m := finishMission(t, db, 10000*(w+1)+i)
				mu.Lock()
				written = append(written, m)
				mu.Unlock()
				if _, _, err := db.List(context.Background(), driver.Filter{Limit: 5}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	for range 3 {
		if _, _, err := db.Reclaim(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	wg.Wait()
	for _, m := range written {
		sameJSON(t, mustGet(t, db, m.ID), m)
	}
	t.Logf("%d missions written during 3 reclaims", len(written))
}

// TestPruneBytesKeepsTheNewestWithinBudget: the oldest finished missions
// go until the data fits; live ones stay whatever the budget.
func TestPruneBytesKeepsTheNewestWithinBudget(t *testing.T) {
	db := openUnsynced(t, filepath.Join(t.TempDir(), "sortie.db"))
	for i := 1; i <= 2000; i++ {
		finishMission(t, db, i)
	}
	live := newMission(mid(1))
	mustCreate(t, db, live)
	used, err := db.usedBytes()
	if err != nil {
		t.Fatal(err)
	}
	budget := used / 2
	n, err := db.PruneBytes(t.Context(), budget)
	if err != nil {
		t.Fatal(err)
	}
	if now, _ := db.usedBytes(); now > budget || n == 0 || n == 2000 {
		t.Fatalf("PruneBytes(%d) deleted %d, data now %d bytes", budget, n, now)
	}
	// The newest finished are the ones kept.
	if _, err := db.Get(t.Context(), fmt.Sprintf("%012x%012x", 2000, 2000)); err != nil {
		t.Errorf("the newest mission was deleted: %v", err)
	}
	if _, err := db.Get(t.Context(), fmt.Sprintf("%012x%012x", 1, 1)); err == nil {
		t.Error("the oldest mission was kept")
	}
	if _, err := db.PruneBytes(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	st, _ := db.Stats()
	if st.Missions != 1 || st.Active != 1 {
		t.Errorf("after a budget of one byte: %+v; want the live mission alone", st)
	}
	mustGet(t, db, live.ID)
}

// BenchmarkRetentionSoak runs 100,000 missions through the store (each
// created, running, succeeded: three commits, 16 at a time) with
// retention keeping the newest 1,000, applied every 500 missions as the
// agent's retention would, and reports the file's size at 10,000, 50,000
// and 100,000 missions: flat once retention is in steady state.
func BenchmarkRetentionSoak(b *testing.B) {
	const total, keep = 100000, 1000
	for range b.N {
		path := b.TempDir() + "/sortie.db"
		db, err := Open(path, Options{Logger: testOptions().Logger})
		if err != nil {
			b.Fatal(err)
		}
		sizes := map[int]int64{}
		var peak int64
		next := make(chan int)
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for i := range next {
					finishMission(b, db, i)
				}
			})
		}
		for i := 1; i <= total; i++ {
			next <- i
			if i%500 == 0 {
				if _, err := db.Prune(context.Background(), t0.Add(time.Duration(total+10)*time.Second), keep); err != nil {
					b.Fatal(err)
				}
				size := fileBytes(b, path)
				peak = max(peak, size)
				if i == 10000 || i == 50000 || i == total {
					sizes[i] = size
				}
			}
		}
		close(next)
		wg.Wait()
		if err := db.Close(); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(sizes[10000])/(1<<20), "MiB@10k")
		b.ReportMetric(float64(sizes[50000])/(1<<20), "MiB@50k")
		b.ReportMetric(float64(sizes[total])/(1<<20), "MiB@100k")
		b.ReportMetric(float64(peak)/(1<<20), "MiB-peak")
	}
	b.ReportMetric(0, "ns/op")
}
