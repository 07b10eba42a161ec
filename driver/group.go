package driver

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Group inputs: a group's begin and end are transitions of the mission;
// what happens to each branch in between is recorded with the step
// inputs (InBeginStep, InStepOK, InStepError, InStepWait, InCompBegin,
// InCompResult) on events whose Group is set and whose From equals To.
const (
	InGroupBegin Input = "group_begin" // the branches of a parallel group are about to run
	InGroupOK    Input = "group_ok"    // the group ended as its policy counts a success
	InGroupFail  Input = "group_fail"  // the group ended as its policy counts a failure
)

// GroupBounds returns the bounds [g0, g1) of the parallel group step k
// of steps belongs to, or k, k+1 for a step in no group.
func GroupBounds(steps []Step, k int) (int, int) {
	if k < 0 || k >= len(steps) || steps[k].Group == nil {
		return k, k + 1
	}
	id := steps[k].Group.ID
	g0, g1 := k, k+1
	for g0 > 0 && steps[g0-1].Group != nil && steps[g0-1].Group.ID == id {
		g0--
	}
	for g1 < len(steps) && steps[g1].Group != nil && steps[g1].Group.ID == id {
		g1++
	}
	return g0, g1
}

// validateGroups checks that each group's branches are consecutive and
// agree on the group's policy.
func validateGroups(steps []Step) error {
	ended := make(map[string]bool)
	for i := 0; i < len(steps); {
		g := steps[i].Group
		if g == nil {
			i++
			continue
		}
		if err := ValidateID(fmt.Sprintf("step %d group id", i), g.ID); err != nil {
			return err
		}
		if ended[g.ID] {
			return fmt.Errorf("%w: the branches of group %q are not consecutive", ErrInvalid, g.ID)
		}
		ended[g.ID] = true
		_, g1 := GroupBounds(steps, i)
		for k := i; k < g1; k++ {
			if *steps[k].Group != *g {
				return fmt.Errorf("%w: step %q disagrees with step %q on group %q's policy", ErrInvalid, steps[k].ID, steps[i].ID, g.ID)
			}
		}
		n := g1 - i
		switch g.Policy {
		case "", PolicyAll, PolicyBestEffort:
			if g.Quorum != 0 {
				return fmt.Errorf("%w: group %q sets a quorum but its policy is %q", ErrInvalid, g.ID, g.policy())
			}
		case PolicyQuorum:
			if g.Quorum < 1 || g.Quorum > n {
				return fmt.Errorf("%w: group %q: quorum %d is outside 1..%d (its branches)", ErrInvalid, g.ID, g.Quorum, n)
			}
		default:
			return fmt.Errorf("%w: group %q: policy %q is not all, best_effort or quorum", ErrInvalid, g.ID, g.Policy)
		}
		i = g1
	}
	return nil
}

func (g *Group) policy() Policy {
	if g.Policy == "" {
		return PolicyAll
	}
	return g.Policy
}

// inGroup reports whether m is inside a group: running its branches
// forward, or undoing them.
func inGroup(m *Mission) bool {
	switch m.State {
	case StateStepRunning:
		return m.Progress.Step < len(m.Steps) && m.Steps[m.Progress.Step].Group != nil
	case StateCompensating:
		j := m.Progress.Undo
		return j >= 0 && j < len(m.Steps) && m.Steps[j].Group != nil
	}
	return false
}

// tally counts a group's branches by how they stand.
type tally struct {
	n, ok, failed, hard int // hard: failed branches the policy does not forgive
	gaveWay             int // superseded or skipped: ended, neither ok nor failed
	running, open       int // open: not begun, or waiting to be tried again
	firstErr            string
}

func countGroup(m *Mission, g0, g1 int) tally {
	var c tally
	for k := g0; k < g1; k++ {
		r := m.Results[k]
		c.n++
		switch r.Status {
		case StepSucceeded, StepCompensated:
			c.ok++
		case StepSuperseded, StepSkipped:
			c.gaveWay++
		case StepFailed:
			c.failed++
			if m.Steps[k].Group.policy() == PolicyAll && !m.Steps[k].ContinueOnError {
				c.hard++
			}
			if c.firstErr == "" {
				c.firstErr = fmt.Sprintf("%s: %s", m.Steps[k].ID, r.Error)
			}
		case StepRunning:
			c.running++
		case StepPending, StepWaiting:
			c.open++
		}
	}
	return c
}

// failing says that the group can no longer succeed under its policy:
// nothing new of it begins, and once no branch runs it fails.
func (c tally) failing(g *Group) bool {
	switch g.policy() {
	case PolicyQuorum:
		return c.n-c.failed-c.gaveWay < g.Quorum
	case PolicyBestEffort:
		return false
	}
	return c.hard > 0
}

// groupPlan is what a group's worker does in one turn.
type groupPlan struct {
	g0, g1 int
	comp   bool
	// begin are branches to begin: not begun yet, or waiting and due.
	begin []int
	// fresh are branches begun but not executing: begun this turn, or
	// before a restart.
	fresh []int
	// resume are parked attempts woken or due; abandon are attempts
	// parked before their effect began that the group gives up.
	resume, abandon []*parking
	// end says no branch runs and none will begin: the group is over.
	end bool
	// next is when to look again if nothing is to do now; keys are what
	// the group waits for.
	next time.Time
	keys []string
}

func (p *groupPlan) busy() bool {
	return len(p.begin) > 0 || len(p.fresh) > 0 || len(p.resume) > 0 || len(p.abandon) > 0 || p.end
}

func (p *groupPlan) at(t time.Time) {
	if !t.IsZero() && (p.next.IsZero() || t.Before(p.next)) {
		p.next = t
	}
}

// undoable says whether branch k of a group being undone is one to undo.
func undoable(m *Mission, k int) bool {
	r := m.Results[k].Status
	return m.Steps[k].Compensate != nil && (r == StepSucceeded || r == StepCompensated) &&
		k < len(m.Undo)
}

// scanGroup plans a turn of the group m is in. It reads e's parks, so
// d.mu is held; it changes nothing.
func (d *Driver) scanGroup(e *entry, m *Mission, now time.Time) groupPlan {
	var p groupPlan
	p.g0, p.g1, p.comp = groupSpan(m)
	draining := d.draining || d.stopping
	stopped := draining
	// learn says the group fails, and nothing else stops it: a branch
	// whose ack timed out is still tried again (its command may be on
	// the device: the same key is acked again), so that, done, it is
	// undone with the rest rather than left as the mission ends.
	learn := false
	if !p.comp {
		dl := m.Meta.Deadline
		late := !dl.IsZero() && !now.Before(dl)
		g := m.Steps[p.g0].Group
		halted := m.Control.Cancel || m.Control.Pause || late
		failing := countGroup(m, p.g0, p.g1).failing(g)
		learn = failing && !halted && !draining
		stopped = stopped || halted || failing
		if !stopped {
			p.at(dl)
		}
	}
	running, open, learning := 0, 0, 0
	for k := p.g0; k < p.g1; k++ {
		r := m.Results[k]
		if p.comp {
			if !undoable(m, k) {
				continue
			}
			r = m.Undo[k]
		}
		switch r.Status {
		case StepRunning:
			running++
			pk := e.bparks[k]
			switch {
			case pk == nil && !draining:
				p.fresh = append(p.fresh, k)
			case pk == nil:
				// left for the next start
			case stopped && !draining && !pk.inFlight:
				// Its effect has not started: given up, woken or not, so
				// that a cancelled run sends nothing more.
				p.abandon = append(p.abandon, pk)
			case draining && !pk.inFlight:
				// Left for the next start: a stopping driver starts nothing.
			case pk.p.Woken || !now.Before(pk.p.Until):
				p.resume = append(p.resume, pk)
			default:
				p.at(pk.p.Until)
				if pk.p.Key != "" {
					p.keys = append(p.keys, pk.p.Key)
				}
			}
		case "", StepPending:
			open++
			if !stopped {
				p.begin = append(p.begin, k)
			}
		case StepWaiting:
			open++
			if stopped {
				if !learn || r.Code != CodeAckTimeout {
					continue
				}
				learning++
			}
			if !now.Before(r.Due) || e.bwoken[k] {
				p.begin = append(p.begin, k)
				continue
			}
			p.at(r.Due)
			if r.WaitFor != "" {
				p.keys = append(p.keys, r.WaitFor)
			}
		}
	}
	p.end = running == 0 && (open == 0 || stopped && !draining && learning == 0)
	return p
}

// placeGroupLocked files a group's entry: due now if its worker has
// something to do, else at the earliest park, wait or deadline, and
// under every key a branch waits for. d.mu is held.
func (d *Driver) placeGroupLocked(e *entry, now time.Time) {
	for _, pk := range e.bparks {
		if pk.p.Key != "" && d.lastWake[pk.p.Key] > e.ranSince {
			pk.p.Woken = true // woken while the worker ran
		}
	}
	// Likewise a branch that began to wait for a key woken meanwhile.
	e.wakeWaiting(func(key string) bool { return d.lastWake[key] > e.ranSince })
	p := d.scanGroup(e, e.m, now)
	d.fileLocked(e, p.keys...)
	e.wake = p.next
	sleeping := p.next.IsZero()
	if p.busy() {
		e.wake, sleeping = now, false
	}
	d.sched.place(e, now, sleeping)
}

// wakeGroupLocked marks what of e's group waits for key. d.mu is held.
func (d *Driver) wakeGroupLocked(e *entry, key string) {
	for _, pk := range e.bparks {
		if pk.p.Key == key {
			pk.p.Woken = true
		}
	}
	e.wakeWaiting(func(k string) bool { return k == key })
}

// wakeWaiting marks woken the branches of e's group (forward, or being
// undone) that wait for a key woken says was. Driver.mu is held.
func (e *entry) wakeWaiting(woken func(key string) bool) {
	m := e.m
	if !inGroup(m) {
		return
	}
	g0, g1, comp := groupSpan(m)
	for k := g0; k < g1; k++ {
		if r := branchResult(m, k, comp); r.Status == StepWaiting && r.WaitFor != "" && woken(r.WaitFor) {
			if e.bwoken == nil {
				e.bwoken = make(map[int]bool)
			}
			e.bwoken[k] = true
		}
	}
}

// groupSpan is the group m is in (see inGroup): its bounds, and whether
// it is being undone.
func groupSpan(m *Mission) (g0, g1 int, comp bool) {
	comp = m.State == StateCompensating
	g0, g1 = GroupBounds(m.Steps, m.Progress.Step)
	if comp {
		g0, g1 = GroupBounds(m.Steps, m.Progress.Undo)
	}
	return g0, g1, comp
}

// beginGroup starts the group at the mission's current step; its
// worker begins the branches.
func (d *Driver) beginGroup(t *txn) error {
	m := t.m
	if m.Meta.Started.IsZero() {
		m.Meta.Started = t.now
	}
	g0, g1 := GroupBounds(m.Steps, m.Progress.Step)
	m.Control.Wait, m.Control.WaitFor = false, ""
	m.Due = time.Time{}
	m.Lease = d.groupLease(m, g0, g1, t.now)
	g := m.Steps[g0].Group
	pol := string(g.policy())
	if g.Quorum > 0 {
		pol += fmt.Sprintf(" %d of %d", g.Quorum, g1-g0)
	}
	if err := t.fire(InGroupBegin, g0, fmt.Sprintf("group %s: %d branches, policy %s", g.ID, g1-g0, pol)); err != nil {
		return err
	}
	t.events[len(t.events)-1].Group = g.ID
	return nil
}

// groupLease covers the longest attempt of any of the group's branches.
func (d *Driver) groupLease(m *Mission, g0, g1 int, now time.Time) Lease {
	longest := time.Duration(0)
	for k := g0; k < g1; k++ {
		longest = max(longest, d.stepTimeout(m, k, m.State == StateCompensating))
	}
	return Lease{Owner: d.opts.Owner, Expires: now.Add(longest + d.opts.LeaseGrace)}
}

// branchEvent records what happened to branch k: not a transition.
func (t *txn) branchEvent(in Input, k, attempt int, detail string) {
	t.m.Seq++
	s := t.m.Steps[k]
	t.events = append(t.events, Event{
		MissionID: t.m.ID, Seq: t.m.Seq, Type: t.m.Type, TraceID: t.m.Meta.TraceID,
		Input: in, From: t.m.State, To: t.m.State, Step: k, StepID: s.ID, Attempt: attempt,
		Time: t.now, Detail: detail, Group: s.Group.ID,
	})
}

// branchResult is branch k's forward result or undo, as the group runs.
func branchResult(m *Mission, k int, comp bool) *StepResult {
	if comp {
		return &m.Undo[k]
	}
	return &m.Results[k]
}

// beginBranch begins an attempt of branch k (write-ahead).
func (t *txn) beginBranch(k int, comp bool) {
	r := branchResult(t.m, k, comp)
	if r.Started.IsZero() {
		r.Started = t.now
	}
	r.Attempts++
	r.Status = StepRunning
	r.Due, r.WaitFor = time.Time{}, ""
	if comp {
		t.branchEvent(InCompBegin, k, r.Attempts, "compensating "+t.m.Steps[k].ID)
		return
	}
	t.branchEvent(InBeginStep, k, r.Attempts, "")
}

// takeBackBranch undoes the begin of an attempt given up before its
// effect started.
func takeBackBranch(m *Mission, k int, comp bool) {
	r := branchResult(m, k, comp)
	r.Attempts--
	r.Status = StepPending
	if r.Attempts > 0 {
		r.Status = StepWaiting
	}
}

// branchRun is one handler call of a group's turn and what it gave.
type branchRun struct {
	k       int
	park    *parking // the parked attempt resumed; nil for a fresh one
	abandon bool
	out     map[string]any
	err     error
	pend    *parking // set when the attempt parks
	elapsed time.Duration
	policy  RetryPolicy
}

// advanceGroup runs one turn of the group e's mission is in: it begins
// the branches that are due (one commit, write-ahead), calls each
// branch's handler in this worker (fresh attempts, resumed parks, parks
// given up), files the attempts that park, and commits the outcomes
// together; when no branch runs and none will begin, it ends the group
// and settles what comes next in the same commit. Handlers must not
// block, as everywhere: the branches of a group share one worker (one
// that ignores its timeout is given up, see guardedCall).
func (d *Driver) advanceGroup(e *entry, gen uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	t := d.begin(e)
	m := t.m
	if !inGroup(m) {
		return
	}
	if m.Lease.Owner != d.opts.Owner {
		// An empty lease is a group whose undo was just decided: nothing
		// of it has run. Another's is a group that was running when its
		// driver stopped: its begun branches run again, same keys.
		g0, g1 := GroupBounds(m.Steps, d.current(m))
		owner := m.Lease.Owner
		m.Lease = d.groupLease(m, g0, g1, t.now)
		t.dirty = true
		if owner != "" {
			if err := t.fire(InRecover, d.current(m), "lease of "+owner+" taken over"); err != nil {
				d.refused(missionLog(d.log, m), "recover group", err)
				return
			}
		}
	}
	d.mu.Lock()
	e.idle = false // a group's begun branches are taken back by abandon, not unbegin
	plan := d.scanGroup(e, m, t.now)
	for _, pk := range plan.resume {
		d.unparkBranchLocked(e, pk.idx)
	}
	for _, pk := range plan.abandon {
		d.unparkBranchLocked(e, pk.idx)
	}
	for _, k := range plan.begin {
		delete(e.bwoken, k)
	}
	e.ranSince = d.wakes
	d.mu.Unlock()
	for _, k := range plan.begin {
		t.beginBranch(k, plan.comp)
	}
	if len(plan.begin) > 0 {
		g0, g1 := plan.g0, plan.g1
		m.Lease = d.groupLease(m, g0, g1, t.now)
	}
	if len(t.events) > 0 || t.dirty {
		if d.commit(e, t) != nil {
			d.reparkLocked(e, plan)
			return
		}
	}
	runs := make([]branchRun, 0, len(plan.begin)+len(plan.fresh)+len(plan.resume)+len(plan.abandon))
	for _, k := range append(plan.fresh, plan.begin...) {
		runs = append(runs, branchRun{k: k})
	}
	for _, pk := range plan.resume {
		runs = append(runs, branchRun{k: pk.idx, park: pk})
	}
	for _, pk := range plan.abandon {
		runs = append(runs, branchRun{k: pk.idx, park: pk, abandon: true})
	}
	if len(runs) > 0 {
		e.mu.Unlock()
		d.mu.Lock()
		snap := e.m
		d.mu.Unlock()
		for i := range runs {
			d.runBranch(snap, &runs[i], plan.comp)
		}
		e.mu.Lock()
	}
	d.mu.Lock()
	lost := e.gen != gen
	d.mu.Unlock()
	if lost || d.runCtx.Err() != nil {
		return // stopped past its grace: begun branches are re-executed at the next start
	}
	t = d.begin(e)
	for i := range runs {
		if err := d.applyBranch(e, t, &runs[i], plan.comp); err != nil {
			d.refused(missionLog(d.log, t.m), "a branch's outcome", err)
			return
		}
	}
	d.mu.Lock()
	after := d.scanGroup(e, t.m, t.now)
	d.mu.Unlock()
	act := actRest
	if after.end {
		d.mu.Lock()
		clear(e.bwoken) // the next group's branches start with none
		d.mu.Unlock()
		if err := d.endGroup(t, after); err != nil {
			d.refused(missionLog(d.log, t.m), "end group", err)
			return
		}
		var err error
		if act, err = d.settle(t); err != nil {
			d.refused(missionLog(d.log, t.m), "settle after group", err)
			return
		}
	}
	if len(t.events) == 0 && !t.dirty {
		return
	}
	if d.commit(e, t) != nil {
		return
	}
	if act == actExec || act == actCompExc {
		d.mu.Lock()
		e.idle = true // the next step is begun and waits for a worker
		d.mu.Unlock()
	}
}

// reparkLocked puts back the parks a turn took, when its begin commit
// failed. e.mu is held.
func (d *Driver) reparkLocked(e *entry, plan groupPlan) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, pk := range append(plan.resume, plan.abandon...) {
		d.parkBranchLocked(e, pk)
	}
}

// runBranch calls branch r.k's handler: a fresh attempt, a parked one
// resumed, or a parked one given up.
func (d *Driver) runBranch(m *Mission, r *branchRun, comp bool) {
	req, policy := stepRequest(m, r.k, comp)
	r.policy = policy
	res := branchResult(m, r.k, comp)
	req.Attempt = res.Attempts
	now := d.clock.Now()
	d.mu.Lock()
	h := d.handlers[req.Kind]
	d.mu.Unlock()
	if r.abandon {
		p := r.park.p
		p.Abandon = true
		req.Deadline, req.Resume = r.park.deadline, &p
		_, _ = d.run(h, req, resumeFloor) // told to let go; what it answers changes nothing
		return
	}
	var start, deadline time.Time
	if r.park != nil {
		start, deadline = r.park.p.Since, r.park.deadline
		p := r.park.p
		p.InFlight = r.park.inFlight
		req.Resume = &p
	} else {
		start, deadline = now, d.attemptDeadline(m, r.k, comp, now)
	}
	req.Deadline = deadline
	r.out, r.err = d.guardedCall(h, req, start, deadline)
	var pe *PendingError
	if errors.As(r.err, &pe) {
		r.pend = &parking{
			p:        Parked{Key: pe.Key, Until: pe.Until, Note: pe.Note, Out: pe.Out, Since: start},
			deadline: deadline, attempt: res.Attempts, comp: comp, idx: r.k, inFlight: pe.InFlight,
		}
		if r.pend.p.Until.IsZero() || r.pend.p.Until.After(deadline) {
			r.pend.p.Until = deadline
		}
	}
	r.elapsed = d.clock.Now().Sub(start)
}

// guardedCall is call in a goroutine of its own, given up once the
// attempt's deadline and the lease grace have passed: a branch handler
// that ignores its context would otherwise hold the mission's worker,
// and every branch of its group, for good. The attempt given up fails as
// lease_expired (retryable); the handler's goroutine is counted among
// the zombies until it returns, and what it returns is dropped.
func (d *Driver) guardedCall(h Handler, req StepRequest, start, deadline time.Time) (map[string]any, error) {
	type result struct {
		out map[string]any
		err error
	}
	var (
		mu    sync.Mutex
		state int // 0 running, 1 returned, 2 given up
	)
	ch := make(chan result, 1)
	go func() {
		out, err := d.call(h, req, start, deadline)
		mu.Lock()
		if state == 2 {
			d.mu.Lock()
			d.zombies--
			d.mu.Unlock()
		}
		state = 1
		mu.Unlock()
		ch <- result{out, err}
	}()
	expired := make(chan struct{})
	wait := max(deadline.Sub(d.clock.Now()), resumeFloor) + d.opts.LeaseGrace
	stop := d.clock.AfterFunc(wait, func() { close(expired) })
	defer stop()
	select {
	case r := <-ch:
		return r.out, r.err
	case <-expired:
	}
	mu.Lock()
	defer mu.Unlock()
	if state == 1 {
		r := <-ch // returned as the grace ran out
		return r.out, r.err
	}
	state = 2
	d.mu.Lock()
	d.zombies++
	d.mu.Unlock()
	d.log.Warn("branch handler ignored its timeout; the attempt is given up", "mission", req.MissionID, "step", req.StepID)
	return nil, RetryableError("lease_expired", fmt.Errorf("%w: the handler ignored its timeout and was abandoned", ErrStepTimeout))
}

// call runs one attempt's handler call until its deadline. A handler
// still pending at (or past) the deadline gets its last word, resumed
// at its time, so that it can let go of what it holds (a sent command's
// slot, a queued turn); an attempt still pending after that has timed
// out. A pending error returned is one of an attempt to park.
func (d *Driver) call(h Handler, req StepRequest, start, deadline time.Time) (map[string]any, error) {
	timeout := deadline.Sub(d.clock.Now())
	if req.Resume != nil && timeout < resumeFloor {
		timeout = resumeFloor
	}
	out, err := d.run(h, req, timeout)
	var pe *PendingError
	if errors.As(err, &pe) && !d.clock.Now().Before(deadline) {
		last := req
		last.Resume = &Parked{Key: pe.Key, Until: deadline, Note: pe.Note, Out: pe.Out, Since: start, InFlight: pe.InFlight}
		out, err = d.run(h, last, resumeFloor)
		if errors.As(err, &pe) {
			// The pending error is text here, not wrapped: this attempt is
			// no longer pending, and nothing may take it for one.
			err = RetryableError("timeout", fmt.Errorf("%w: still waiting after %s (%s)", ErrStepTimeout, deadline.Sub(start).Round(time.Millisecond), pe.Error()))
		}
	}
	return out, err
}

// applyBranch records a branch's handler call on t: its park, its
// outcome, or the take-back of an attempt given up. e.mu is held.
func (d *Driver) applyBranch(e *entry, t *txn, r *branchRun, comp bool) error {
	m := t.m
	res := branchResult(m, r.k, comp)
	if res.Status != StepRunning {
		return nil
	}
	if r.abandon {
		takeBackBranch(m, r.k, comp)
		t.dirty = true
		return nil
	}
	if r.pend != nil {
		d.mu.Lock()
		d.parkBranchLocked(e, r.pend)
		d.mu.Unlock()
		return nil
	}
	log := stepLog{l: d.log, mission: m.ID, trace: m.Meta.TraceID, step: m.Steps[r.k].ID}
	return d.outcome(t, r.k, comp, true, r.policy, r.out, r.err, r.elapsed, log)
}

// endGroup ends the group no branch of which runs any more: the undo
// of a group moves on to the steps before it; a forward group ends as
// its policy counts, or stops for the cancel, pause or deadline that
// ended it early.
func (d *Driver) endGroup(t *txn, p groupPlan) error {
	m := t.m
	m.Lease = Lease{}
	if p.comp {
		m.Progress.Undo = p.g0 - 1
		m.Due = time.Time{}
		t.dirty = true // no event, but the undo has moved on: commit it
		return nil
	}
	g := m.Steps[p.g0].Group
	c := countGroup(m, p.g0, p.g1)
	dl := m.Meta.Deadline
	switch {
	case m.Control.Cancel:
		return d.stop(t, StateCancelled, "cancelled", cancelMessage(m, "cancelled by request"))
	case c.failing(g):
		msg := fmt.Sprintf("group %s failed: %d of %d branches failed (first: %s)", g.ID, c.failed, c.n, c.firstErr)
		if g.policy() == PolicyQuorum {
			msg = fmt.Sprintf("group %s failed: %d of %d branches succeeded, quorum %d (first failure: %s)", g.ID, c.ok, c.n, g.Quorum, c.firstErr)
		}
		if err := t.fire(InGroupFail, p.g0, msg); err != nil {
			return err
		}
		t.events[len(t.events)-1].Group = g.ID
		return d.stop(t, StateFailed, "step_failed", msg)
	case c.open > 0 && !dl.IsZero() && !t.now.Before(dl):
		if err := t.fire(InGroupFail, p.g0, "deadline"); err != nil {
			return err
		}
		t.events[len(t.events)-1].Group = g.ID
		return d.stop(t, StateFailed, "deadline", fmt.Sprintf("%v at %s", ErrDeadline, dl.UTC().Format(time.RFC3339)))
	case c.open > 0 && m.Control.Pause:
		m.Control.Pause = false
		return t.fire(InPause, p.g0, "paused in group "+g.ID)
	case c.open > 0:
		return nil // stopping: the rest waits for the next start
	}
	detail := fmt.Sprintf("group %s: %d of %d branches succeeded", g.ID, c.ok, c.n)
	if c.failed > 0 {
		var failed []string
		for k := p.g0; k < p.g1; k++ {
			if m.Results[k].Status == StepFailed {
				failed = append(failed, m.Steps[k].ID)
			}
		}
		detail += "; failed: " + strings.Join(failed, ", ")
	}
	if err := t.fire(InGroupOK, p.g0, detail); err != nil {
		return err
	}
	t.events[len(t.events)-1].Group = g.ID
	return nil
}

// parkBranchLocked files a parked branch attempt. d.mu is held.
func (d *Driver) parkBranchLocked(e *entry, p *parking) {
	p.p.Woken = false
	if e.bparks == nil {
		e.bparks = make(map[int]*parking)
	}
	if old := e.bparks[p.idx]; old != nil {
		d.unparkBranchLocked(e, p.idx)
	}
	e.bparks[p.idx] = p
	d.parked++
	if p.inFlight {
		d.inFlight++
	}
}

// unparkBranchLocked takes branch k's park away. d.mu is held.
func (d *Driver) unparkBranchLocked(e *entry, k int) {
	p := e.bparks[k]
	if p == nil {
		return
	}
	d.parked--
	if p.inFlight {
		d.inFlight--
	}
	delete(e.bparks, k)
}

// hasInFlight says whether e has an attempt parked with its effect
// under way.
func (e *entry) hasInFlight() bool {
	if e.park != nil && e.park.inFlight {
		return true
	}
	for _, p := range e.bparks {
		if p.inFlight {
			return true
		}
	}
	return false
}
