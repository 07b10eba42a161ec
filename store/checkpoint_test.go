package store

import (
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
)

// caughtUp says whether every logged write is in bbolt.
func (db *DB) caughtUp() bool {
	db.wmu.Lock()
	last := logOf(db).LSN()
	db.wmu.Unlock()
	return db.appliedLSN() == last
}

// inBolt reads a mission's version straight from bbolt, bypassing the
// overlay and without checkpointing.
func inBolt(tb testing.TB, db *DB, id string) (version uint64, found bool) {
	tb.Helper()
	err := db.view(func(tx *bolt.Tx) error {
		rec := tx.Bucket(bMissions).Get([]byte(id))
		if rec == nil {
			return nil
		}
		h, err := parseEnvelope(rec)
		version, found = h.version, true
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	return version, found
}

// TestCheckpointInBackground: writes reach bbolt with no read to force
// them, and the overlay empties.
func TestCheckpointInBackground(t *testing.T) {
	db := openTest(t)
	m := newMission(mid(1))
	mustCreate(t, db, m)
	m = mustSave(t, db, m, driver.StateRunning)
	waitUntil(t, "the background checkpoint applied the log", db.caughtUp)
	if v, ok := inBolt(t, db, m.ID); !ok || v != m.Version {
		t.Errorf("bbolt has version %d (found %v), want %d", v, ok, m.Version)
	}
	db.ovMu.Lock()
	left := len(db.ov.missions) + len(db.ov.requests) + len(db.ov.pend)
	db.ovMu.Unlock()
	if left != 0 {
		t.Errorf("overlay keeps %d entries after the checkpoint", left)
	}
}

// TestCheckpointCatchesUpUnderLoad: commits wake the checkpointer only
// for a batch's first write, so writes logged during a checkpoint must
// be picked up by the checkpointer itself. Under a steady stream some
// always are; once the stream stops, bbolt must catch up without help.
func TestCheckpointCatchesUpUnderLoad(t *testing.T) {
	db := openTest(t)
	const writers, saves = 4, 150
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			m := newMission(mid(w))
			if _, _, err := db.Create(t.Context(), m, []driver.Event{event(m, 1, driver.StatePending)}); err != nil {
				t.Error(err)
				return
			}
			for i := range saves {
				n, evs := advance(m, []driver.State{driver.StateRunning, driver.StateStepRunning}[i%2])
				if err := db.Save(t.Context(), n, evs); err != nil {
					t.Error(err)
					return
				}
				m = n
			}
		})
	}
	wg.Wait()
	waitUntil(t, "the checkpoints caught up with the log", db.caughtUp)
	for w := range writers {
		if v, _ := inBolt(t, db, mid(w)); v != 1+saves {
			t.Errorf("%s: bbolt has version %d, want %d", mid(w), v, 1+saves)
		}
	}
}

// TestScanSeesLoggedWrites: reads that walk bbolt checkpoint first, so
// a write acknowledged a moment ago is in a list, its timeline and the
// counts even while the background checkpoint has not run.
func TestScanSeesLoggedWrites(t *testing.T) {
	db := openTest(t)
	var ms []*driver.Mission
	for i := range 3 {
		m := newMission(mid(i))
		mustCreate(t, db, m)
		ms = append(ms, mustSave(t, db, m, driver.StateRunning))
	}
	list, _, err := db.List(t.Context(), driver.Filter{})
	if err != nil || len(list) != 3 {
		t.Fatalf("List = %d missions, %v; want 3", len(list), err)
	}
	for i, m := range ms {
		sameJSON(t, list[2-i], m) // newest first
		evs, err := db.Timeline(t.Context(), m.ID)
		if err != nil || len(evs) != 2 {
			t.Errorf("Timeline(%s) = %d events, %v; want 2", m.ID, len(evs), err)
		}
	}
	st, err := db.Stats()
	if err != nil || st.Missions != 3 || st.Events != 6 {
		t.Errorf("Stats = %+v, %v; want 3 missions, 6 events", st, err)
	}
	if !db.caughtUp() {
		t.Error("a scan left logged writes out of bbolt")
	}
}
