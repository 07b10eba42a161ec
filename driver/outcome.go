package driver

// What an attempt's outcome leads to (decide), and the one path that
// applies it to a single step or a group's branch (stepOutcome,
// compOutcome).

import (
	"errors"
	"fmt"
	"maps"
	"time"
)

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

// stepOutcome applies the outcome of an attempt of forward step k:
// decide's verdict, recorded on the step's result with its event. It is
// the one path for a single step and for a group's branch (branch set);
// they differ only where the outcome lands. A single step's events are
// transitions of the mission through the state table, and its wait,
// retry or failure become the mission's (its due time, its wait, its
// next step or its stop); a branch's events are not transitions, and
// its wait or retry stay its own (Results[k].Due, WaitFor) for the
// group to schedule, which also counts its failure. An error is a
// transition the state table refused: a bug, which the caller reports.
func (d *Driver) stepOutcome(t *txn, k int, branch bool, policy RetryPolicy, out map[string]any, err error, elapsed time.Duration, log stepLog) error {
	m := t.m
	r := &m.Results[k]
	r.Duration += Duration(elapsed)
	if !branch {
		m.Lease = Lease{} // a group's lease is the group's
	}
	dec := d.outcomeOf(t, r, policy, err, true)
	recordStep(r, dec, out, err, t.now)
	event := func(in Input, detail string) error {
		if branch {
			t.branchEvent(in, k, r.Attempts, detail)
			return nil
		}
		return t.fire(in, k, detail)
	}
	switch dec.verdict {
	case verdictDone:
		if len(out) > 0 && !branch {
			if m.Context.Values == nil {
				m.Context.Values = make(map[string]any, len(out))
			}
			maps.Copy(m.Context.Values, cloneValues(out))
		}
		return event(InStepOK, "")
	case verdictWait:
		if !branch {
			// Waiting is not failing: the step goes back to "not started"
			// and the mission rests in RUNNING until due or woken.
			m.Due, r.Due = r.Due, time.Time{}
			m.Control.Wait = true
			m.Control.WaitFor, r.WaitFor = r.WaitFor, ""
		}
		if ferr := event(InStepWait, "until "+dec.due.UTC().Format(time.RFC3339Nano)); ferr != nil {
			return ferr
		}
		t.annotate(err.Error(), dec.code)
		if !branch {
			log.Info("step not ready; waiting", "err", err, "until", dec.due)
		}
		return nil
	}
	if ferr := event(InStepError, dec.class.String()); ferr != nil {
		return ferr
	}
	switch dec.verdict {
	case verdictGaveWay:
		t.annotate(err.Error(), dec.code)
		if branch {
			return nil
		}
		m.Due = time.Time{}
		m.Control.Wait, m.Control.WaitFor = false, ""
		_, m.Progress.Step = GroupBounds(m.Steps, k)
		return t.fire(InNext, k, dec.code)
	case verdictFail:
		if branch {
			// The branch's event carries why it failed for good; the
			// group's end carries the mission's failure, if any.
			t.annotate(dec.msg, dec.failCode)
			log.Warn("branch failed", "err", dec.msg)
			return nil
		}
		t.annotate(err.Error(), dec.code)
		return d.stepFailed(t, k, dec.msg, dec.failCode)
	default:
		// A retry's backoff; a Wake of what its error names (a command's
		// ack, come late) ends it early.
		t.annotate(err.Error(), dec.code)
		t.events[len(t.events)-1].Backoff = Duration(dec.backoff)
		if !branch {
			m.Due, r.Due = r.Due, time.Time{}
			m.Control.WaitFor, r.WaitFor = r.WaitFor, ""
			log.Info("step failed; retrying", "err", err, "backoff", dec.backoff)
		}
		return nil
	}
}

// outcome applies an attempt's outcome: stepOutcome's, or
// compOutcome's for an undo (comp).
func (d *Driver) outcome(t *txn, k int, comp, branch bool, policy RetryPolicy, out map[string]any, err error, elapsed time.Duration, log stepLog) error {
	if comp {
		return d.compOutcome(t, k, branch, policy, out, err, elapsed, log)
	}
	return d.stepOutcome(t, k, branch, policy, out, err, elapsed, log)
}

// refused reports a transition the state table refused, or an outcome
// that could not be applied: the driver asked for an edge its own table
// does not have, which is a bug. It is logged at error level and counted
// (QueueStats.Refused); the mission keeps its last committed state, and
// what a commit would have recorded is dropped.
func (d *Driver) refused(log stepLog, what string, err error) {
	d.mu.Lock()
	d.refusedN++
	d.mu.Unlock()
	log.Error("state table refused a transition (a bug): "+what+" dropped", "err", err)
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
func (d *Driver) stepFailed(t *txn, k int, msg, code string) error {
	m := t.m
	r := &m.Results[k]
	r.Status = StepFailed
	r.Finished = t.now
	r.Error, r.Code = msg, code
	m.Due = time.Time{}
	m.Control.Wait, m.Control.WaitFor = false, ""
	if m.Steps[k].ContinueOnError {
		_, m.Progress.Step = GroupBounds(m.Steps, k)
		return t.fire(InNext, k, "continue_on_error: "+msg)
	}
	reason := "step_failed"
	if code == "deadline" {
		reason = "deadline"
	}
	return d.stop(t, StateFailed, reason, fmt.Sprintf("step %s failed: %s", m.Steps[k].ID, msg))
}

// compOutcome applies the outcome of an attempt to undo step j, as
// stepOutcome does for a forward step, on the same one path for a single
// step and a group's branch: decide's verdict, but an undo that fails
// for good does not stop the mission (undo is best effort, recorded).
// A single undo's result moves the mission (the next undo, its wait);
// a branch's stays its own (Undo[j].Due, WaitFor).
func (d *Driver) compOutcome(t *txn, j int, branch bool, policy RetryPolicy, out map[string]any, err error, elapsed time.Duration, log stepLog) error {
	m := t.m
	u := &m.Undo[j]
	u.Duration += Duration(elapsed)
	if !branch {
		m.Lease = Lease{}
	}
	dec := d.outcomeOf(t, u, policy, err, false)
	detail, over := recordUndo(m, j, dec, out, err, t.now, log)
	if branch {
		t.branchEvent(InCompResult, j, u.Attempts, detail)
	} else {
		if over {
			m.Progress.Undo = j - 1
			m.Control.Wait, m.Control.WaitFor = false, ""
		} else {
			// A not-ready wait, or a retry's backoff that a late ack ends.
			m.Control.WaitFor, u.WaitFor = u.WaitFor, ""
			m.Control.Wait = dec.verdict == verdictWait
		}
		m.Due, u.Due = u.Due, time.Time{}
		if ferr := t.fire(InCompResult, j, detail); ferr != nil {
			return ferr
		}
	}
	undoEvent(t, dec, u)
	return nil
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

// waitKey is what a not-ready step waits for, or what ends a retry's
// backoff early, from its error.
func waitKey(err error) string {
	var se *StepError
	if errors.As(err, &se) {
		return se.WaitFor
	}
	return ""
}
