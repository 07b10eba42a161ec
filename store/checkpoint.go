package store

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/store/internal/wal"
)

// Checkpoint pacing: a checkpoint waits up to Options.CheckpointDelay
// for checkpointBatch logged writes, so one bbolt transaction (two
// fsyncs) carries many of them; a read that needs bbolt checkpoints at
// once.
const (
	checkpointBatch = 512
	// checkpointRetry paces attempts after a failed checkpoint; the
	// writes stay safe in the log meanwhile.
	checkpointRetry = time.Second
	// checkpointYield is how many writes a checkpoint applies between
	// yields of its core.
	checkpointYield = 16
)

// overlay holds the writes that are logged but not yet in bbolt: the
// latest envelope of each mission they touched, the request keys they
// claimed, their outbox entries, and the writes themselves in LSN order
// for the checkpoint.
// Guarded by DB.ovMu.
type overlay struct {
	missions map[string]*pendingMission
	requests map[string]pendingRequest
	pend     []pendingWrite
	outbox   []pendingOutbox // in seq order, which is LSN order
	applied  uint64          // last LSN in bbolt
}

type pendingOutbox struct {
	seq, lsn uint64
	val      []byte
}

type pendingMission struct {
	env envelope // its body is the logged write's, never modified
	lsn uint64
}

type pendingRequest struct {
	id  string
	lsn uint64
}

type pendingWrite struct {
	lsn uint64
	w   *write
}

func (db *DB) appliedLSN() uint64 {
	db.ovMu.Lock()
	defer db.ovMu.Unlock()
	return db.ov.applied
}

// overlayEnvelope returns the mission's logged envelope when it is newer
// than bbolt's; its body is never modified, so it is read without the
// lock. A miss is safe to follow by a bbolt read: an entry leaves the
// overlay only after its checkpoint committed.
func (db *DB) overlayEnvelope(id string) (envelope, bool) {
	db.ovMu.Lock()
	defer db.ovMu.Unlock()
	if p := db.ov.missions[id]; p != nil {
		return p.env, true
	}
	return envelope{}, false
}

// overlayOwner is overlayEnvelope for a request key.
func (db *DB) overlayOwner(key string) string {
	db.ovMu.Lock()
	defer db.ovMu.Unlock()
	return db.ov.requests[key].id
}

// checkpoint applies every logged write not yet in bbolt in one
// transaction, recording the last LSN with them. Reads that scan bbolt
// (lists, timelines, counts) call it first, so they see every
// acknowledged write.
func (db *DB) checkpoint() error {
	left, err := db.checkpointLeft()
	if left > 0 {
		// Writes logged meanwhile found a batch waiting and woke no one;
		// the background checkpointer may be idle.
		db.kickCheckpoint(left)
	}
	return err
}

// checkpointLeft is checkpoint, also returning how many writes were
// logged meanwhile and wait for the next one.
func (db *DB) checkpointLeft() (int, error) {
	db.ckMu.Lock()
	defer db.ckMu.Unlock()
	db.ovMu.Lock()
	recs := db.ov.pend
	db.ovMu.Unlock()
	if len(recs) == 0 {
		return 0, nil
	}
	last := recs[len(recs)-1].lsn
	start := time.Now()
	err := db.bolt.Update(func(tx *bolt.Tx) error {
		return db.applyLogged(tx, recs, last)
	})
	if err != nil {
		return len(recs), fmt.Errorf("checkpoint: %w", err)
	}
	db.onCheckpoint(time.Since(start))
	db.ovMu.Lock()
	// Writes logged meanwhile were appended behind recs.
	db.ov.pend = append([]pendingWrite(nil), db.ov.pend[len(recs):]...)
	for _, r := range recs {
		if p := db.ov.missions[r.w.id]; p != nil && p.lsn <= last {
			delete(db.ov.missions, r.w.id)
		}
		if r.w.create && r.w.reqKey != "" {
			if p, ok := db.ov.requests[r.w.reqKey]; ok && p.lsn <= last {
				delete(db.ov.requests, r.w.reqKey)
			}
		}
	}
	i := 0
	for i < len(db.ov.outbox) && db.ov.outbox[i].lsn <= last {
		i++
	}
	db.ov.outbox = append([]pendingOutbox(nil), db.ov.outbox[i:]...)
	db.ov.applied = last
	left := len(db.ov.pend)
	db.ovMu.Unlock()
	db.checkpoints.Add(1)
	return left, nil
}

// applyLogged writes recs into bbolt and records last as applied.
func (db *DB) applyLogged(tx *bolt.Tx, recs []pendingWrite, last uint64) error {
	b := bucketsOf(tx)
	b.acked = db.ob.ackedTo.Load()
	c, err := readCounts(tx)
	if err != nil {
		db.log.Error("mission counts unreadable; counting again", "err", err)
		if c, err = recount(tx); err != nil {
			return err
		}
	}
	a := newApplier(b, &c)
	skip := func(id string, err error) {
		db.log.Error("logged write skipped", "mission", id, "err", err)
	}
	for i, r := range recs {
		if i%checkpointYield == checkpointYield-1 {
			// A checkpoint is bulk work on one of the gateway's few
			// cores: let waiting goroutines (a trigger, an ack) run.
			runtime.Gosched()
		}
		if err := a.add(r.w); err != nil {
			if !errors.Is(err, ErrCorrupt) {
				return err
			}
			skip(r.w.id, err)
		}
	}
	if err := a.flush(skip); err != nil {
		return err
	}
	if err := writeCounts(tx, &c); err != nil {
		return err
	}
	return tx.Bucket(bMeta).Put(kWALLSN, be64(last))
}

// kickCheckpoint tells the checkpointer that n writes are waiting.
func (db *DB) kickCheckpoint(n int) {
	select {
	case db.ckKick <- n:
	default:
	}
}

// checkpointer applies logged writes in the background: once writes
// are waiting it lets Options.CheckpointDelay pass, or checkpointBatch of them
// gather, whichever comes first. Commits wake it only for the first
// write of a batch and for a full one; writes that arrive during a
// checkpoint are left for the next round, which it starts itself.
func (db *DB) checkpointer() {
	defer close(db.ckDone)
	waiting := 0
	for {
		if waiting == 0 {
			select {
			case <-db.ckStop:
				return
			case waiting = <-db.ckKick:
			}
		}
		if waiting < checkpointBatch && !db.sleep(db.ckDelay, &waiting) {
			return
		}
		var err error
		waiting, err = db.checkpointLeft()
		noteWrite(&db.checkpointErr, err)
		if err != nil {
			db.log.Warn("checkpoint failed; the writes are safe in the log and will be applied later", "err", err)
			if !db.sleep(checkpointRetry, nil) {
				return
			}
		}
	}
}

// sleep waits d, or until a kick reports a full batch when waiting is
// set; it returns false when the store is closing.
func (db *DB) sleep(d time.Duration, waiting *int) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-db.ckStop:
			return false
		case <-t.C:
			return true
		case n := <-db.ckKick:
			if waiting != nil {
				if *waiting = n; n >= checkpointBatch {
					return true
				}
			}
		}
	}
}

// The meta keys of the log: the store's WAL ID, which its log's header
// carries, and the last LSN applied to bbolt.
var (
	kWALID  = []byte("wal_id")
	kWALLSN = []byte("wal_lsn")
)

// walMeta reads the store's WAL ID and last applied LSN; a file that has
// neither (new, or from before the log) reads as zero.
func walMeta(tx *bolt.Tx) (id, lsn uint64) {
	meta := tx.Bucket(bMeta)
	if meta == nil {
		return 0, 0
	}
	if v := meta.Get(kWALID); len(v) == 8 {
		id = binary.BigEndian.Uint64(v)
	}
	if v := meta.Get(kWALLSN); len(v) == 8 {
		lsn = binary.BigEndian.Uint64(v)
	}
	return id, lsn
}

// replayWAL applies the writes a crash left in the log, in one
// transaction, and returns the last LSN used. It runs after the
// migrations: log records are missions and events, whatever the layout,
// and a schema 1 build's records (without the state byte) still decode.
func (db *DB) replayWAL() (uint64, error) {
	var id, applied uint64
	newer := false
	_ = db.bolt.View(func(tx *bolt.Tx) error {
		id, applied = walMeta(tx)
		from, err := schemaOf(tx)
		newer = err != nil || from > Schema
		return nil
	})
	if newer {
		// A file this build cannot read (init says why) must not get
		// this build's replay of its log first.
		return applied, nil
	}
	path := wal.Path(db.path)
	recs, err := wal.ReadOn(db.logFS, path, id)
	if fe := (*wal.FormatError)(nil); errors.As(err, &fe) {
		return 0, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if err != nil {
		return 0, err
	}
	var todo []pendingWrite
	for _, r := range recs {
		if r.LSN <= applied {
			continue
		}
		if len(todo) == 0 && r.LSN != applied+1 {
			return 0, fmt.Errorf("%w: %s starts at LSN %d but the store applied only up to %d", ErrCorrupt, path, r.LSN, applied)
		}
		w, err := decodeWrite(r.Payload)
		if err != nil {
			return 0, fmt.Errorf("%s LSN %d: %w", path, r.LSN, err)
		}
		todo = append(todo, pendingWrite{lsn: r.LSN, w: w})
	}
	if len(todo) == 0 {
		return applied, nil
	}
	last := todo[len(todo)-1].lsn
	if err := db.bolt.Update(func(tx *bolt.Tx) error { return db.applyLogged(tx, todo, last) }); err != nil {
		return 0, fmt.Errorf("replay %s: %w", path, err)
	}
	db.log.Info("replayed write-ahead log", "writes", len(todo), "last_lsn", last)
	return last, nil
}

// ensureWALID gives the store an ID its log carries, so a log is never
// replayed into another file (a store restored from a backup, say).
func ensureWALID(tx *bolt.Tx) error {
	meta := tx.Bucket(bMeta)
	if v := meta.Get(kWALID); len(v) == 8 && binary.BigEndian.Uint64(v) != 0 {
		return nil
	}
	var b [8]byte
	for binary.BigEndian.Uint64(b[:]) == 0 {
		_, _ = rand.Read(b[:])
	}
	return meta.Put(kWALID, b[:])
}
