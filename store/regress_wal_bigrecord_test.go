package store

import (
	"errors"
	"strings"
	"testing"

	"github.com/sortie-edge/sortie/driver"
)

// TestReviewOversizedRecordReplayed: append accepts a payload larger
// than walMaxRecord and acknowledges it, but parseRecords stops at any
// frame longer than walMaxRecord, so after a crash before the next
// commit (whose makeRoom would checkpoint it, the log being past
// walLimit) the acknowledged write is lost.
func TestReviewOversizedRecordReplayed(t *testing.T) {
	if testing.Short() {
		t.Skip("writes a 64 MiB record")
	}
	db, path := openPaused(t)
	big := newMission(mid(1))
	big.Meta.Labels["blob"] = strings.Repeat("x", walMaxRecord)
	_, created, err := db.Create(t.Context(), big, []driver.Event{event(big, 1, driver.StatePending)})
	if errors.Is(err, driver.ErrInvalid) {
		return // refused up front: nothing acknowledged, nothing to lose
	}
	if err != nil || !created {
		t.Fatalf("Create = created %v, %v", created, err)
	}
	big = nil
	crash(t, db)

	db = openAt(t, path)
	if _, found := inBolt(t, db, mid(1)); !found {
		t.Errorf("acknowledged create of %s lost after a crash", mid(1))
	}
}
