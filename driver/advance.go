package driver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
	"strconv"
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

// action is what a worker does after a commit.
type action int

const (
	actRest    action = iota // nothing to execute now
	actExec                  // execute the current step
	actCompExc               // execute the current compensation
	actGroup                 // run the group the mission is in
)

// advance takes a mission one step forward: it settles it (start,
// deadline, pause, cancel, begin the next step) and commits that
// write-ahead, executes at most one step or compensation, then commits
// the outcome together with the next step's begin.
func (d *Driver) advance(e *entry, gen uint64) {
	e.mu.Lock()
	locked := true
	defer func() {
		if locked {
			e.mu.Unlock()
		}
	}()
	d.mu.Lock()
	if m := e.m; m.State == StateStepRunning && m.Lease.Owner == d.opts.Owner &&
		e.park != nil && !e.park.inFlight && (m.Control.Cancel || m.Control.Pause) {
		// Cancelled or paused while its attempt waited to start its
		// effect (its device's turn): give the attempt up rather than
		// resume it into sending a command for a mission that is over.
		park := e.park
		d.unparkLocked(e)
		d.mu.Unlock()
		d.abandon(e, park)
		return
	}
	if m := e.m; inGroup(m) && m.Lease.Owner == d.opts.Owner {
		e.woken = false
		d.mu.Unlock()
		e.mu.Unlock()
		locked = false
		d.advanceGroup(e, gen)
		return
	}
	if m := e.m; m.State == StateStepRunning && m.Lease.Owner == d.opts.Owner {
		// The common case: the previous commit began this step under our
		// lease, so settling would change nothing and commit nothing.
		e.woken = false
		d.mu.Unlock()
		e.mu.Unlock()
		locked = false
		d.execute(e, actExec, gen)
		return
	}
	d.mu.Unlock()
	t := d.begin(e)
	d.mu.Lock()
	// A Wake ends a not-ready wait early; only an advance may use it up.
	t.woken = e.woken && t.m.Control.wakeable()
	e.woken = false
	d.mu.Unlock()
	act, err := d.settle(t)
	if err != nil {
		d.log.Error("settle mission", "mission", t.m.ID, "err", err)
		d.mu.Lock()
		e.backoff = t.now.Add(time.Second) // do not spin on a bug
		d.mu.Unlock()
		return
	}
	if act != actRest && act != actGroup {
		// A step already begun and committed (by an earlier commit or a
		// previous process) needs no new commit, unless its lease is
		// someone else's: then record the recovery first. (A group's
		// worker records its own.)
		if t.m.Lease.Owner != d.opts.Owner {
			detail := "lease of " + t.m.Lease.Owner + " taken over"
			if t.m.Lease.Owner == "" {
				detail = "unleased step recovered"
			}
			t.m.Lease = d.lease(t.m, t.now)
			if err := t.fire(InRecover, d.current(t.m), detail); err != nil {
				d.log.Error("recover mission", "mission", t.m.ID, "err", err)
				return
			}
		}
	}
	if len(t.events) > 0 {
		if d.commit(e, t) != nil {
			return
		}
	}
	if act == actRest {
		return
	}
	e.mu.Unlock()
	locked = false
	if act == actGroup {
		d.advanceGroup(e, gen)
		return
	}
	d.execute(e, act, gen)
}

// abandon gives up an attempt parked before its effect started, for a
// mission cancelled or paused since: the handler is told (Resume.Abandon)
// so that it lets go of what it holds, and the step is taken back as
// unbegin does, then the cancel or pause is settled. e.mu is held.
func (d *Driver) abandon(e *entry, park *parking) {
	req, _ := stepRequest(e.m, park.idx, park.comp)
	p := park.p
	p.Abandon = true
	req.Deadline, req.Resume = park.deadline, &p
	d.mu.Lock()
	h := d.handlers[req.Kind]
	d.mu.Unlock()
	_, _ = d.run(h, req, resumeFloor) // told to let go; what it answers changes nothing
	t := d.begin(e)
	takeBack(t.m)
	var err error
	if t.m.Control.Cancel {
		err = d.stop(t, StateCancelled, "cancelled", cancelMessage(t.m, "cancelled before the step's command was sent"))
	} else {
		t.m.Control.Pause = false
		err = t.fire(InPause, t.m.Progress.Step, "paused before the step's command was sent")
	}
	if err != nil {
		d.log.Error("abandon parked step", "mission", t.m.ID, "err", err)
		return
	}
	_ = d.commit(e, t) // a failed commit is logged and retried by the loop
}

// takeBack undoes a step's begin that never reached its effect: the
// attempt is not spent, and the lease goes.
func takeBack(m *Mission) {
	r := &m.Results[m.Progress.Step]
	r.Attempts--
	r.Status = StepPending
	if r.Attempts > 0 {
		r.Status = StepWaiting
	}
	m.Progress.Attempt = r.Attempts
	m.Lease = Lease{}
}

// begin opens a transaction on a copy of e's latest committed mission.
func (d *Driver) begin(e *entry) *txn {
	d.mu.Lock()
	m := e.m.txnCopy()
	d.mu.Unlock()
	return &txn{m: m, now: d.clock.Now()}
}

// current is the step index an in-flight execution concerns.
func (d *Driver) current(m *Mission) int {
	if m.State == StateCompensating {
		return m.Progress.Undo
	}
	return m.Progress.Step
}

func (d *Driver) lease(m *Mission, now time.Time) Lease {
	return Lease{Owner: d.opts.Owner, Expires: now.Add(d.timeoutOf(m) + d.opts.LeaseGrace)}
}

func (d *Driver) timeoutOf(m *Mission) time.Duration {
	return d.stepTimeout(m, d.current(m), m.State == StateCompensating)
}

// stepTimeout bounds one attempt of step k, or of its undo with comp.
func (d *Driver) stepTimeout(m *Mission, k int, comp bool) time.Duration {
	var to Duration
	switch {
	case k < 0 || k >= len(m.Steps):
	case comp:
		if c := m.Steps[k].Compensate; c != nil {
			to = c.Timeout
		}
	default:
		to = m.Steps[k].Timeout
	}
	if to <= 0 {
		return d.opts.StepTimeout
	}
	return to.D()
}

// attemptDeadline is when a fresh attempt of step k (its undo with
// comp) begun at now ends: its timeout, and for a forward step no later
// than the mission's deadline. (An undo is worth trying whatever the
// deadline.)
func (d *Driver) attemptDeadline(m *Mission, k int, comp bool, now time.Time) time.Time {
	timeout := d.stepTimeout(m, k, comp)
	if dl := m.Meta.Deadline; !comp && !dl.IsZero() && dl.Sub(now) < timeout {
		timeout = max(dl.Sub(now), 0)
	}
	return now.Add(timeout)
}

// settle moves t.m to a resting state or to the begin of a step,
// honouring cancel, deadline and pause at step boundaries.
func (d *Driver) settle(t *txn) (action, error) {
	m := t.m
	for range 64 { // each pass fires one input; the bound guards against a table bug
		dl := m.Meta.Deadline
		late := !dl.IsZero() && !t.now.Before(dl)
		switch m.State {
		case StatePending:
			switch {
			case m.Control.Cancel:
				return actRest, d.stop(t, StateCancelled, "cancelled", "cancelled before start")
			case late:
				return actRest, d.stop(t, StateFailed, "deadline", ErrDeadline.Error()+" before start")
			case m.Control.Pause:
				m.Control.Pause = false
				return actRest, t.fire(InPause, -1, "paused before start")
			}
			m.Meta.Started = t.now
			if err := t.fire(InStart, -1, ""); err != nil {
				return actRest, err
			}
		case StateStepSucceeded:
			k := m.Progress.Step
			_, m.Progress.Step = GroupBounds(m.Steps, k)
			if err := t.fire(InNext, k, ""); err != nil {
				return actRest, err
			}
		case StateRunning, StateStepFailed:
			retrying := m.State == StateStepFailed
			switch {
			case m.Control.Cancel:
				return actRest, d.stop(t, StateCancelled, "cancelled", cancelMessage(m, "cancelled by request"))
			case !retrying && m.Progress.Step >= len(m.Steps):
				// Done: a last step that finished on the deadline still
				// counts, so completion is checked before lateness.
				d.finish(t)
				if failed := d.failedSteps(m); failed > 0 {
					m.Reason = "completed_with_errors"
					m.Error = fmt.Sprintf("%d of %d steps failed; the run went on without them", failed, len(m.Steps))
				}
				return actRest, t.fire(InComplete, -1, "")
			case late:
				return actRest, d.stop(t, StateFailed, "deadline", fmt.Sprintf("%v at %s", ErrDeadline, dl.UTC().Format(time.RFC3339)))
			case m.Control.Pause:
				// Resume starts the step afresh: a wait or backoff it was
				// in is over, and nothing may wake the paused mission.
				m.Control.Pause = false
				m.Control.Wait, m.Control.WaitFor = false, ""
				return actRest, t.fire(InPause, m.Progress.Step, "paused at step boundary")
			case t.now.Before(m.Due) && !t.woken:
				// A retry's backoff (STEP_FAILED) or a not-ready wait
				// (RUNNING) that has not run out.
				return actRest, nil
			}
			if m.Steps[m.Progress.Step].Group != nil {
				return actGroup, d.beginGroup(t)
			}
			d.beginStep(t)
			return actExec, t.fire(InBeginStep, m.Progress.Step, "")
		case StatePaused:
			switch {
			case m.Control.Cancel:
				return actRest, d.stop(t, StateCancelled, "cancelled", "cancelled while paused")
			case late:
				return actRest, d.stop(t, StateFailed, "deadline", ErrDeadline.Error()+" while paused")
			}
			return actRest, nil
		case StateStepRunning:
			if inGroup(m) {
				return actGroup, nil
			}
			return actExec, nil
		case StateCompensating:
			j := m.Progress.Undo
			if inGroup(m) {
				return actGroup, nil // a group's undo is under way
			}
			if j >= 0 && j < len(m.Undo) && m.Undo[j].Status == StepRunning {
				return actCompExc, nil
			}
			if t.now.Before(m.Due) && !t.woken {
				return actRest, nil
			}
			j = nextUndo(m, j)
			if j < 0 {
				d.finish(t)
				in := InFail
				if m.Progress.Cause == StateCancelled {
					in = InCancel
				}
				return actRest, t.fire(in, -1, "compensation finished")
			}
			m.Progress.Undo = j
			if m.Steps[j].Group != nil {
				// The group's branches are undone at once, by its worker.
				g0, g1 := GroupBounds(m.Steps, j)
				m.Lease = d.groupLease(m, g0, g1, t.now)
				t.dirty = true
				return actGroup, nil
			}
			u := &m.Undo[j]
			if u.Started.IsZero() {
				u.Started = t.now
			}
			u.Attempts++
			u.Status = StepRunning
			m.Progress.Attempt = u.Attempts
			m.Control.Wait, m.Control.WaitFor = false, ""
			m.Lease = d.lease(m, t.now)
			return actCompExc, t.fire(InCompBegin, j, "compensating "+m.Steps[j].ID)
		default:
			return actRest, nil
		}
	}
	return actRest, errors.New("settle did not converge")
}

// nextUndo finds the highest step index at or below from that succeeded
// and can be compensated, or -1.
func nextUndo(m *Mission, from int) int {
	for j := min(from, len(m.Steps)-1); j >= 0; j-- {
		if m.Results[j].Status == StepSucceeded && m.Steps[j].Compensate != nil {
			return j
		}
	}
	return -1
}

func (d *Driver) failedSteps(m *Mission) int {
	n := 0
	for _, r := range m.Results {
		if r.Status == StepFailed {
			n++
		}
	}
	return n
}

func (d *Driver) beginStep(t *txn) {
	m := t.m
	if m.Meta.Started.IsZero() {
		m.Meta.Started = t.now // a held mission skips PENDING
	}
	r := &m.Results[m.Progress.Step]
	if r.Started.IsZero() {
		r.Started = t.now
	}
	r.Attempts++
	r.Status = StepRunning
	m.Progress.Attempt = r.Attempts
	m.Control.Wait, m.Control.WaitFor = false, ""
	m.Due = time.Time{}
	m.Lease = d.lease(m, t.now)
}

// finish stamps a mission that is about to become terminal.
func (d *Driver) finish(t *txn) {
	m := t.m
	m.Meta.Finished = t.now
	m.Lease = Lease{}
	m.Due = time.Time{}
	m.Control = Control{}
	for i := range m.Results {
		if m.Results[i].Status == StepPending || m.Results[i].Status == StepWaiting {
			m.Results[i].Status = StepSkipped
		}
	}
}

// stop ends a mission as cause (FAILED or CANCELLED), compensating first
// if any completed step can be undone.
func (d *Driver) stop(t *txn, cause State, reason, msg string) error {
	m := t.m
	m.Reason, m.Error = reason, msg
	if m.compensable() {
		m.Progress.Cause = cause
		m.Progress.Undo = len(m.Steps) - 1
		m.Undo = make([]StepResult, len(m.Steps))
		m.Due = time.Time{}
		m.Lease = Lease{}
		m.Control.Wait, m.Control.WaitFor = false, ""
		if err := t.fire(InCompensate, m.Progress.Step, msg); err != nil {
			return err
		}
		t.annotate(msg, reason)
		return nil
	}
	d.finish(t)
	in := InFail
	if cause == StateCancelled {
		in = InCancel
	}
	if err := t.fire(in, m.Progress.Step, msg); err != nil {
		return err
	}
	t.annotate(msg, reason)
	return nil
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

// stepRequest is the request for the current attempt of step idx of m
// (its compensation with comp), and the retry policy that applies, but
// for the attempt's Deadline and Resume, which the caller knows.
func stepRequest(m *Mission, idx int, comp bool) (StepRequest, RetryPolicy) {
	step := m.Steps[idx]
	req := StepRequest{
		MissionID: m.ID, MissionType: m.Type, StepID: step.ID, StepIndex: idx, Kind: step.Kind,
		Attempt: m.Progress.Attempt, Params: step.Params, Context: cloneValues(m.Context.Values),
		IdempotencyKey: m.ID + "-" + strconv.Itoa(m.Progress.Gen) + "-" + strconv.Itoa(idx),
		TraceID:        m.Meta.TraceID, Started: m.Results[idx].Started, Priority: m.Priority, Created: m.Meta.Created,
	}
	policy := step.Retry
	if comp {
		req.Kind, req.Params, policy = step.Compensate.Kind, step.Compensate.Params, step.Compensate.Retry
		req.IdempotencyKey += "-undo"
		req.Compensating = true
		req.Forward = cloneValues(m.Results[idx].Outputs)
		req.Started = m.Undo[idx].Started
	}
	return req, policy
}

// resumeFloor is the least time a resumed attempt gets to collect an
// outcome that arrived as its deadline ran out.
const resumeFloor = 100 * time.Millisecond

// execute runs the begun step (or compensation), then commits its
// outcome together with whatever settle decides next. A handler that
// returns Pending parks the attempt instead: nothing is committed, and
// the entry is filed under the key it waits for until it is resumed
// (execute again, with StepRequest.Resume set).
func (d *Driver) execute(e *entry, act action, gen uint64) {
	d.mu.Lock()
	// Read only: committed snapshots are replaced, never modified, and
	// what the handler gets (context, forward outputs) is copied below.
	m := e.m
	e.idle = false
	e.ranSince = d.wakes
	park := e.park
	d.unparkLocked(e)
	d.mu.Unlock()
	lease := m.Lease
	comp := act == actCompExc
	idx := m.Progress.Step
	if comp {
		idx = m.Progress.Undo
	}
	if park != nil && (park.comp != comp || park.idx != idx || park.attempt != m.Progress.Attempt) {
		park = nil // parked by another attempt: this one starts afresh
	}
	req, policy := stepRequest(m, idx, comp)
	now := d.clock.Now()
	attemptStart, deadline := now, time.Time{}
	var resume *Parked
	if park != nil {
		// The same attempt goes on: its start and deadline are the
		// first call's.
		attemptStart, deadline = park.p.Since, park.deadline
		p := park.p
		p.InFlight = park.inFlight
		resume = &p
	} else {
		deadline = d.attemptDeadline(m, idx, comp, now)
	}
	timeout := deadline.Sub(now)
	if resume != nil && timeout < resumeFloor {
		timeout = resumeFloor
	}
	req.Deadline, req.Resume = deadline, resume
	d.mu.Lock()
	h := d.handlers[req.Kind]
	d.mu.Unlock()
	log := stepLog{l: d.log, mission: m.ID, trace: m.Meta.TraceID, step: req.StepID, kind: req.Kind, attempt: req.Attempt}

	// A handler that ignores its context past the lease is a zombie: the
	// lease timer gives the step to a new execution (same idempotency
	// key) and this one's outcome is dropped when it finally returns.
	// The stored lease dates from when the step was begun, which may be
	// long before a worker took it; the clock for abandoning starts now.
	stopLease := d.clock.AfterFunc(timeout+d.opts.LeaseGrace, func() {
		d.expire(e, gen, lease, comp, idx, policy, attemptStart)
	})
	out, err := d.call(h, req, attemptStart, deadline)
	stopLease()
	if d.runCtx.Err() != nil {
		// Stop ran out of grace and cancelled us: the outcome is unknown, so
		// leave the step leased and STEP_RUNNING for the next start.
		log.Warn("step interrupted by shutdown; it will be re-executed on restart")
		return
	}
	if pe := (*PendingError)(nil); errors.As(err, &pe) {
		d.park(e, gen, &parking{
			p:        Parked{Key: pe.Key, Until: pe.Until, Note: pe.Note, Out: pe.Out, Since: attemptStart},
			deadline: deadline, attempt: m.Progress.Attempt, comp: comp, idx: idx, inFlight: pe.InFlight,
		}, log)
		return
	}
	elapsed := d.clock.Now().Sub(attemptStart)

	e.mu.Lock()
	defer e.mu.Unlock()
	d.mu.Lock()
	lost := e.gen != gen
	d.mu.Unlock()
	if lost {
		log.Warn("step returned after its lease expired; it was re-executed and this outcome is dropped", "err", err)
		return
	}
	t := d.begin(e)
	m = t.m
	if m.State != StateStepRunning && m.State != StateCompensating {
		log.Warn("mission changed under a running step; outcome dropped", "state", m.State)
		return
	}
	if comp {
		d.compOutcome(t, idx, policy, out, err, elapsed, log)
	} else {
		d.stepOutcome(t, idx, policy, out, err, elapsed, log)
	}
	act, serr := d.settle(t)
	if serr != nil {
		log.Error("settle after step", "err", serr)
		return
	}
	if d.commit(e, t) != nil {
		return
	}
	d.mu.Lock()
	if act != actRest {
		// The next step is begun (write-ahead) but waits for a worker.
		e.idle = true
	}
	if m := e.m; m.Control.wakeable() && d.lastWake[m.Control.WaitFor] > e.ranSince {
		e.woken = true
	}
	d.mu.Unlock()
}

// park files a parked attempt: no commit, no worker; finishWork files the
// entry by its wake time and key. An attempt whose lease expired
// meanwhile (its mission went to another worker) is not parked.
func (d *Driver) park(e *entry, gen uint64, p *parking, log stepLog) {
	if p.p.Until.IsZero() || p.p.Until.After(p.deadline) {
		p.p.Until = p.deadline
	}
	p.p.Woken = false
	d.mu.Lock()
	defer d.mu.Unlock()
	if e.gen != gen {
		log.Warn("step parked after its lease expired; it was re-executed and this attempt is dropped")
		return
	}
	e.park = p
	d.parked++
	if p.inFlight {
		d.inFlight++
	}
}

// unparkLocked takes e's park away (to resume it). d.mu is held.
func (d *Driver) unparkLocked(e *entry) {
	if e.park == nil {
		return
	}
	d.parked--
	if e.park.inFlight {
		d.inFlight--
	}
	e.park = nil
}

// run calls the handler with a timeout driven by the injected clock, and
// turns panics into errors so one bad handler cannot kill the agent.
func (d *Driver) run(h Handler, req StepRequest, timeout time.Duration) (out map[string]any, err error) {
	if h == nil {
		return nil, fmt.Errorf("%w: %q", ErrUnknownKind, req.Kind)
	}
	if timeout <= 0 {
		return nil, ErrDeadline
	}
	// A real deadline, so handlers that read ctx.Deadline() (to bound a
	// network wait) see one; and, with an injected clock, a timer on that
	// clock as well, which tests advance.
	ctx, cancelDL := context.WithDeadlineCause(d.runCtx, time.Now().Add(timeout), ErrStepTimeout)
	defer cancelDL()
	if _, real := d.clock.(SystemClock); !real {
		var cancel context.CancelCauseFunc
		ctx, cancel = context.WithCancelCause(ctx)
		defer cancel(nil)
		stopTimer := d.clock.AfterFunc(timeout, func() { cancel(ErrStepTimeout) })
		defer stopTimer()
	}
	defer func() {
		if r := recover(); r != nil {
			err = PermanentError("panic", fmt.Errorf("handler %q panicked: %v\n%s", req.Kind, r, debug.Stack()))
		}
	}()
	out, err = h.Execute(ctx, req)
	if err != nil && errors.Is(context.Cause(ctx), ErrStepTimeout) {
		err = RetryableError("timeout", fmt.Errorf("%w after %s: %w", ErrStepTimeout, timeout, err))
	}
	return out, err
}

// verdict is what an attempt's outcome leads to.
type verdict int

const (
	verdictDone    verdict = iota // it succeeded
	verdictWait                   // not ready: wait, spending no attempt
	verdictRetry                  // failed: try again after a backoff
	verdictFail                   // failed for good
	verdictGaveWay                // ended without its effect, not failed (GaveWay)
)

// attemptOutcome is what decide needs to know of an attempt that ended.
type attemptOutcome struct {
	err error
	// attempts is the attempts spent so far, this one included unless it
	// was not ready.
	attempts int
	policy   RetryPolicy // with defaults
	// limit is the latest time the step may be retried or waited for
	// (waitLimit); zero for none.
	limit time.Time
	// deadline is the mission's, for a forward step; zero for a
	// compensation, which is worth trying whatever the deadline.
	deadline time.Time
	forward  bool
	now      time.Time
	// notReadyRetry is the wait of a not-ready attempt that names none.
	notReadyRetry time.Duration
	// backoff draws a retry's jittered backoff. It is called only for a
	// retry that names no wait of its own, so the draws stay in step.
	backoff func() time.Duration
}

// decision is decide's answer.
type decision struct {
	verdict verdict
	class   Class
	code    string        // the error's code (Classify)
	due     time.Time     // wait, retry: when to look again
	backoff time.Duration // retry: the wait before it
	// failCode and msg say why the step failed for good (fail).
	failCode, msg string
}

// decide is the one place that turns an attempt's outcome into what
// happens next, for forward steps and compensations alike: a pure
// function of its input (the backoff draw aside), tested as a table
// (TestDecide).
func decide(o attemptOutcome) decision {
	if o.err == nil {
		return decision{verdict: verdictDone}
	}
	class, code := Classify(o.err)
	d := decision{class: class, code: code, failCode: code}
	var retryAfter time.Duration
	var se *StepError
	if errors.As(o.err, &se) {
		retryAfter = se.RetryAfter
	}
	switch {
	case class == GaveWay:
		d.verdict, d.msg = verdictGaveWay, o.err.Error()
	case class == NotReady && !o.limit.IsZero() && !o.now.Before(o.limit):
		d.verdict, d.failCode = verdictFail, "not_ready_timeout"
		d.msg = fmt.Sprintf("not ready until %s: %v", o.limit.UTC().Format(time.RFC3339), o.err)
	case class == NotReady:
		if retryAfter <= 0 {
			retryAfter = o.notReadyRetry
		}
		d.verdict, d.due = verdictWait, o.now.Add(retryAfter)
		if !o.limit.IsZero() && d.due.After(o.limit) {
			d.due = o.limit
		}
	case o.forward && errors.Is(o.err, ErrDeadline):
		d.verdict, d.failCode, d.msg = verdictFail, "deadline", o.err.Error()
	case class == Permanent:
		d.verdict, d.msg = verdictFail, o.err.Error()
	case o.attempts >= o.policy.MaxAttempts:
		d.verdict, d.msg = verdictFail, fmt.Sprintf("gave up after %d attempts: %v", o.attempts, o.err)
	default:
		d.backoff = retryAfter
		if d.backoff <= 0 {
			d.backoff = o.backoff()
		}
		d.verdict, d.due = verdictRetry, o.now.Add(d.backoff)
		if !o.limit.IsZero() && d.due.After(o.limit) {
			reason := "retry would pass max_elapsed"
			if !o.deadline.IsZero() && !d.due.Before(o.deadline) {
				reason = "retry would pass the mission deadline"
			}
			d.verdict, d.msg = verdictFail, fmt.Sprintf("%s: %v", reason, o.err)
		}
	}
	return d
}

// outcomeOf decides the outcome of attempt r of a step (forward) or of
// its compensation, spending no attempt on a not-ready one.
func (d *Driver) outcomeOf(t *txn, r *StepResult, policy RetryPolicy, err error, forward bool) decision {
	p := policy.WithDefaults()
	if c, _ := Classify(err); err != nil && c == NotReady {
		r.Attempts-- // not-ready waits spend no attempt
		r.Waits++
	}
	dm := t.m
	if !forward {
		dm = &Mission{} // no deadline
	}
	class, _ := Classify(err)
	o := attemptOutcome{
		err: err, attempts: r.Attempts, policy: p, forward: forward, now: t.now,
		limit:         d.waitLimit(dm, r.Started, p, err != nil && class == NotReady),
		notReadyRetry: d.opts.NotReadyRetry,
		backoff:       func() time.Duration { return d.jitter(p, r.Attempts+1) },
	}
	if forward {
		o.deadline = t.m.Meta.Deadline
	}
	return decide(o)
}

// stepOutcome applies a forward step's result: its outputs, or decide's
// verdict on its failure.
func (d *Driver) stepOutcome(t *txn, k int, policy RetryPolicy, out map[string]any, err error, elapsed time.Duration, log stepLog) {
	m := t.m
	r := &m.Results[k]
	r.Duration += Duration(elapsed)
	m.Lease = Lease{}
	dec := d.outcomeOf(t, r, policy, err, true)
	recordStep(r, dec, out, err, t.now)
	switch dec.verdict {
	case verdictDone:
		if len(out) > 0 {
			if m.Context.Values == nil {
				m.Context.Values = make(map[string]any, len(out))
			}
			maps.Copy(m.Context.Values, cloneValues(out))
		}
		_ = t.fire(InStepOK, k, "")
		return
	case verdictWait:
		// Waiting is not failing: the step goes back to "not started" and
		// the mission rests in RUNNING until due or woken.
		m.Due, r.Due = r.Due, time.Time{}
		m.Control.Wait = true
		m.Control.WaitFor, r.WaitFor = r.WaitFor, ""
		_ = t.fire(InStepWait, k, "until "+dec.due.UTC().Format(time.RFC3339Nano))
		t.annotate(err.Error(), dec.code)
		log.Info("step not ready; waiting", "err", err, "until", dec.due)
		return
	}
	_ = t.fire(InStepError, k, dec.class.String())
	t.annotate(err.Error(), dec.code)
	switch dec.verdict {
	case verdictGaveWay:
		m.Due = time.Time{}
		m.Control.Wait, m.Control.WaitFor = false, ""
		_, m.Progress.Step = GroupBounds(m.Steps, k)
		_ = t.fire(InNext, k, dec.code)
	case verdictFail:
		d.stepFailed(t, k, dec.msg, dec.failCode)
	default:
		// A retry's backoff; a Wake of what its error names (a command's
		// ack, come late) ends it early.
		m.Due, r.Due = r.Due, time.Time{}
		m.Control.WaitFor, r.WaitFor = r.WaitFor, ""
		t.events[len(t.events)-1].Backoff = Duration(dec.backoff)
		log.Info("step failed; retrying", "err", err, "backoff", dec.backoff)
	}
}

// recordStep records the outcome of an attempt of step (or branch) r:
// done, given way, failed for good, or to be tried again (waiting) at
// r.Due, woken by r.WaitFor for a not-ready wait. A group's branch keeps
// those; a single step moves them to the mission.
func recordStep(r *StepResult, dec decision, out map[string]any, err error, now time.Time) {
	r.Due, r.WaitFor = time.Time{}, ""
	switch dec.verdict {
	case verdictDone:
		r.Status = StepSucceeded
		r.Outputs = out
		r.Error, r.Code = "", ""
		r.Finished = now
	case verdictGaveWay:
		gaveWay(r, dec, now)
	case verdictFail:
		r.Status = StepFailed
		r.Finished = now
		r.Error, r.Code = dec.msg, dec.failCode
	default:
		r.Error, r.Code = err.Error(), dec.code
		r.Status = StepWaiting
		r.Due = dec.due
		r.WaitFor = waitKey(err)
	}
}

// gaveWay records a step (or undo) that gave way to another mission.
func gaveWay(r *StepResult, dec decision, now time.Time) {
	r.Status = StepSkipped
	if dec.code == CodeSuperseded {
		r.Status = StepSuperseded
	}
	r.Error, r.Code = dec.msg, dec.code
	r.Finished = now
}

// waitLimit is the latest time the step may still be retried or waited
// for: the earlier of its max_elapsed and the mission deadline. A
// not-ready wait with neither is bounded by Options.MaxWait; retries
// are bounded by max_attempts anyway.
func (d *Driver) waitLimit(m *Mission, started time.Time, p RetryPolicy, notReady bool) time.Time {
	var limit time.Time
	if p.MaxElapsed > 0 {
		limit = started.Add(p.MaxElapsed.D())
	}
	if dl := m.Meta.Deadline; !dl.IsZero() && (limit.IsZero() || dl.Before(limit)) {
		limit = dl
	}
	if limit.IsZero() && notReady {
		limit = started.Add(d.opts.MaxWait)
	}
	return limit
}

// stepFailed gives up on step k: skip it (continue_on_error) or stop
// the mission.
func (d *Driver) stepFailed(t *txn, k int, msg, code string) {
	m := t.m
	r := &m.Results[k]
	r.Status = StepFailed
	r.Finished = t.now
	r.Error, r.Code = msg, code
	m.Due = time.Time{}
	m.Control.Wait, m.Control.WaitFor = false, ""
	if m.Steps[k].ContinueOnError {
		_, m.Progress.Step = GroupBounds(m.Steps, k)
		_ = t.fire(InNext, k, "continue_on_error: "+msg)
		return
	}
	reason := "step_failed"
	if code == "deadline" {
		reason = "deadline"
	}
	_ = d.stop(t, StateFailed, reason, fmt.Sprintf("step %s failed: %s", m.Steps[k].ID, msg))
}

// compOutcome applies a compensation's result: decide's verdict as for
// a forward step, but a compensation that fails for good does not stop
// the mission: the next one is tried (undo is best effort, recorded).
func (d *Driver) compOutcome(t *txn, j int, policy RetryPolicy, out map[string]any, err error, elapsed time.Duration, log stepLog) {
	m := t.m
	u := &m.Undo[j]
	u.Duration += Duration(elapsed)
	m.Lease = Lease{}
	dec := d.outcomeOf(t, u, policy, err, false)
	detail, over := recordUndo(m, j, dec, out, err, t.now, log)
	if over {
		m.Progress.Undo = j - 1
		m.Control.Wait, m.Control.WaitFor = false, ""
	} else {
		// A not-ready wait, or a retry's backoff that a late ack ends.
		m.Control.WaitFor, u.WaitFor = u.WaitFor, ""
		m.Control.Wait = dec.verdict == verdictWait
	}
	m.Due, u.Due = u.Due, time.Time{}
	_ = t.fire(InCompResult, j, detail)
	undoEvent(t, dec, u)
}

// recordUndo records the outcome of an attempt to undo step j in
// m.Undo[j] (and m.Results[j], m.Error) and returns the comp_result
// detail, and whether the undo is over. A wait or retry is due at
// Undo[j].Due, woken by Undo[j].WaitFor; a group's branch keeps them
// there, a single step moves them to the mission.
func recordUndo(m *Mission, j int, dec decision, out map[string]any, err error, now time.Time, log stepLog) (string, bool) {
	u := &m.Undo[j]
	recordStep(u, dec, out, err, now)
	switch dec.verdict {
	case verdictDone:
		m.Results[j].Status = StepCompensated
		return "compensated", true
	case verdictGaveWay:
		// Left alone: a newer mission has changed the device since.
		m.Results[j].Status = StepSuperseded
		return "left alone", true
	case verdictFail:
		u.Code = dec.code // the cause's code, as the undo's result has always had it
		m.Error += fmt.Sprintf("; compensation of %s failed: %s", m.Steps[j].ID, dec.msg)
		log.Warn("compensation failed", "err", dec.msg)
		return "compensation failed", true
	case verdictWait:
		return "not_ready", false
	}
	return "retry", false
}

// undoEvent completes the comp_result event just recorded: the wait
// before a retry, and the error of an undo that did not succeed.
func undoEvent(t *txn, dec decision, u *StepResult) {
	switch dec.verdict {
	case verdictDone:
		return
	case verdictRetry:
		t.events[len(t.events)-1].Backoff = Duration(dec.backoff)
	}
	t.annotate(u.Error, dec.code)
}

// expire takes a mission away from a worker whose handler outlived its
// timeout and lease grace (a zombie that ignores its context): the
// attempt counts as failed (retryable, code lease_expired) under the
// step's retry policy, the worker's slot is given back, and the zombie's
// outcome is dropped if it ever returns.
func (d *Driver) expire(e *entry, gen uint64, lease Lease, comp bool, idx int, policy RetryPolicy, started time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	d.mu.Lock()
	stale := e.gen != gen || !e.running
	d.mu.Unlock()
	if stale {
		return
	}
	t := d.begin(e)
	if t.m.Lease.Owner != lease.Owner || !t.m.Lease.Expires.Equal(lease.Expires) {
		return
	}
	if (comp && t.m.State != StateCompensating) || (!comp && t.m.State != StateStepRunning) {
		return
	}
	log := stepLog{l: d.log, mission: t.m.ID, trace: t.m.Meta.TraceID, step: t.m.Steps[idx].ID}
	err := RetryableError("lease_expired", fmt.Errorf("%w: the handler ignored its timeout and was abandoned", ErrStepTimeout))
	elapsed := t.now.Sub(started)
	if comp {
		d.compOutcome(t, idx, policy, nil, err, elapsed, log)
	} else {
		d.stepOutcome(t, idx, policy, nil, err, elapsed, log)
	}
	act, serr := d.settle(t)
	if serr != nil {
		log.Error("settle after lease expiry", "err", serr)
		return
	}
	if d.commit(e, t) != nil {
		return
	}
	d.mu.Lock()
	e.gen++
	e.running = false
	e.idle = act != actRest
	d.running-- // the zombie keeps its goroutine, not its slot
	d.zombies++
	d.placeLocked(e, t.now)
	if d.draining {
		select {
		case d.drained <- struct{}{}:
		default:
		}
	}
	d.mu.Unlock()
	log.Warn("step lease expired: the handler ignored its timeout; counted as a failed attempt")
	d.signal()
}

// waitKey is what a not-ready step waits for, or what ends a retry's
// backoff early, from its error.
func waitKey(err error) string {
	var se *StepError
	if errors.As(err, &se) {
		return se.WaitFor
	}
	return ""
}

// stepLog is a logger with a step's attributes, which it builds only
// when a record is logged: slog's With would format them, and even a
// list of them costs allocations, for every step.
type stepLog struct {
	l                          *slog.Logger
	mission, trace, step, kind string
	attempt                    int // with kind, omitted when kind is ""
}

func (s stepLog) with(args []any) []any {
	attrs := make([]any, 0, 10+len(args))
	attrs = append(attrs, "mission", s.mission, "trace", s.trace, "step", s.step)
	if s.kind != "" {
		attrs = append(attrs, "kind", s.kind, "attempt", s.attempt)
	}
	return append(attrs, args...)
}

func (s stepLog) Info(msg string, args ...any)  { s.l.Info(msg, s.with(args)...) }
func (s stepLog) Warn(msg string, args ...any)  { s.l.Warn(msg, s.with(args)...) }
func (s stepLog) Error(msg string, args ...any) { s.l.Error(msg, s.with(args)...) }

// cancelMessage is the error a cancelled mission records: the reason
// given to CancelFor, else what.
func cancelMessage(m *Mission, what string) string {
	if m.Control.CancelReason != "" {
		return "cancelled: " + m.Control.CancelReason
	}
	return what
}
