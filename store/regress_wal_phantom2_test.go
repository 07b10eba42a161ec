package store

import (
	"os"
	"testing"

	"github.com/sortie-edge/sortie/driver"
)

// TestReviewFailedBatchPhantomVersion: the request key's owner x is
// acknowledged, but the same batch also carries a save of x, so the
// duplicate Create's existing is x's staged (unlogged) version. The
// key is not in the batch's stage, so inBatch stays false, and when the
// append fails the duplicate Create still reports success with a
// version of x that was never stored.
func TestReviewFailedBatchPhantomVersion(t *testing.T) {
	db := openTest(t)
	x := newMission(mid(1))
	x.Meta.RequestKey = "req-1"
	mustCreate(t, db, x) // acknowledged, version 1

	x2, xev := advance(x, driver.StateRunning)
	ws, err := newWrite(false, x2, xev)
	if err != nil {
		t.Fatal(err)
	}
	y := newMission(mid(2))
	y.Meta.RequestKey = "req-1"
	wy, err := newWrite(true, y, []driver.Event{event(y, 1, driver.StatePending)})
	if err != nil {
		t.Fatal(err)
	}

	db.wmu.Lock()
	good := db.wal.f
	bad, err := os.Open(db.wal.path) // read-only: the append fails
	if err != nil {
		db.wmu.Unlock()
		t.Fatal(err)
	}
	db.wal.f = bad
	db.wmu.Unlock()
	db.commitBatch([]*write{ws, wy}) // one leader's batch
	db.wmu.Lock()
	db.wal.f = good
	db.wmu.Unlock()
	bad.Close()

	if ws.err == nil {
		t.Fatal("test premise: the batch's append did not fail")
	}
	stored := mustGet(t, db, x.ID)
	if wy.err == nil && wy.existing != nil {
		m, err := decodeMission(wy.existing)
		if err != nil {
			t.Fatal(err)
		}
		if m.Version != stored.Version {
			t.Errorf("Create(%s) reports created=false, err=nil with %s at version %d (state %s), a save that failed; the store holds version %d", y.ID, m.ID, m.Version, m.State, stored.Version)
		}
	}
}
