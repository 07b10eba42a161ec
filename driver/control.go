package driver

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"
)

// InSubmit labels a mission's first event. Creation is not a transition,
// so it is not in the state table: its From is empty.
const InSubmit Input = "submit"

// Priority bounds. Higher runs first.
const (
	MinPriority = 0
	MaxPriority = 100
)

// Spec is what a caller submits.
type Spec struct {
	Type     string
	Priority int
	Steps    []Step
	// Values seed the mission context (e.g. trigger parameters).
	Values map[string]any
	// RequestKey makes Submit idempotent: the same key returns the same
	// mission, whatever else the second request says.
	RequestKey string
	TraceID    string
	Source     string
	// Deadline, if set, is when the mission must have finished; Timeout
	// is the same relative to submission. Deadline wins if both are set.
	Deadline time.Time
	Timeout  time.Duration
	Labels   map[string]string
	// Hold submits the mission PAUSED, to be started later by Resume (how
	// a scene's queued mode waits for the run before it).
	Hold bool
}

// Submit creates a mission from spec and queues it. If spec.RequestKey
// was seen before, it returns that mission and created false.
func (d *Driver) Submit(ctx context.Context, spec Spec) (m *Mission, created bool, err error) {
	if err := d.load(ctx); err != nil {
		return nil, false, err
	}
	if spec.Priority < MinPriority || spec.Priority > MaxPriority {
		return nil, false, fmt.Errorf("%w: priority %d is outside %d..%d", ErrInvalid, spec.Priority, MinPriority, MaxPriority)
	}
	now := d.clock.Now()
	m = &Mission{
		ID:       d.newID(now),
		Type:     spec.Type,
		Priority: spec.Priority,
		Context:  Context{Schema: ContextSchema, Values: cloneValues(spec.Values)},
		Steps:    append([]Step(nil), spec.Steps...),
		State:    StatePending,
		Results:  make([]StepResult, len(spec.Steps)),
		Meta: Metadata{
			Created: now, Updated: now, TraceID: spec.TraceID, RequestKey: spec.RequestKey,
			Source: spec.Source, Deadline: spec.Deadline, Labels: maps.Clone(spec.Labels),
		},
		Version: 1,
		Seq:     1,
	}
	if m.Meta.TraceID == "" {
		m.Meta.TraceID = randomHex(16)
	}
	if m.Meta.Deadline.IsZero() && spec.Timeout > 0 {
		m.Meta.Deadline = now.Add(spec.Timeout)
	}
	if !m.Meta.Deadline.IsZero() {
		m.Meta.Budget = Duration(m.Meta.Deadline.Sub(now))
	}
	for i := range m.Results {
		m.Results[i].Status = StepPending
	}
	if spec.Hold {
		m.State = StatePaused
	}
	if err := m.Validate(); err != nil {
		return nil, false, err
	}
	d.mu.Lock()
	for _, s := range m.Steps {
		if d.handlers[s.Kind] == nil {
			d.mu.Unlock()
			return nil, false, fmt.Errorf("%w: step %q has kind %q", ErrUnknownKind, s.ID, s.Kind)
		}
		if s.Compensate != nil && d.handlers[s.Compensate.Kind] == nil {
			d.mu.Unlock()
			return nil, false, fmt.Errorf("%w: step %q compensation has kind %q", ErrUnknownKind, s.ID, s.Compensate.Kind)
		}
	}
	stopping := d.stopping || d.draining
	full := !stopping && d.opts.MaxLive > 0 && len(d.entries)+d.reserved >= d.opts.MaxLive
	if !stopping && !full {
		d.reserved++
	}
	d.mu.Unlock()
	if stopping {
		return nil, false, ErrClosed
	}
	if full {
		// A request sent again (its reply was lost) gets its mission, full
		// or not: the bound is for new work.
		if spec.RequestKey != "" {
			if existing, err := d.store.Lookup(ctx, spec.RequestKey); err == nil {
				return existing, false, nil
			}
		}
		return nil, false, fmt.Errorf("%w: %d missions are running or waiting, the most [driver] max_live allows", ErrFull, d.opts.MaxLive)
	}
	listed := false
	defer func() {
		if !listed {
			d.mu.Lock()
			d.reserved--
			d.mu.Unlock()
		}
	}()
	ev := Event{
		MissionID: m.ID, Seq: 1, Type: m.Type, TraceID: m.Meta.TraceID, Input: InSubmit,
		To: m.State, Step: -1, Time: now, Detail: spec.Source,
	}
	// The creation commit also starts the mission and begins its first
	// step: one fsync fewer before the first command goes out. Until a
	// worker takes the step, Pause and Cancel can still take it back.
	t := &txn{m: m, now: now, events: []Event{ev}}
	begun := false
	if !spec.Hold {
		act, err := d.settle(t)
		if err != nil {
			return nil, false, err
		}
		begun = act == actExec
	}
	existing, created, err := d.store.Create(ctx, m, t.events)
	if err != nil {
		return nil, false, fmt.Errorf("submit %s: %w", spec.Type, err)
	}
	if !created {
		return existing, false, nil
	}
	snap := m.Clone()
	// Observers hear the creation before any worker can produce the
	// mission's next events: per-mission order holds.
	d.mu.Lock()
	obs := d.observers
	d.mu.Unlock()
	for _, ev := range t.events {
		for _, o := range obs {
			o.Observe(ev, snap)
		}
	}
	d.mu.Lock()
	e := &entry{m: snap, ready: -1, timer: -1, idle: begun}
	d.entries[m.ID] = e
	d.reserved--
	listed = true
	d.placeLocked(e, now)
	if d.loopDone != nil && !d.stopping {
		// Dispatching here rather than in the loop saves a trigger's first
		// step a goroutine hand-off.
		d.dispatchLocked(d.clock.Now())
	}
	dispatched := e.running
	d.mu.Unlock()
	if !dispatched {
		d.signal() // the loop arms its timer, or finds the slots full
	}
	return m, true, nil
}

// control runs fn on a fresh transaction of the mission and commits what
// it changed. Control operations serialise with the mission's worker
// through the entry's lock; a step in flight is not interrupted.
func (d *Driver) control(ctx context.Context, id string, fn func(t *txn, e *entry, running bool) error) (*Mission, error) {
	if err := d.load(ctx); err != nil {
		return nil, err
	}
	e, err := d.lockEntry(ctx, id)
	if err != nil {
		return e.mOrNil(), err
	}
	defer e.mu.Unlock()
	d.mu.Lock()
	running := e.running
	d.mu.Unlock()
	t := d.begin(e)
	if err := fn(t, e, running); err != nil {
		d.forgetIfTerminal(e)
		return t.m, err
	}
	if len(t.events) == 0 && !t.dirty {
		d.forgetIfTerminal(e)
		return t.m, nil
	}
	if err := d.commit(e, t); err != nil {
		d.forgetIfTerminal(e)
		return nil, err
	}
	d.mu.Lock()
	d.placeLocked(e, d.clock.Now())
	m := e.m
	d.mu.Unlock()
	d.signal()
	return m.Clone(), nil
}

// unbegin takes back a step that was begun but never handed to a
// handler, so a pause or cancel need not wait for it to run.
func (d *Driver) unbegin(t *txn, e *entry, running bool) bool {
	m := t.m
	d.mu.Lock()
	idle := e.idle && !running
	d.mu.Unlock()
	if !idle || m.State != StateStepRunning || m.Lease.Owner != d.opts.Owner {
		return false
	}
	takeBack(m)
	d.mu.Lock()
	e.idle = false
	d.mu.Unlock()
	return true
}

// lockEntry returns the mission's entry locked, loading a terminal
// FAILED mission from the store (for Retry). While it waited for the
// lock, the mission may have finished and its entry left the table (a
// Retry racing the failure), or another entry may have taken its place:
// it always returns the one the table holds, so no second entry for the
// mission can ever be scheduled.
func (d *Driver) lockEntry(ctx context.Context, id string) (*entry, error) {
	for {
		d.mu.Lock()
		e := d.entries[id]
		d.mu.Unlock()
		if e == nil {
			m, err := d.store.Get(ctx, id)
			if err != nil {
				return nil, err
			}
			if m.State.Terminal() && m.State != StateFailed {
				return &entry{m: m}, fmt.Errorf("%w: %s is %s", ErrTerminal, id, m.State)
			}
			d.mu.Lock()
			if e = d.entries[id]; e == nil {
				e = &entry{m: m, ready: -1, timer: -1}
				d.entries[id] = e
			}
			d.mu.Unlock()
		}
		e.mu.Lock()
		d.mu.Lock()
		cur := d.entries[id]
		if cur == nil {
			d.entries[id] = e
			cur = e
		}
		d.mu.Unlock()
		if cur == e {
			return e, nil
		}
		e.mu.Unlock()
	}
}

// mOrNil is the mission of an entry lockEntry gave back with an error.
func (e *entry) mOrNil() *Mission {
	if e == nil {
		return nil
	}
	return e.m
}

// forgetIfTerminal drops an entry that control loaded for a terminal
// mission it did not change.
func (d *Driver) forgetIfTerminal(e *entry) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e.m.State.Terminal() && !e.running {
		d.sched.remove(e)
		delete(d.entries, e.m.ID)
	}
}

// Pause holds a mission at its next step boundary. A mission with a
// step in flight stays STEP_RUNNING until that step ends.
func (d *Driver) Pause(ctx context.Context, id string) (*Mission, error) {
	return d.control(ctx, id, func(t *txn, e *entry, running bool) error {
		m := t.m
		switch {
		case m.State == StatePaused:
			return nil
		case m.State.Terminal():
			return fmt.Errorf("%w: %s is %s", ErrTerminal, id, m.State)
		case m.State == StateCompensating:
			return &TransitionError{From: m.State, Input: InPause}
		}
		m.Control.Pause = true
		t.dirty = true
		if d.unbegin(t, e, running) {
			m.Control.Pause = false
			return t.fire(InPause, m.Progress.Step, "paused before the step ran")
		}
		// A worker holding the mission now is either executing its step
		// (STEP_RUNNING: the flag waits for the boundary) or done with
		// its commits (we hold the entry lock), so anything else can be
		// settled here.
		if m.State == StateStepRunning {
			return nil
		}
		_, err := d.settle(t)
		return err
	})
}

// Resume lets a paused mission go on from where it stopped.
func (d *Driver) Resume(ctx context.Context, id string) (*Mission, error) {
	return d.control(ctx, id, func(t *txn, _ *entry, running bool) error {
		m := t.m
		if m.State != StatePaused {
			if m.Control.Pause {
				m.Control.Pause = false // withdraw a pause not yet taken
				t.dirty = true
				return nil
			}
			return &TransitionError{From: m.State, Input: InResume}
		}
		m.Due = time.Time{}
		return t.fire(InResume, m.Progress.Step, "resumed")
	})
}

// Cancel stops a mission: a step in flight finishes (or times out),
// then completed steps are compensated in reverse order.
func (d *Driver) Cancel(ctx context.Context, id string) (*Mission, error) {
	return d.CancelFor(ctx, id, "")
}

// CancelFor is Cancel with a reason that the mission records as its
// error ("cancelled: <reason>"), for cancellations no operator asked for
// (a restart-mode scene replacing its earlier run).
func (d *Driver) CancelFor(ctx context.Context, id, reason string) (*Mission, error) {
	return d.control(ctx, id, func(t *txn, e *entry, running bool) error {
		m := t.m
		switch {
		case m.State.Terminal():
			return fmt.Errorf("%w: %s is %s", ErrTerminal, id, m.State)
		case m.State == StateCompensating:
			return &TransitionError{From: m.State, Input: InCancel}
		}
		m.Control.Cancel = true
		if m.Control.CancelReason == "" {
			m.Control.CancelReason = reason
		}
		t.dirty = true
		if d.unbegin(t, e, running) {
			return d.stop(t, StateCancelled, "cancelled", cancelMessage(m, "cancelled before the step ran"))
		}
		// A worker holding the mission now is either executing its step
		// (STEP_RUNNING: the flag waits for the boundary) or done with
		// its commits (we hold the entry lock), so anything else can be
		// settled here.
		if m.State == StateStepRunning {
			return nil
		}
		_, err := d.settle(t)
		return err
	})
}

// Retry restarts a FAILED mission. It resumes from the failed step, or
// from the earliest compensated step if compensation undid earlier
// work, so the mission's goal is reached again as a whole. A mission
// with a deadline gets the same time budget again from now.
func (d *Driver) Retry(ctx context.Context, id string) (*Mission, error) {
	m, err := d.retry(ctx, id)
	if errors.Is(err, ErrTerminal) || errors.Is(err, ErrIllegalTransition) {
		err = fmt.Errorf("%w (only a FAILED mission can be retried)", err)
	}
	return m, err
}

func (d *Driver) retry(ctx context.Context, id string) (*Mission, error) {
	return d.control(ctx, id, func(t *txn, _ *entry, running bool) error {
		m := t.m
		if m.State != StateFailed {
			return &TransitionError{From: m.State, Input: InRetry}
		}
		from := min(m.Progress.Step, len(m.Steps)-1)
		for i, r := range m.Results {
			if r.Status == StepCompensated || r.Status == StepFailed {
				from = min(from, i)
			}
		}
		from, _ = GroupBounds(m.Steps, from) // a group runs again as a whole
		for i := from; i < len(m.Results); i++ {
			m.Results[i] = StepResult{Status: StepPending}
		}
		m.Undo = nil
		m.Progress = Progress{Step: from, Undo: 0, Gen: m.Progress.Gen + 1}
		m.Error, m.Reason = "", ""
		m.Meta.Finished = time.Time{}
		m.Control = Control{}
		m.Due = time.Time{}
		if m.Meta.Budget > 0 {
			m.Meta.Deadline = t.now.Add(m.Meta.Budget.D())
		}
		return t.fire(InRetry, from, fmt.Sprintf("retry from step %s", m.Steps[from].ID))
	})
}

// SetPriority changes a live mission's priority; it takes effect the
// next time the loop picks.
func (d *Driver) SetPriority(ctx context.Context, id string, p int) (*Mission, error) {
	if p < MinPriority || p > MaxPriority {
		return nil, fmt.Errorf("%w: priority %d is outside %d..%d", ErrInvalid, p, MinPriority, MaxPriority)
	}
	return d.control(ctx, id, func(t *txn, _ *entry, running bool) error {
		if t.m.State.Terminal() {
			return fmt.Errorf("%w: %s is %s", ErrTerminal, id, t.m.State)
		}
		if t.m.Priority == p {
			return nil
		}
		old := t.m.Priority
		t.m.Priority = p
		return t.fire(InReprioritise, -1, fmt.Sprintf("priority %d -> %d", old, p))
	})
}

// Get returns a mission's latest committed state.
func (d *Driver) Get(ctx context.Context, id string) (*Mission, error) {
	return d.store.Get(ctx, id)
}

// List returns missions matching f, newest first, and the next cursor.
func (d *Driver) List(ctx context.Context, f Filter) ([]*Mission, string, error) {
	return d.store.List(ctx, f)
}

// Lookup returns the mission a request key created.
func (d *Driver) Lookup(ctx context.Context, requestKey string) (*Mission, error) {
	return d.store.Lookup(ctx, requestKey)
}

// Timeline returns a mission's events in order.
func (d *Driver) Timeline(ctx context.Context, id string) ([]Event, error) {
	return d.store.Timeline(ctx, id)
}

// QueueStats is a snapshot of the loop's work, for metrics.
type QueueStats struct {
	ByState map[State]int // active missions by state
	Due     int           // due now and waiting for a worker
	Running int           // steps executing
	// Parked are step attempts waiting for an outcome (an ack, a state)
	// with no worker: they cost memory, not workers.
	Parked int
	// Zombies are handlers that ignored their timeout, were abandoned,
	// and have not returned yet (each still holds a goroutine).
	Zombies int
	// Refused counts the transitions the state table refused since the
	// driver was made, each one a bug logged at error level: the mission
	// kept its last committed state (Driver.refused).
	Refused int
	// OldestDue is the earliest wake time among due missions (zero when
	// none is due): how long the oldest runnable mission has waited.
	OldestDue time.Time
}

// Queue reports the loop's current work.
func (d *Driver) Queue() QueueStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	q := QueueStats{ByState: make(map[State]int), Due: len(d.sched.ready), Running: d.running, Zombies: d.zombies, Refused: d.refusedN}
	q.Parked = d.parked
	for _, e := range d.entries {
		q.ByState[e.m.State]++
	}
	for _, e := range d.sched.ready {
		w := e.wake
		if w.IsZero() {
			w = e.m.Meta.Updated
		}
		if q.OldestDue.IsZero() || w.Before(q.OldestDue) {
			q.OldestDue = w
		}
	}
	return q
}

// InNote labels an event that records something about a mission without
// changing it: a decision another mission's step made about a device
// they share (taken over, left alone). Not a transition: From equals To.
const InNote Input = "note"

// Note appends a note event about step (-1 for none) to a mission's
// timeline, live or finished, and hands it to the observers: how a
// decision made by another mission's step (it took a device over, left
// it alone) shows on this mission's timeline too.
func (d *Driver) Note(ctx context.Context, id string, step int, detail string) error {
	if err := d.load(ctx); err != nil {
		return err
	}
	e, err := d.lockEntry(ctx, id)
	if err != nil && !errors.Is(err, ErrTerminal) {
		return err
	}
	if err == nil {
		defer e.mu.Unlock()
		defer d.forgetIfTerminal(e) // a FAILED mission lockEntry loaded
		t := d.begin(e)
		t.note(step, detail)
		return d.commit(e, t)
	}
	// A finished mission has no entry and no writer but notes (and
	// retention, which deletes it): one at a time, against the store.
	d.noteMu.Lock()
	defer d.noteMu.Unlock()
	var t *txn
	for range 3 {
		m, gerr := d.store.Get(ctx, id)
		if gerr != nil {
			return gerr
		}
		t = &txn{m: m, now: d.clock.Now()}
		t.note(step, detail)
		t.m.Version++
		if err = d.store.Save(ctx, t.m, t.events); !errors.Is(err, ErrConflict) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("note on %s: %w", id, err)
	}
	d.mu.Lock()
	obs := d.observers
	d.mu.Unlock()
	for _, o := range obs {
		o.Observe(t.events[0], t.m)
	}
	return nil
}

// note records a note event on t.
func (t *txn) note(step int, detail string) {
	t.m.Seq++
	ev := Event{
		MissionID: t.m.ID, Seq: t.m.Seq, Type: t.m.Type, TraceID: t.m.Meta.TraceID,
		Input: InNote, From: t.m.State, To: t.m.State, Step: step, Time: t.now, Detail: detail,
	}
	if step >= 0 && step < len(t.m.Steps) {
		ev.StepID = t.m.Steps[step].ID
	}
	t.events = append(t.events, ev)
}
