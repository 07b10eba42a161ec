package driver

// A txn is the transitions of one commit, made on a private copy of a
// mission through the state table, and commit saves it (write-ahead)
// and publishes its events.

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// txn accumulates the transitions of one commit on a private copy of a
// mission.
type txn struct {
	m      *Mission
	events []Event
	now    time.Time
	dirty  bool // changed without an event (a control flag)
	// woken means Wake was called for this mission: a not-ready wait ends
	// early.
	woken bool
}

// fire applies one state-machine input and records its event.
func (t *txn) fire(in Input, step int, detail string) error {
	to, err := Next(t.m.State, in)
	if err != nil {
		return err
	}
	t.m.Seq++
	ev := Event{
		MissionID: t.m.ID, Seq: t.m.Seq, Type: t.m.Type, TraceID: t.m.Meta.TraceID,
		Input: in, From: t.m.State, To: to, Step: step, Time: t.now, Detail: detail,
	}
	if step >= 0 && step < len(t.m.Steps) {
		ev.StepID = t.m.Steps[step].ID
		ev.Attempt = t.m.Progress.Attempt
	}
	t.m.State = to
	t.events = append(t.events, ev)
	return nil
}

// fail records an error on the last event.
func (t *txn) annotate(err, code string) {
	if len(t.events) > 0 {
		t.events[len(t.events)-1].Error = err
		t.events[len(t.events)-1].Code = code
	}
}

// begin opens a transaction on a copy of e's latest committed mission.
func (d *Driver) begin(e *entry) *txn {
	d.mu.Lock()
	m := e.m.txnCopy()
	d.mu.Unlock()
	return &txn{m: m, now: d.clock.Now()}
}

// commit saves t and publishes its events. On failure the entry keeps
// its last committed copy and the mission is retried later.
func (d *Driver) commit(e *entry, t *txn) error {
	t.m.Version++
	t.m.Meta.Updated = t.now
	err := d.store.Save(context.Background(), t.m, t.events)
	if err != nil {
		d.log.Error("save mission", "mission", t.m.ID, "trace", t.m.Meta.TraceID, "version", t.m.Version, "err", err)
		if errors.Is(err, ErrConflict) {
			if fresh, gerr := d.store.Get(context.Background(), t.m.ID); gerr == nil {
				d.mu.Lock()
				e.m = fresh
				d.mu.Unlock()
			}
		}
		d.mu.Lock()
		// Try again after a pause rather than spinning on a broken disk.
		e.backoff = t.now.Add(time.Second)
		d.mu.Unlock()
		return fmt.Errorf("save mission %s: %w", t.m.ID, err)
	}
	// t.m is private to this transaction and never changed again, so it
	// can become the shared snapshot without a copy.
	snap := t.m
	d.mu.Lock()
	e.m = snap
	obs := d.observers
	d.mu.Unlock()
	for _, ev := range t.events {
		for _, o := range obs {
			o.Observe(ev, snap)
		}
	}
	return nil
}
