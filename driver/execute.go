package driver

// execute runs one attempt of a begun step or undo: its request, time
// limits and lease, the handler call, a park for a pending outcome, and
// the expiry of a handler that outlives its lease.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strconv"
	"time"
)

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
	if oerr := d.outcome(t, idx, comp, false, policy, out, err, elapsed, log); oerr != nil {
		d.refused(log, "the step's outcome", oerr)
		return
	}
	act, serr := d.settle(t)
	if serr != nil {
		d.refused(log, "settle after step", serr)
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
	if oerr := d.outcome(t, idx, comp, false, policy, nil, err, elapsed, log); oerr != nil {
		d.refused(log, "the expired step's outcome", oerr)
		return
	}
	act, serr := d.settle(t)
	if serr != nil {
		d.refused(log, "settle after lease expiry", serr)
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

// missionLog is a stepLog for what concerns a mission, not one step.
func missionLog(l *slog.Logger, m *Mission) stepLog {
	return stepLog{l: l, mission: m.ID, trace: m.Meta.TraceID}
}

func (s stepLog) Info(msg string, args ...any)  { s.l.Info(msg, s.with(args)...) }
func (s stepLog) Warn(msg string, args ...any)  { s.l.Warn(msg, s.with(args)...) }
func (s stepLog) Error(msg string, args ...any) { s.l.Error(msg, s.with(args)...) }
