package store

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/store/internal/wal"
)

// Create stores a new mission with its first events, as driver.Writer
// documents. A known m.Meta.RequestKey returns the mission it belongs to
// and created false, writing nothing; an ID already stored fails with an
// error wrapping driver.ErrConflict.
func (db *DB) Create(ctx context.Context, m *driver.Mission, events []driver.Event) (*driver.Mission, bool, error) {
	w, err := newWrite(true, m, events)
	if err != nil {
		return nil, false, fmt.Errorf("create mission: %w", err)
	}
	if db.ob.enabled {
		if err := w.encodeOutbox(m); err != nil {
			return nil, false, fmt.Errorf("create mission: %w", err)
		}
	}
	if err := db.commit(ctx, w); err != nil {
		return nil, false, err
	}
	if w.existing == nil {
		return nil, true, nil
	}
	existing, err := decodeMission(w.existing)
	if err != nil {
		return nil, false, fmt.Errorf("create mission %q: request key %q: %w", m.ID, w.reqKey, err)
	}
	return existing, false, nil
}

// Save stores m if the stored version is m.Version-1 and appends events
// to its timeline, in one transaction. A stale version fails with an
// error wrapping driver.ErrConflict, an unknown mission with one wrapping
// driver.ErrNotFound. A terminal state leaves the active index; a retried
// mission rejoins it.
func (db *DB) Save(ctx context.Context, m *driver.Mission, events []driver.Event) error {
	w, err := newWrite(false, m, events)
	if err != nil {
		return fmt.Errorf("save mission: %w", err)
	}
	if db.ob.enabled {
		if err := w.encodeOutbox(m); err != nil {
			return fmt.Errorf("save mission: %w", err)
		}
	}
	return db.commit(ctx, w)
}

// write is one Create or Save, encoded before it joins a commit so the
// shared transaction does no JSON work.
type write struct {
	create   bool
	id       string
	reqKey   string
	version  uint64
	finished uint64
	state    byte   // stateCode of the mission's state
	seq      uint64 // highest of m.Seq and the events' seqs
	body     []byte
	events   []eventRec
	outbox   [][]byte // outbox values, one per event; nil when the outbox is off
	obFirst  uint64   // the first outbox entry's seq, assigned by the commit leader

	// Set by the leader before done is closed.
	existing []byte // Create: the record that owns reqKey
	err      error

	done     chan struct{} // closed once the write is committed or failed
	lead     chan struct{} // closed when the write's caller is promoted to leader
	promoted bool          // guarded by DB.mu
}

type eventRec struct {
	seq  uint64
	data []byte
}

func newWrite(create bool, m *driver.Mission, events []driver.Event) (*write, error) {
	if m == nil {
		return nil, fmt.Errorf("%w: nil mission", driver.ErrInvalid)
	}
	if err := driver.ValidateID("mission id", m.ID); err != nil {
		return nil, err
	}
	if create && m.Meta.RequestKey != "" {
		if err := driver.ValidateID("request key", m.Meta.RequestKey); err != nil {
			return nil, err
		}
	}
	// The mission and its events go into one buffer, sized from the last
	// write's: growing it piecemeal cost more than encoding the events.
	buf := make([]byte, 0, writeSizeHint.Load()+512)
	buf, err := appendMission(buf, m)
	if err != nil {
		return nil, fmt.Errorf("encode mission %q: %w", m.ID, err)
	}
	body := buf[:len(buf):len(buf)]
	w := &write{
		create:   create,
		id:       m.ID,
		version:  m.Version,
		finished: finishedAt(m),
		state:    stateCode(m.State),
		seq:      m.Seq,
		body:     body,
		events:   make([]eventRec, 0, len(events)),
		done:     make(chan struct{}),
		lead:     make(chan struct{}),
	}
	if create {
		w.reqKey = m.Meta.RequestKey
	}
	for i, ev := range events {
		switch {
		case ev.MissionID != "" && ev.MissionID != m.ID:
			return nil, fmt.Errorf("%w: event %d of mission %q names mission %q", driver.ErrInvalid, ev.Seq, m.ID, ev.MissionID)
		case ev.Seq == 0:
			return nil, fmt.Errorf("%w: event of mission %q has seq 0", driver.ErrInvalid, m.ID)
		case slices.ContainsFunc(events[:i], func(o driver.Event) bool { return o.Seq == ev.Seq }):
			// A commit carries a handful of events: a scan beats a map.
			return nil, fmt.Errorf("%w: mission %q has two events with seq %d", driver.ErrInvalid, m.ID, ev.Seq)
		}
		ev.MissionID = m.ID
		start := len(buf)
		if buf, err = appendEvent(buf, &ev); err != nil {
			return nil, fmt.Errorf("encode event %d of mission %q: %w", ev.Seq, m.ID, err)
		}
		w.events = append(w.events, eventRec{ev.Seq, buf[start:len(buf):len(buf)]})
		w.seq = max(w.seq, ev.Seq)
	}
	writeSizeHint.Store(int64(min(len(buf), maxSizeHint)))
	return w, nil
}

// writeSizeHint is the encoded size of the last write; maxSizeHint keeps a
// rare huge mission from making every later buffer huge.
var writeSizeHint atomic.Int64

const maxSizeHint = 64 << 10

// checkSize refuses a write whose log record could exceed what reading
// the log accepts (wal.MaxRecord): acknowledged, it would be lost at the
// next replay. Only a pathological mission (tens of MiB of context or
// labels) comes near it.
func (w *write) checkSize() error {
	if w.sizeBound() > wal.MaxRecord {
		return fmt.Errorf("%w: mission %q encodes to more than %d MiB", driver.ErrInvalid, w.id, wal.MaxRecord>>20)
	}
	return nil
}

// commit queues w and waits until a leader has committed it. The first
// caller to find no leader becomes one and commits everything queued in
// one transaction; a caller arriving during that commit waits to be
// committed by the next leader, which is the first of them in the queue.
// A lone caller therefore commits at once.
func (db *DB) commit(ctx context.Context, w *write) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := w.checkSize(); err != nil {
		return err
	}
	if err := db.enter(); err != nil {
		return err
	}
	defer db.leave()

	db.mu.Lock()
	db.queue = append(db.queue, w)
	if db.leading {
		db.mu.Unlock()
		select {
		case <-w.done:
			return w.err
		case <-w.lead:
		case <-ctx.Done():
			db.mu.Lock()
			if i := slices.Index(db.queue, w); i >= 0 {
				db.queue = slices.Delete(db.queue, i, i+1)
				if w.promoted {
					db.promoteLocked()
				}
				db.mu.Unlock()
				return ctx.Err()
			}
			db.mu.Unlock()
			// A leader has taken w: once it commits, w is durable, and
			// reporting a failure then would be a lie.
			<-w.done
			return w.err
		}
		db.mu.Lock()
	}
	db.leading = true
	batch := db.queue
	db.queue = nil
	db.mu.Unlock()

	db.commitBatch(batch)

	db.mu.Lock()
	db.promoteLocked()
	db.mu.Unlock()
	<-w.done
	return w.err
}

// promoteLocked hands leadership to the oldest queued write, or gives it
// up when none is waiting. db.mu must be held.
func (db *DB) promoteLocked() {
	if len(db.queue) == 0 {
		db.leading = false
		return
	}
	next := db.queue[0]
	next.promoted = true
	close(next.lead)
}

// commitBatch checks every write against the state acknowledged so far,
// logs those that pass in one append (one fdatasync), and makes them
// visible to reads through the overlay until a checkpoint applies them to
// bbolt. A write that fails its own checks records its error and logs
// nothing; the others commit.
func (db *DB) commitBatch(batch []*write) {
	finished := false
	defer func() {
		if !finished {
			// A panic: release the waiters before it propagates.
			for _, w := range batch {
				w.err = fmt.Errorf("commit: aborted by panic")
				close(w.done)
			}
		}
	}()
	db.wmu.Lock()
	defer db.wmu.Unlock()
	start := time.Now()
	err := db.makeRoom()
	var logged []*write
	var staged *stage
	if err == nil {
		logged, staged, err = db.check(batch)
	}
	if err == nil && len(logged) > 0 {
		db.assignOutboxSeqs(logged)
		payloads := make([][]byte, len(logged))
		ends := make([]int, len(logged))
		db.enc = db.enc[:0]
		for i, w := range logged {
			db.enc = encodeWrite(db.enc, w)
			ends[i] = len(db.enc)
		}
		start := 0
		for i, end := range ends {
			payloads[i] = db.enc[start:end]
			start = end
		}
		if cap(db.enc) > 1<<20 {
			db.enc = nil // a rare huge batch is not kept
		}
		var first uint64
		// On failure the outbox seqs stay used: the failed records may
		// still be on disk, and a gap in the seqs harms no reader.
		if first, err = db.wal.Append(payloads); err == nil {
			db.publish(logged, staged, first)
		}
	}
	if err == nil {
		db.commits.Add(1)
		db.writes.Add(uint64(len(batch)))
		db.onCommit(time.Since(start))
	}
	noteWrite(&db.commitErr, err)
	for _, w := range batch {
		if err != nil && w.err == nil {
			// Nothing was logged, and every check ran against a state that
			// included the batch's own writes: even an answer naming an
			// existing mission may name a version that was never stored.
			w.err, w.existing = fmt.Errorf("commit: %w", err), nil
		}
		close(w.done)
	}
	finished = true
}

// makeRoom rewinds the log once a checkpoint has caught up with it, and
// checkpoints first when it has grown past walLimit because the
// background checkpoint never caught up. db.wmu is held.
func (db *DB) makeRoom() error {
	if db.wal.Offset() > walLimit {
		if err := db.checkpoint(); err != nil {
			return err
		}
	}
	db.wal.Rewind(db.appliedLSN())
	return nil
}

// walLimit bounds the log: under a steady load the background checkpoint
// rarely finds the log empty, which a rewind needs, so past its
// preallocated size the next commit checkpoints first (a few
// milliseconds, once per walLimit of log) and rewinds.
const walLimit = wal.Prealloc

// logWriter is what the store needs of its write-ahead log: a *wal.Log,
// or in tests a spy around one that makes appends fail.
type logWriter interface {
	// Append logs the payloads durably and returns the first one's LSN.
	Append(payloads [][]byte) (first uint64, err error)
	// Rewind starts the next pass after the header once applied, the
	// last LSN checkpointed, covers everything logged.
	Rewind(applied uint64) bool
	// Offset is the length of the current pass.
	Offset() int64
	// Close closes the log, deleting it when remove is set.
	Close(remove bool) error
}

// check runs each write's checks against the acknowledged state: this
// batch's earlier writes, then the overlay, then bbolt. It returns the
// writes that passed and what they change. db.ovMu is held throughout, so
// a checkpoint cannot drop an overlay entry between the overlay lookup
// and the bbolt read that would replace it.
func (db *DB) check(batch []*write) ([]*write, *stage, error) {
	db.ovMu.Lock()
	defer db.ovMu.Unlock()
	v := &view{ov: &db.ov, st: newStage(), db: db.bolt}
	defer v.close()
	var logged []*write
	for _, w := range batch {
		if w.create {
			v.checkCreate(w)
		} else {
			v.checkSave(w)
		}
		if v.err != nil {
			w.err, w.existing = nil, nil // its answer came from the failed read
			return nil, nil, v.err
		}
		if w.err == nil && w.existing == nil {
			logged = append(logged, w)
		}
	}
	return logged, v.st, nil
}

// view is the state a batch's checks see. Its bbolt read transaction is
// begun on the first lookup the batch and the overlay cannot answer (a
// mission saved a moment ago usually is in the overlay), still under
// ovMu, which is what makes the two agree.
type view struct {
	ov  *overlay
	st  *stage
	db  *bolt.DB
	tx  *bolt.Tx
	err error // beginning tx failed
}

func (v *view) bucket(name []byte) *bolt.Bucket {
	if v.tx == nil && v.err == nil {
		v.tx, v.err = v.db.Begin(false)
	}
	if v.err != nil {
		return nil
	}
	return v.tx.Bucket(name)
}

func (v *view) close() {
	if v.tx != nil {
		_ = v.tx.Rollback()
	}
}

// current returns the mission's current envelope; found is false when
// there is none. An envelope read from bbolt aliases the transaction's
// memory.
func (v *view) current(id string) (e envelope, found bool, err error) {
	if p := v.st.missions[id]; p != nil {
		return p.env, true, nil
	}
	if p := v.ov.missions[id]; p != nil {
		return p.env, true, nil
	}
	b, live := v.bucket(bMissions), v.bucket(bLive)
	if b == nil || live == nil {
		return envelope{}, false, v.err
	}
	return record(b, live, []byte(id))
}

// owner returns the mission ID a request key belongs to, or "".
func (v *view) owner(key string) string {
	if id, ok := v.st.requests[key]; ok {
		return id
	}
	if p, ok := v.ov.requests[key]; ok {
		return p.id
	}
	b := v.bucket(bRequests)
	if b == nil {
		return ""
	}
	return string(b.Get([]byte(key)))
}

func (v *view) checkCreate(w *write) {
	if w.reqKey != "" {
		if id := v.owner(w.reqKey); id != "" {
			e, found, err := v.current(id)
			switch {
			case err != nil:
				w.err = fmt.Errorf("create mission %q: request key %q: %w", w.id, w.reqKey, err)
			case !found:
				w.err = fmt.Errorf("create mission %q: %w: request key %q names missing mission %q", w.id, ErrCorrupt, w.reqKey, id)
			default:
				w.existing = e.encode() // a copy, whatever e aliases
			}
			return
		}
	}
	if _, found, _ := v.current(w.id); found {
		w.err = fmt.Errorf("create mission %q: %w: id exists", w.id, driver.ErrConflict)
		return
	}
	// The creation sequence is assigned when a checkpoint inserts the
	// mission; reads of the overlay do not need it.
	v.st.put(w, envelope{form: formJSON, schema: driver.SchemaVersion, state: w.state, version: w.version, finished: w.finished, seq: w.seq, body: w.body})
}

func (v *view) checkSave(w *write) {
	h, found, err := v.current(w.id)
	if !found {
		w.err = fmt.Errorf("save mission %q: %w", w.id, driver.ErrNotFound)
		return
	}
	if err != nil {
		w.err = fmt.Errorf("save mission %q: %w", w.id, err)
		return
	}
	if w.version == 0 || h.version != w.version-1 {
		w.err = fmt.Errorf("save mission %q at version %d: stored version is %d: %w", w.id, w.version, h.version, driver.ErrConflict)
		return
	}
	if w.err = w.checkEvents(h.seq); w.err != nil {
		return
	}
	v.st.put(w, envelope{form: formJSON, schema: driver.SchemaVersion, state: w.state, order: h.order, version: w.version, finished: w.finished, seq: max(w.seq, h.seq), body: w.body})
}

// stage is what a batch's passing writes change, until they are logged.
type stage struct {
	missions map[string]*stagedMission
	requests map[string]string // request key -> mission ID
}

type stagedMission struct {
	env envelope // what the write leaves
	w   *write   // the batch's last write of the mission
}

func newStage() *stage {
	return &stage{missions: map[string]*stagedMission{}, requests: map[string]string{}}
}

func (s *stage) put(w *write, e envelope) {
	s.missions[w.id] = &stagedMission{env: e, w: w}
	if w.create && w.reqKey != "" {
		s.requests[w.reqKey] = w.id
	}
}

// publish makes logged writes, whose first LSN is first, visible to
// reads and queues them for the checkpoint.
func (db *DB) publish(logged []*write, st *stage, first uint64) {
	db.ovMu.Lock()
	before := len(db.ov.pend)
	for i, w := range logged {
		lsn := first + uint64(i)
		db.ov.pend = append(db.ov.pend, pendingWrite{lsn: lsn, w: w})
		if p := st.missions[w.id]; p != nil && p.w == w {
			db.ov.missions[w.id] = &pendingMission{env: p.env, lsn: lsn}
		}
		if w.create && w.reqKey != "" {
			db.ov.requests[w.reqKey] = pendingRequest{id: w.id, lsn: lsn}
		}
		for j, v := range w.outbox {
			db.ov.outbox = append(db.ov.outbox, pendingOutbox{seq: w.obFirst + uint64(j), lsn: lsn, val: v})
		}
	}
	n := len(db.ov.pend)
	db.ovMu.Unlock()
	if db.ob.enabled {
		db.outboxAdded(logged)
	}
	// Waking the checkpointer costs the leader a goroutine switch, so
	// only the first write of a batch starts its wait, and only a full
	// batch cuts it short.
	if before == 0 || before < checkpointBatch && n >= checkpointBatch {
		db.kickCheckpoint(n)
	}
}

type txBuckets struct {
	missions, live, order, active, requests, finished, timeline, outbox *bolt.Bucket
	// acked is the highest outbox seq acknowledged: a checkpoint skips
	// entries up to it.
	acked uint64
}

func bucketsOf(tx *bolt.Tx) *txBuckets {
	b := &txBuckets{
		missions: tx.Bucket(bMissions),
		live:     tx.Bucket(bLive),
		order:    tx.Bucket(bOrder),
		active:   tx.Bucket(bActive),
		requests: tx.Bucket(bRequests),
		finished: tx.Bucket(bFinished),
		timeline: tx.Bucket(bTimeline),
		outbox:   tx.Bucket(bOutbox),
	}
	// Keys that only grow (creation order, finish time, time-ordered
	// mission IDs) fill their pages: bbolt's default splits them half
	// full, which suits random keys and doubles the file for these.
	b.order.FillPercent = 1.0
	b.finished.FillPercent = 0.95
	b.missions.FillPercent = 0.9
	b.outbox.FillPercent = 1.0
	return b
}

// checkEvents refuses to rewrite history: every event must come after
// the highest seq already recorded, which the header keeps.
func (w *write) checkEvents(recorded uint64) error {
	for _, ev := range w.events {
		if ev.seq <= recorded {
			return fmt.Errorf("%w: mission %q event %d: events up to %d are already recorded", driver.ErrInvalid, w.id, ev.seq, recorded)
		}
	}
	return nil
}
