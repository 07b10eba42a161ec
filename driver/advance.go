package driver

// advance takes a mission one step forward between executions: settle
// decides what comes next (start, pause, cancel, deadline, the next step
// or undo) and stop ends a mission, compensating first.

import (
	"errors"
	"fmt"
	"time"
)

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
		d.refused(missionLog(d.log, t.m), "settle mission", err)
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
				d.refused(missionLog(d.log, t.m), "recover mission", err)
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
		d.refused(missionLog(d.log, t.m), "abandon parked step", err)
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

// current is the step index an in-flight execution concerns.
func (d *Driver) current(m *Mission) int {
	if m.State == StateCompensating {
		return m.Progress.Undo
	}
	return m.Progress.Step
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

// cancelMessage is the error a cancelled mission records: the reason
// given to CancelFor, else what.
func cancelMessage(m *Mission, what string) string {
	if m.Control.CancelReason != "" {
		return "cancelled: " + m.Control.CancelReason
	}
	return what
}
