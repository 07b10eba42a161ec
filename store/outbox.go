package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
)

// The outbox is a transactional outbox: with Options.Outbox set, every
// event a Create or Save commits is also written, in the same log record
// (and so, when a checkpoint applies it, the same bbolt transaction), to
// the outbox bucket:
//
//	outbox  outbox seq (big-endian; the bucket's sequence is the last used) →
//	        {"event": driver.Event, "mission": driver.Summary, "compacted": bool}
//
// The hub sync reads it in seq order and deletes what the hub has
// acknowledged, so an event is forwarded if and only if it was committed,
// across crashes and restarts, without a second source of truth.
//
// Bound: when more than OutboxMax entries wait, a compaction in the
// background keeps only the latest entry of each mission, marking it
// Compacted, and drops the others. It never drops a mission's latest
// entry, so the backlog can stay above OutboxMax while more missions than
// that have unacknowledged entries; the next compaction then waits until
// the backlog has grown by another quarter of OutboxMax.

// DefaultOutboxMax is the outbox bound when Options.OutboxMax is zero.
const DefaultOutboxMax = 10000

// Outbox page sizes and transaction sizes.
const (
	// MaxOutboxLimit caps the limit of one Outbox call.
	MaxOutboxLimit = 4096
	// outboxChunk bounds the entries one ack or compaction transaction
	// deletes, so neither holds the writer lock against commits for long.
	outboxChunk = 512
)

// OutboxEntry is one outbox entry: a committed event and the mission's
// summary after the write that carried it. Its fields and JSON match
// uplink.Entry, so the one converts to the other.
type OutboxEntry struct {
	// Seq is the outbox sequence: increasing across missions, never reused.
	Seq     uint64         `json:"seq"`
	Event   driver.Event   `json:"event"`
	Mission driver.Summary `json:"mission"`
	// Compacted means earlier entries of this mission were dropped when
	// the outbox overflowed.
	Compacted bool `json:"compacted,omitempty"`
}

// OutboxStats is a snapshot of the outbox, for metrics.
type OutboxStats struct {
	Len int // entries waiting for an ack
	// Acked counts entries AckOutbox deleted since Open.
	Acked uint64
	// Compacted counts entries compaction dropped since Open, and
	// Compactions the compaction passes that dropped any.
	Compacted   uint64
	Compactions uint64
}

// outbox is the DB's outbox state. n mirrors the bucket's key count: every
// change to the bucket goes through this file or commitBatch, which
// adjust it after their transaction commits.
type outbox struct {
	enabled bool
	max     int // <0: unbounded

	n           atomic.Int64
	acked       atomic.Uint64
	compacted   atomic.Uint64
	compactions atomic.Uint64
	// ackedTo is the highest seq acknowledged since Open; entries up to it
	// that are still in the log are never written to bbolt.
	ackedTo   atomic.Uint64
	threshold atomic.Int64 // a commit that takes n above it starts a compaction
	running   atomic.Bool  // a background compaction is under way
	bg        sync.WaitGroup
}

func (db *DB) openOutbox(opts Options) {
	db.ob.enabled, db.ob.max = opts.Outbox, opts.OutboxMax
	_ = db.bolt.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bOutbox)
		db.ob.n.Store(int64(b.Stats().KeyN))
		db.obSeq = b.Sequence()
		id, _ := walMeta(tx)
		db.outboxID = fmt.Sprintf("%016x", id)
		return nil
	})
	db.ob.threshold.Store(int64(db.ob.max))
	db.maybeCompact()
}

// encodeOutbox prepares w's outbox values outside the commit, so the
// shared transaction only puts bytes. The event JSON is the timeline's.
func (w *write) encodeOutbox(m *driver.Mission) error {
	// The step table goes with the mission's first write and with its
	// end, not with every event: a hub keeps it (docs/protocol.md,
	// "The step table"), and it is most of a summary's bytes.
	sum, err := json.Marshal(m.Summarize(w.create || m.State.Terminal()))
	if err != nil {
		return fmt.Errorf("encode summary of mission %q: %w", m.ID, err)
	}
	w.outbox = make([][]byte, len(w.events))
	for i, ev := range w.events {
		v := make([]byte, 0, len(ev.data)+len(sum)+24)
		v = append(v, `{"event":`...)
		v = append(v, ev.data...)
		v = append(v, `,"mission":`...)
		v = append(v, sum...)
		w.outbox[i] = append(v, '}')
	}
	return nil
}

// putOutbox appends w's outbox entries; it runs inside the commit, after
// w's checks passed, so a refused write leaves no entry.
func (w *write) putOutbox(b *txBuckets) error {
	if len(w.outbox) == 0 {
		return nil
	}
	if w.obFirst == 0 { // not assigned by a leader: take the next seqs
		w.obFirst = b.outbox.Sequence() + 1
	}
	for i, v := range w.outbox {
		if seq := w.obFirst + uint64(i); seq > b.acked {
			if err := b.outbox.Put(be64(seq), v); err != nil {
				return err
			}
		}
	}
	if last := w.obFirst + uint64(len(w.outbox)) - 1; b.outbox.Sequence() < last {
		return b.outbox.SetSequence(last)
	}
	return nil
}

// assignOutboxSeqs gives the outbox entries of writes about to be logged
// their seqs, from the bucket's sequence as the log has advanced it, so
// that the hub sync can read them from the overlay before a checkpoint.
// db.wmu is held.
func (db *DB) assignOutboxSeqs(ws []*write) {
	for _, w := range ws {
		if len(w.outbox) > 0 {
			w.obFirst = db.obSeq + 1
			db.obSeq += uint64(len(w.outbox))
		}
	}
}

// outboxAdded counts the entries a committed batch wrote and starts a
// compaction if they took the outbox past its bound.
func (db *DB) outboxAdded(batch []*write) {
	n := 0
	for _, w := range batch {
		n += len(w.outbox)
	}
	if n > 0 {
		db.ob.n.Add(int64(n))
		db.maybeCompact()
	}
}

// maybeCompact starts a background compaction when the outbox is past
// its threshold and none is running. The caller holds an enter (or is
// Open), so Close waits for the Add below before it waits for bg.
func (db *DB) maybeCompact() {
	if db.ob.max < 0 || db.ob.n.Load() <= db.ob.threshold.Load() || !db.ob.running.CompareAndSwap(false, true) {
		return
	}
	db.ob.bg.Add(1)
	go func() {
		defer db.ob.bg.Done()
		defer db.ob.running.Store(false)
		dropped, err := db.CompactOutbox(context.Background())
		if err != nil {
			db.log.Warn("outbox compaction stopped", "dropped", dropped, "err", err)
			return
		}
		db.log.Info("outbox compacted", "dropped", dropped, "kept", db.ob.n.Load())
	}()
}

// OutboxID names this store's outbox, whose seqs no other outbox shares:
// a new store, or one restored from a backup (NewIdentity), has another
// name. The hub keeps its cursor per name, so a gateway whose store was
// replaced starts a new chain rather than having acks of the old one
// delete its entries.
func (db *DB) OutboxID() string { return db.outboxID }

// OutboxLen returns the number of outbox entries waiting for an ack.
func (db *DB) OutboxLen() int { return int(db.ob.n.Load()) }

// OutboxStats returns the outbox counters.
func (db *DB) OutboxStats() OutboxStats {
	return OutboxStats{
		Len: db.OutboxLen(), Acked: db.ob.acked.Load(),
		Compacted: db.ob.compacted.Load(), Compactions: db.ob.compactions.Load(),
	}
}

// Outbox returns up to limit entries with seq greater than after, in seq
// order. limit is capped at MaxOutboxLimit; zero or negative means that
// cap. It reads whatever the bucket holds, so entries written while the
// outbox was enabled stay readable after it is turned off.
func (db *DB) Outbox(ctx context.Context, after uint64, limit int) ([]OutboxEntry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if limit <= 0 || limit > MaxOutboxLimit {
		limit = MaxOutboxLimit
	}
	if after == ^uint64(0) {
		return nil, nil // no seq is greater, and after+1 would wrap
	}
	type rec struct {
		seq uint64
		val []byte
	}
	if err := db.enter(); err != nil {
		return nil, fmt.Errorf("read outbox: %w", err)
	}
	defer db.leave()
	// Entries still in the log are read from the overlay, so the hub sync
	// does not force a checkpoint per batch. The bbolt snapshot begins
	// under ovMu: an entry a checkpoint has applied but not yet dropped
	// from the overlay is in both, and is taken once.
	db.ovMu.Lock()
	var pend []pendingOutbox
	for _, p := range db.ov.outbox {
		if p.seq > after {
			pend = append(pend, p)
		}
	}
	tx, err := db.bolt.Begin(false)
	db.ovMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("read outbox: %w", err)
	}
	// A read-only transaction: rolling back only releases it.
	defer func() { _ = tx.Rollback() }()
	var recs []rec
	c := tx.Bucket(bOutbox).Cursor()
	for k, v := c.Seek(be64(after + 1)); k != nil && len(recs) < limit; k, v = c.Next() {
		if len(k) != 8 {
			return nil, fmt.Errorf("read outbox: %w: outbox key %x", ErrCorrupt, k)
		}
		recs = append(recs, rec{binary.BigEndian.Uint64(k), bytes.Clone(v)})
	}
	last := after
	if len(recs) > 0 {
		last = recs[len(recs)-1].seq
	}
	for _, p := range pend {
		if len(recs) == limit {
			break
		}
		if p.seq > last {
			recs = append(recs, rec{p.seq, p.val})
		}
	}
	out := make([]OutboxEntry, len(recs))
	for i, r := range recs {
		if err := json.Unmarshal(r.val, &out[i]); err != nil {
			return nil, fmt.Errorf("read outbox: %w: entry %d: %w", ErrCorrupt, r.seq, err)
		}
		out[i].Seq = r.seq
	}
	return out, nil
}

// AckOutbox deletes every outbox entry with seq up to and including upto,
// in transactions of a bounded size so that commits are never held up
// for long, and returns how many it deleted (including those deleted
// before an error). Acknowledging again is harmless.
func (db *DB) AckOutbox(ctx context.Context, upto uint64) (int, error) {
	if err := db.enter(); err != nil {
		return 0, err
	}
	defer db.leave()
	// No checkpoint runs meanwhile, so bbolt holds exactly the applied
	// entries and the overlay exactly the others. Those are dropped here
	// and, being marked acknowledged, never written by a checkpoint; a
	// crash before their checkpoint replays them, and they are sent again.
	db.ckMu.Lock()
	defer db.ckMu.Unlock()
	if upto > db.ob.ackedTo.Load() {
		db.ob.ackedTo.Store(upto)
	}
	db.ovMu.Lock()
	i := 0
	for i < len(db.ov.outbox) && db.ov.outbox[i].seq <= upto {
		i++
	}
	db.ov.outbox = append([]pendingOutbox(nil), db.ov.outbox[i:]...)
	db.ovMu.Unlock()
	db.ob.n.Add(-int64(i))
	db.ob.acked.Add(uint64(i))
	deleted := i
	for {
		if err := ctx.Err(); err != nil {
			return deleted, err
		}
		n, err := db.ackOnce(upto)
		deleted += n
		if err != nil {
			return deleted, fmt.Errorf("ack outbox up to %d: %w", upto, err)
		}
		if n < outboxChunk {
			return deleted, nil
		}
	}
}

func (db *DB) ackOnce(upto uint64) (int, error) {
	var keys [][]byte
	err := db.bolt.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bOutbox)
		c := b.Cursor()
		for k, _ := c.First(); k != nil && len(keys) < outboxChunk; k, _ = c.Next() {
			if len(k) == 8 && binary.BigEndian.Uint64(k) > upto {
				break
			}
			keys = append(keys, bytes.Clone(k))
		}
		for _, k := range keys {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	db.ob.n.Add(-int64(len(keys)))
	db.ob.acked.Add(uint64(len(keys)))
	return len(keys), nil
}

// update runs fn in its own write transaction, unless the DB is closed.
// The outbox's maintenance uses it rather than the group commit: its
// transactions are few, and none of them may fail a mission's save.
func (db *DB) update(fn func(tx *bolt.Tx) error) error {
	if err := db.enter(); err != nil {
		return err
	}
	defer db.leave()
	return db.bolt.Update(fn)
}

// CompactOutbox keeps only the latest outbox entry of each mission, marks
// it Compacted where earlier ones are dropped, and returns how many it
// dropped. It reads the outbox once, then works mission by mission in
// small transactions: each kept entry is marked in the transaction that
// drops its mission's first victims, so a reader never sees a gap
// without the mark. Entries committed meanwhile are left alone, and
// entries acknowledged meanwhile are not counted. Commits start it on
// their own when the outbox passes Options.OutboxMax; calling it directly
// is for tests and tools.
func (db *DB) CompactOutbox(ctx context.Context) (int, error) {
	plan, err := db.compactionPlan(ctx)
	if err != nil {
		return 0, fmt.Errorf("compact outbox: %w", err)
	}
	dropped := 0
	for len(plan) > 0 {
		if err := ctx.Err(); err != nil {
			return dropped, err
		}
		n, rest, err := db.compactOnce(plan)
		dropped += n
		if err != nil {
			return dropped, fmt.Errorf("compact outbox: %w", err)
		}
		plan = rest
	}
	if dropped > 0 {
		db.ob.compactions.Add(1)
	}
	// Hysteresis: with more live missions than the bound, compacting again
	// at the next commit would reread the outbox for nothing.
	if db.ob.max >= 0 {
		db.ob.threshold.Store(max(int64(db.ob.max), db.ob.n.Load()+int64(db.ob.max/4)))
	}
	return dropped, nil
}

// missionPlan is what compaction does to one mission's entries: drop
// victims (in seq order) and mark keep, its latest entry.
type missionPlan struct {
	keep    []byte
	marked  bool
	victims [][]byte
}

// compactionPlan reads the outbox and lists, for each mission with more
// than one entry, its latest entry and the others, in the order of their
// latest entries.
func (db *DB) compactionPlan(ctx context.Context) ([]*missionPlan, error) {
	byMission := map[string]*missionPlan{}
	var order []*missionPlan
	err := db.scan(func(tx *bolt.Tx) error {
		c := tx.Bucket(bOutbox).Cursor()
		n := 0
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if n++; n%1024 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			var head struct {
				Event struct {
					MissionID string `json:"mission_id"`
				} `json:"event"`
			}
			if err := json.Unmarshal(v, &head); err != nil {
				// An unreadable entry cannot be attributed; leave it for
				// Outbox to report rather than drop it silently.
				continue
			}
			p := byMission[head.Event.MissionID]
			if p == nil {
				p = &missionPlan{}
				byMission[head.Event.MissionID] = p
				order = append(order, p)
			}
			if p.keep != nil {
				p.victims = append(p.victims, p.keep)
			}
			p.keep = bytes.Clone(k)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	plan := order[:0]
	for _, p := range order {
		if len(p.victims) > 0 {
			plan = append(plan, p)
		}
	}
	return plan, nil
}

// compactOnce carries out plan in one transaction of about outboxChunk
// deletes and returns what it dropped and what remains.
func (db *DB) compactOnce(plan []*missionPlan) (dropped int, rest []*missionPlan, err error) {
	// Apply to copies: a failed transaction must leave plan as it was.
	var (
		done  int
		cut   *missionPlan // the partly done mission, if any
		n     int
		marks []*missionPlan
	)
	err = db.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bOutbox)
		n, done, cut, marks = 0, 0, nil, nil
		budget := outboxChunk
		for _, p := range plan {
			if budget <= 0 {
				break
			}
			if !p.marked {
				if err := markCompacted(b, p.keep); err != nil {
					return err
				}
				marks = append(marks, p)
			}
			take := min(budget, len(p.victims))
			for _, k := range p.victims[:take] {
				if b.Get(k) == nil {
					continue // acknowledged meanwhile
				}
				if err := b.Delete(k); err != nil {
					return err
				}
				n++
			}
			budget -= take
			if take < len(p.victims) {
				cut = &missionPlan{keep: p.keep, marked: true, victims: p.victims[take:]}
				break
			}
			done++
		}
		return nil
	})
	if err != nil {
		return 0, plan, err
	}
	for _, p := range marks {
		p.marked = true
	}
	db.ob.n.Add(-int64(n))
	db.ob.compacted.Add(uint64(n))
	rest = plan[done:]
	if cut != nil {
		rest[0] = cut
	}
	return n, rest, nil
}

// markCompacted sets the compacted flag of the entry at k, if it is still
// there (the hub may have acknowledged it meanwhile).
func markCompacted(b *bolt.Bucket, k []byte) error {
	v := b.Get(k)
	if v == nil {
		return nil
	}
	var e struct {
		Event     json.RawMessage `json:"event"`
		Mission   json.RawMessage `json:"mission"`
		Compacted bool            `json:"compacted,omitempty"`
	}
	if err := json.Unmarshal(v, &e); err != nil {
		return nil // left as it is; Outbox reports it
	}
	if e.Compacted {
		return nil
	}
	e.Compacted = true
	nv, err := json.Marshal(e)
	if err != nil {
		return err
	}
	return b.Put(k, nv)
}
