package store

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
)

// Archives are made against archive_dict.txt and name it by number:
// changing a byte of it makes every stored archive unreadable. A new
// dictionary is a new file and a new number, the old one kept.
func TestArchiveDictionaryIsPinned(t *testing.T) {
	sum := sha256.Sum256(archiveDict)
	const want = "06e6700b498ac0a09993a8c9d9ea1b3080b59651a3b647f03c5e9e23729862cc"
	if got := hex.EncodeToString(sum[:]); got != want {
		t.Fatalf("archive_dict.txt changed (sha256 %s, want %s): stored archives would not decode", got, want)
	}
}

// recordForm returns the form of a mission's record in bbolt and how many
// of its events are in the timeline bucket.
func recordForm(t *testing.T, db *DB, id string) (form byte, timeline int) {
	t.Helper()
	if err := db.checkpoint(); err != nil {
		t.Fatal(err)
	}
	_ = db.bolt.View(func(tx *bolt.Tx) error {
		form = tx.Bucket(bMissions).Get([]byte(id))[0]
		c := tx.Bucket(bTimeline).Cursor()
		p := timelinePrefix(id)
		for k, _ := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, _ = c.Next() {
			timeline++
		}
		return nil
	})
	return form, timeline
}

func TestFinishedMissionIsArchivedWithItsTimeline(t *testing.T) {
	db := openTest(t)
	m := newMission(mid(1))
	mustCreate(t, db, m)
	m = mustSave(t, db, m, driver.StateRunning)
	if form, n := recordForm(t, db, m.ID); form != formLive || n != 2 {
		t.Fatalf("live mission: form %#x with %d timeline entries, want live and 2", form, n)
	}
	m = mustSave(t, db, m, driver.StateFailed)
	if form, n := recordForm(t, db, m.ID); form != formArchive || n != 0 {
		t.Fatalf("failed mission: form %#x with %d timeline entries, want an archive and none", form, n)
	}
	sameJSON(t, mustGet(t, db, m.ID), m)
	tl, err := db.Timeline(t.Context(), m.ID)
	if err != nil || len(tl) != 3 || tl[2].To != driver.StateFailed {
		t.Fatalf("archived timeline = %+v, %v; want its 3 events", tl, err)
	}

	// An operator retry makes it live again: its events go back to the
	// timeline bucket, and the new ones follow them.
	m = mustSave(t, db, m, driver.StateRunning)
	if form, n := recordForm(t, db, m.ID); form != formLive || n != 4 {
		t.Fatalf("retried mission: form %#x with %d timeline entries, want live and 4", form, n)
	}
	m = mustSave(t, db, m, driver.StateSucceeded)
	// A note on a finished mission re-archives it with the new event.
	m = mustSave(t, db, m, driver.StateSucceeded)
	if form, n := recordForm(t, db, m.ID); form != formArchive || n != 0 {
		t.Fatalf("noted mission: form %#x with %d timeline entries, want an archive and none", form, n)
	}
	tl, err = db.Timeline(t.Context(), m.ID)
	if err != nil || len(tl) != 6 {
		t.Fatalf("timeline after retry and note = %d events, %v; want 6", len(tl), err)
	}
	for i, ev := range tl {
		if ev.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d: archives keep seq order", i, ev.Seq)
		}
	}
	sameJSON(t, mustGet(t, db, m.ID), m)
}

// A mission created and finished between two checkpoints is stored as
// its archive straight away, and counted once.
func TestMissionRunBetweenCheckpointsIsStoredArchived(t *testing.T) {
	db, _ := openPaused(t)
	m := newMission(mid(1))
	mustCreate(t, db, m)
	m = mustSave(t, db, m, driver.StateRunning)
	m = mustSave(t, db, m, driver.StateSucceeded)
	if form, n := recordForm(t, db, m.ID); form != formArchive || n != 0 {
		t.Fatalf("form %#x with %d timeline entries, want an archive and none", form, n)
	}
	sameJSON(t, mustGet(t, db, m.ID), m)
	counts, err := db.StateCounts(t.Context())
	if err != nil || len(counts) != 1 || counts[driver.StateSucceeded] != 1 {
		t.Fatalf("StateCounts = %v, %v; want 1 SUCCEEDED", counts, err)
	}
}
