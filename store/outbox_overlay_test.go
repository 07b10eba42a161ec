package store

import (
	"encoding/binary"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
)

func seqsOf(es []OutboxEntry) []uint64 {
	out := make([]uint64, len(es))
	for i, e := range es {
		out[i] = e.Seq
	}
	return out
}

// TestOutboxFromOverlay: the hub sync reads entries still in the log
// without forcing a checkpoint, in seq order across what bbolt has and
// what it has not, each entry once, with the seqs a replay keeps.
func TestOutboxFromOverlay(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sortie.db")
	db := openOutboxAt(t, path, 0)
	pauseCheckpoints(t, db)

	a, b := newMission("a"), newMission("b")
	mustCreate(t, db, a)
	a = mustSave(t, db, a, driver.StateRunning)
	mustCreate(t, db, b)
	want := []string{"a/1", "a/2", "b/1"}

	got := readOutbox(t, db, 0)
	sameStrings(t, "all in the log", refs(got), want)
	sameLSNs(t, "seqs", seqsOf(got), []uint64{1, 2, 3})
	if lsn := walLSN(t, db); lsn != 0 {
		t.Errorf("reading the outbox checkpointed (wal_lsn %d)", lsn)
	}

	// Half in bbolt, half in the log.
	if err := db.checkpoint(); err != nil {
		t.Fatal(err)
	}
	mustSave(t, db, b, driver.StateRunning)
	a = mustSave(t, db, a, driver.StateStepRunning)
	want = append(want, "b/2", "a/3")
	got = readOutbox(t, db, 0)
	sameStrings(t, "bbolt then the log", refs(got), want)
	sameLSNs(t, "seqs", seqsOf(got), seqRange(1, 5))
	sameStrings(t, "after seq 2", refs(readOutbox(t, db, 2)), want[2:])

	// An entry a checkpoint has applied but not yet dropped from the
	// overlay is read once.
	applied := pendingOutbox{seq: 3, lsn: 3, val: mustOutboxVal(t, db, 3)}
	db.ovMu.Lock()
	db.ov.outbox = append([]pendingOutbox{applied}, db.ov.outbox...)
	db.ovMu.Unlock()
	sameLSNs(t, "with an applied entry still in the overlay", seqsOf(readOutbox(t, db, 0)), seqRange(1, 5))
	db.ovMu.Lock()
	db.ov.outbox = db.ov.outbox[1:]
	db.ovMu.Unlock()

	// A crash keeps the seqs the sync may already have sent.
	crash(t, db)
	db = openOutboxAt(t, path, 0)
	got = readOutbox(t, db, 0)
	sameStrings(t, "after replay", refs(got), want)
	sameLSNs(t, "seqs after replay", seqsOf(got), seqRange(1, 5))
	mustSave(t, db, a, driver.StateStepSucceeded)
	if es := readOutbox(t, db, 5); len(es) != 1 || es[0].Seq != 6 {
		t.Errorf("next entry after replay: %+v, want seq 6", es)
	}
}

// mustOutboxVal reads an applied entry's stored value from bbolt.
func mustOutboxVal(tb testing.TB, db *DB, seq uint64) []byte {
	tb.Helper()
	var v []byte
	if err := db.view(func(tx *bolt.Tx) error {
		v = append([]byte(nil), tx.Bucket(bOutbox).Get(be64(seq))...)
		return nil
	}); err != nil || v == nil {
		tb.Fatalf("outbox entry %d not in bbolt: %v", seq, err)
	}
	return v
}

// TestAckOutboxInLog: acknowledging entries still in the log needs no
// checkpoint; they are dropped from the overlay and never written to
// bbolt, and the count stays right. A crash before their checkpoint
// replays them, so they are sent again: at least once.
func TestAckOutboxInLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sortie.db")
	db := openOutboxAt(t, path, 0)
	pauseCheckpoints(t, db)
	a, b := newMission("a"), newMission("b")
	mustCreate(t, db, a)
	mustCreate(t, db, b)
	mustSave(t, db, a, driver.StateRunning) // seqs 1..3, all in the log

	n, err := db.AckOutbox(t.Context(), 2)
	if err != nil || n != 2 {
		t.Fatalf("AckOutbox(2) = %d, %v; want 2", n, err)
	}
	if lsn := walLSN(t, db); lsn != 0 {
		t.Errorf("the ack checkpointed (wal_lsn %d)", lsn)
	}
	if got := db.OutboxLen(); got != 1 {
		t.Errorf("OutboxLen = %d, want 1", got)
	}
	sameLSNs(t, "after the ack", seqsOf(readOutbox(t, db, 0)), []uint64{3})
	if err := db.checkpoint(); err != nil {
		t.Fatal(err)
	}
	inBoltOutbox := func() []uint64 {
		var seqs []uint64
		if err := db.view(func(tx *bolt.Tx) error {
			return tx.Bucket(bOutbox).ForEach(func(k, _ []byte) error {
				seqs = append(seqs, binary.BigEndian.Uint64(k))
				return nil
			})
		}); err != nil {
			t.Fatal(err)
		}
		return seqs
	}
	sameLSNs(t, "bbolt after the checkpoint", inBoltOutbox(), []uint64{3})
	if n, err := db.AckOutbox(t.Context(), 3); err != nil || n != 1 || db.OutboxLen() != 0 {
		t.Errorf("AckOutbox(3) = %d, %v, OutboxLen %d; want 1, nil, 0", n, err, db.OutboxLen())
	}
	sameLSNs(t, "bbolt after acking all", inBoltOutbox(), nil)

	// Acked while in the log, then a crash: replayed and due again.
	mustSave(t, db, b, driver.StateRunning) // seq 4
	if n, err := db.AckOutbox(t.Context(), 4); err != nil || n != 1 {
		t.Fatalf("AckOutbox(4) = %d, %v", n, err)
	}
	crash(t, db)
	db = openOutboxAt(t, path, 0)
	sameLSNs(t, "after the crash", seqsOf(readOutbox(t, db, 0)), []uint64{4})
}
