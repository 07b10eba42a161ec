package agent

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/scenes"
	"github.com/sortie-edge/sortie/store"
)

// Ways a trigger comes in, as its evaluation records them.
const (
	viaMQTT     = "mqtt"
	viaAPI      = "api"
	viaHub      = "hub"
	viaSchedule = "schedule"
)

// Evaluation outcomes (store.Evaluation.Outcome).
const (
	outcomeAccepted  = "accepted"
	outcomeDuplicate = "duplicate"
	outcomeRejected  = "rejected"
	outcomeSkipped   = "skipped"
)

// traceStore is where the tracer keeps evaluations: the store.
type traceStore interface {
	// AddTraces merges evaluations into their records and moves schedule
	// cursors, in one transaction.
	AddTraces(ctx context.Context, evs []store.Evaluation, cursors []store.Cursor) error
	// Trace returns a request ID's record, or driver.ErrNotFound.
	Trace(ctx context.Context, requestID string) (store.Trace, error)
}

// tracer batches trigger evaluations and schedule cursors into the store:
// one write transaction per flush rather than one per trigger, because a
// trigger's mission already costs flash and a flood of rejections must
// not cost a page write each. A flush runs FlushInterval after the first
// record of a batch, at once for a full batch, and at stop; a power cut
// loses at most the last interval of records (the senders had their
// replies; accepted triggers' missions are durable anyway).
type tracer struct {
	db       traceStore
	log      *slog.Logger
	interval time.Duration
	// flushed, when set, is told of each batch written (the hub sync,
	// which forwards the records).
	flushed func()

	mu      sync.Mutex
	pending []store.Evaluation
	cursors map[string]store.Cursor
	kick    chan struct{}
	// flushMu makes flushes one at a time, so a record is never written
	// after a later one of its request ID; a read holds it too, so that
	// it finds a batch in memory or in the store, never in between.
	flushMu sync.Mutex
}

// traceBatch is the batch size that flushes at once; traceBacklog is
// what is kept while the store refuses writes (a full disk), beyond
// which the oldest records are dropped and logged.
const (
	traceBatch   = 256
	traceBacklog = 8192
)

func newTracer(db traceStore, log *slog.Logger, interval time.Duration) *tracer {
	return &tracer{db: db, log: log, interval: interval, cursors: map[string]store.Cursor{}, kick: make(chan struct{}, 1)}
}

// record queues one evaluation; it never blocks.
func (t *tracer) record(e store.Evaluation) {
	if t == nil || driver.ValidateID("request_id", e.RequestID) != nil {
		return // no ID to ask about; the trigger service logged it
	}
	t.mu.Lock()
	t.pending = append(t.pending, e)
	if n := len(t.pending); n > traceBacklog {
		t.log.Warn("trace records dropped: the store is not taking them", "dropped", n-traceBacklog)
		t.pending = append(t.pending[:0], t.pending[n-traceBacklog:]...)
	}
	t.mu.Unlock()
	t.wake()
}

// cursor notes that a schedule was handled up to at; reset moves it
// back (a clock that was ahead).
func (t *tracer) cursor(schedule string, at time.Time, reset bool) {
	t.mu.Lock()
	t.noteCursor(store.Cursor{Schedule: schedule, At: at, Reset: reset})
	t.mu.Unlock()
	t.wake()
}

// noteCursor merges c into the pending cursors; t.mu is held. A reset
// replaces what is pending; a later cursor after a reset keeps the
// reset, which the stored cursor (ahead) would otherwise refuse.
func (t *tracer) noteCursor(c store.Cursor) {
	cur, ok := t.cursors[c.Schedule]
	switch {
	case c.Reset || !ok:
		t.cursors[c.Schedule] = c
	case c.At.After(cur.At):
		c.Reset = cur.Reset
		t.cursors[c.Schedule] = c
	}
}

func (t *tracer) wake() {
	select {
	case t.kick <- struct{}{}:
	default: // a wake-up is pending; it will see this record
	}
}

// run flushes batches until ctx ends, then once more.
func (t *tracer) run(ctx context.Context) error {
	var due <-chan time.Time // armed by the first record of a batch
	var failing time.Duration
	for {
		select {
		case <-ctx.Done():
			_ = t.flush() // logged there; Close tries once more
			return nil
		case <-t.kick:
			// A full batch goes at once, unless the store has just refused
			// one: then it waits its back-off like the rest.
			if t.interval > 0 && (!t.full() || failing > 0) {
				if due == nil {
					due = time.After(max(t.interval, failing))
				}
				continue
			}
		case <-due:
		}
		due = nil
		if t.flush() != nil {
			// Kept for the next try, which comes by itself: the records
			// and cursors must not wait for the next trigger.
			failing = min(max(2*failing, time.Second), time.Minute)
			due = time.After(failing)
		} else {
			failing = 0
		}
	}
}

func (t *tracer) full() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pending) >= traceBatch
}

// flush writes what is pending; on failure it is kept for the next.
func (t *tracer) flush() error {
	t.flushMu.Lock()
	defer t.flushMu.Unlock()
	t.mu.Lock()
	evs := t.pending
	t.pending = nil
	cs := make([]store.Cursor, 0, len(t.cursors))
	for _, c := range t.cursors {
		cs = append(cs, c)
	}
	clear(t.cursors)
	t.mu.Unlock()
	if len(evs) == 0 && len(cs) == 0 {
		return nil
	}
	err := t.db.AddTraces(context.Background(), evs, cs)
	if err == nil {
		if t.flushed != nil && len(evs) > 0 {
			t.flushed()
		}
		return nil
	}
	t.log.Error("writing trigger traces", "records", len(evs), "err", err)
	if errors.Is(err, driver.ErrClosed) {
		return err
	}
	t.mu.Lock()
	t.pending = append(evs, t.pending...)
	for _, c := range cs {
		if cur, ok := t.cursors[c.Schedule]; ok {
			// Noted since: it is the newer, and still needs the reset
			// if the one that failed did.
			cur.Reset = cur.Reset || c.Reset
			t.cursors[c.Schedule] = cur
			continue
		}
		t.cursors[c.Schedule] = c
	}
	t.mu.Unlock()
	return err
}

// trace returns a request ID's record, with the evaluations not yet
// flushed.
func (t *tracer) trace(ctx context.Context, id string) (store.Trace, error) {
	t.flushMu.Lock()
	defer t.flushMu.Unlock()
	tr, err := t.db.Trace(ctx, id)
	if err != nil && !errors.Is(err, driver.ErrNotFound) {
		return tr, err
	}
	t.mu.Lock()
	for _, e := range t.pending {
		if e.RequestID == id {
			tr.RequestID = id
			tr.Add(e)
		}
	}
	t.mu.Unlock()
	if len(tr.Evaluations) == 0 {
		return tr, err
	}
	return tr, nil
}

// evaluation is what a reply says about a trigger's outcome.
func evaluation(via string, tr scenes.Trigger, r scenes.Reply, at time.Time) store.Evaluation {
	e := store.Evaluation{
		RequestID: r.RequestID, At: at, Via: via, Scene: r.Scene, Source: tr.Source,
		Reason: r.Reason, Message: r.Message, MissionID: r.MissionID,
	}
	if e.Scene == "" {
		e.Scene = tr.Scene
	}
	switch {
	case r.Status == scenes.StatusAccepted && r.Duplicate:
		e.Outcome = outcomeDuplicate
	case r.Status == scenes.StatusAccepted:
		e.Outcome = outcomeAccepted
	default:
		e.Outcome = outcomeRejected
	}
	return e
}
