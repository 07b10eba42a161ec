package store

import (
	"os"
	"testing"

	"github.com/sortie-edge/sortie/driver"
)

// TestReviewFailedBatchPhantomExisting: two Creates with the same
// request key in one batch. The second's check finds the key owned by
// the first, staged in the same batch, and records it as existing. When
// the batch's append then fails, the first is told it failed, but the
// second keeps existing and no error, so its Create reports success
// (created=false) with a mission that was never stored.
func TestReviewFailedBatchPhantomExisting(t *testing.T) {
	db := openTest(t)
	x, y := newMission(mid(1)), newMission(mid(2))
	x.Meta.RequestKey, y.Meta.RequestKey = "req-1", "req-1"
	wx, err := newWrite(true, x, []driver.Event{event(x, 1, driver.StatePending)})
	if err != nil {
		t.Fatal(err)
	}
	wy, err := newWrite(true, y, []driver.Event{event(y, 1, driver.StatePending)})
	if err != nil {
		t.Fatal(err)
	}

	// The log's next write fails (read-only descriptor).
	db.wmu.Lock()
	good := db.wal.f
	bad, err := os.Open(db.wal.path)
	if err != nil {
		db.wmu.Unlock()
		t.Fatal(err)
	}
	db.wal.f = bad
	db.wmu.Unlock()
	db.commitBatch([]*write{wx, wy}) // what one leader does with both queued
	db.wmu.Lock()
	db.wal.f = good
	db.wmu.Unlock()
	bad.Close()

	if wx.err == nil {
		t.Fatal("test premise: the batch's append did not fail")
	}
	if wy.err == nil && wy.existing != nil {
		m, _ := decodeMission(wy.existing)
		t.Errorf("Create(%s) would return created=false, err=nil and existing mission %s, but that mission's create failed (%v)", y.ID, m.ID, wx.err)
	}
	if _, err := db.Lookup(t.Context(), "req-1"); err == nil {
		t.Log("request key found")
	} else {
		t.Logf("Lookup(req-1) after the batch: %v", err)
	}
}
