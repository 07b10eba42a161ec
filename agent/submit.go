package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/scenes"
)

// submit decides one decoded trigger and returns the reply to it: the
// mission a request ID already made, a rejection, or a new mission under
// the scene's mode. MQTT and HTTP triggers both end here, so they share
// idempotency and modes. It runs on one of the trigger workers.
func (t *Triggers) submit(ctx context.Context, tr scenes.Trigger) scenes.Reply {
	// Mode decisions read the scene's active runs and then change them,
	// and a re-sent request must find its first mission rather than be
	// judged as a second run: hold the scene's lock across all of it.
	// Parallel runs need no order (the store's request-key index still
	// makes concurrent duplicates one mission).
	// One catalog for the whole decision: a bundle applied meanwhile
	// is for the next trigger.
	cat := t.cat.Load()
	if info, ok := cat.Scene(tr.Scene); ok && info.Mode != scenes.ModeParallel {
		l := t.sceneLock(tr.Scene)
		l.Lock()
		defer l.Unlock()
	}
	// A re-sent request returns the mission it made, whatever its state.
	if m, err := t.driver.Lookup(ctx, tr.RequestID); err == nil {
		return t.accepted(tr, m, true)
	} else if ctx.Err() != nil {
		return t.shuttingDown(tr)
	} else if !errors.Is(err, driver.ErrNotFound) {
		t.log.Error("lookup request", "request", tr.RequestID, "err", err)
		return t.rejected(tr, scenes.ReasonInternal, "looking up the request failed")
	}
	if now := t.now(); !tr.NotAfter.IsZero() && now.After(tr.NotAfter) {
		return t.rejected(tr, scenes.ReasonDeadlinePassed, fmt.Sprintf("not_after was %s, %s before the agent got to it", tr.NotAfter.Format(time.RFC3339), now.Sub(tr.NotAfter).Round(time.Millisecond)))
	}
	spec, err := cat.Build(tr.Scene, tr.Params)
	if err != nil {
		return t.rejectedErr(tr, err, scenes.ReasonInvalidParam)
	}
	spec.RequestKey = tr.RequestID
	spec.Source = tr.Source
	// No gateway label: every mission of this store is this gateway's,
	// and the hub names the gateway by its topic. A label would cost
	// each live mission a map (~300 bytes) and each stored one its bytes.
	info, _ := cat.Scene(tr.Scene)
	var running []string // parallel runs ignore each other
	if info.Mode != scenes.ModeParallel {
		running = t.runs(tr.Scene)
	}
	switch info.Mode {
	case scenes.ModeSingle:
		if len(running) > 0 {
			return t.rejected(tr, scenes.ReasonAlreadyRunning, fmt.Sprintf("scene %s is already running as mission %s (mode single)", tr.Scene, running[0]))
		}
	case scenes.ModeRestart:
		// Cancelling only asks: a step in flight finishes and the run's
		// done steps are undone afterwards. The new run waits, held, until
		// every cancelled run has ended, so their undo cannot reverse it.
		for _, id := range running {
			m, err := t.driver.CancelFor(ctx, id, fmt.Sprintf("replaced by a new run of %s (restart mode, request %s)", tr.Scene, tr.RequestID))
			switch {
			case err == nil && !m.State.Terminal():
				spec.Hold = true
			case err != nil && !errors.Is(err, driver.ErrTerminal):
				t.log.Warn("restart: cancel previous run", "mission", id, "err", err)
				spec.Hold = true // still going: wait for it
			}
		}
	case scenes.ModeQueued:
		spec.Hold = len(running) > 0
	}
	m, created, err := t.driver.Submit(ctx, spec)
	if err != nil {
		reason := scenes.ReasonInternal
		switch {
		case errors.Is(err, driver.ErrClosed), ctx.Err() != nil:
			reason = scenes.ReasonShuttingDown
		case errors.Is(err, driver.ErrFull):
			return t.rejected(tr, scenes.ReasonOverloaded, fmt.Sprintf("%v; send the trigger again later with the same request_id", err))
		case errors.Is(err, driver.ErrInvalid):
			reason = scenes.ReasonInvalidParam
		}
		return t.rejected(tr, reason, err.Error())
	}
	return t.accepted(tr, m, !created)
}

// rejectedErr rejects for err, taking the reason and message from a
// *scenes.TriggerError when there is one and fallback otherwise.
func (t *Triggers) rejectedErr(tr scenes.Trigger, err error, fallback string) scenes.Reply {
	r := scenes.Rejection(tr.RequestID, tr.Scene, err, fallback)
	return t.rejected(tr, r.Reason, r.Message)
}

// rejected counts and logs a rejection and returns its reply.
func (t *Triggers) rejected(tr scenes.Trigger, reason, msg string) scenes.Reply {
	t.metrics.rejected(reason)
	t.log.Warn("trigger rejected", "request", tr.RequestID, "scene", tr.Scene, "source", tr.Source, "reason", reason, "detail", msg)
	return scenes.Reply{RequestID: tr.RequestID, Scene: tr.Scene, Status: scenes.StatusRejected, Reason: reason, Message: msg}
}

// accepted logs an acceptance and returns its reply.
func (t *Triggers) accepted(tr scenes.Trigger, m *driver.Mission, duplicate bool) scenes.Reply {
	t.log.Info("trigger accepted", "request", tr.RequestID, "scene", m.Type, "mission", m.ID, "trace", m.Meta.TraceID, "source", tr.Source, "duplicate", duplicate)
	return scenes.Reply{
		RequestID: tr.RequestID, Status: scenes.StatusAccepted, MissionID: m.ID, Scene: m.Type,
		State: m.State, Duplicate: duplicate,
	}
}

// Call hands a decoded trigger to the trigger workers and waits for
// its reply: the HTTP API's and the hub's way in. It fails with api.ErrOverloaded
// when the queue is full, and with ctx's error when ctx ends first (the
// trigger may still be decided later; its request ID makes a retry
// safe).
func (t *Triggers) Call(ctx context.Context, tr scenes.Trigger) (scenes.Reply, error) {
	return t.call(ctx, tr, viaAPI)
}

// call is Call for a trigger that came in via.
func (t *Triggers) call(ctx context.Context, tr scenes.Trigger, via string) (scenes.Reply, error) {
	return t.callJob(ctx, triggerJob{trigger: &tr, via: via})
}

// callJob queues j, a decoded trigger, and waits for its reply.
func (t *Triggers) callJob(ctx context.Context, j triggerJob) (scenes.Reply, error) {
	tr, via := *j.trigger, j.via
	done := make(chan scenes.Reply, 1)
	j.done = done
	t.stopMu.RLock()
	if t.stopped {
		t.stopMu.RUnlock()
		rep := t.shuttingDown(tr)
		t.traces.record(evaluation(via, tr, rep, t.now()))
		return rep, nil
	}
	select {
	case t.jobs <- j:
		t.stopMu.RUnlock()
	default:
		t.stopMu.RUnlock()
		t.metrics.rejected(scenes.ReasonOverloaded)
		t.traces.record(evaluation(via, tr, scenes.Reply{RequestID: tr.RequestID, Scene: tr.Scene, Status: scenes.StatusRejected,
			Reason: scenes.ReasonOverloaded, Message: "the trigger queue is full; send it again later with the same request_id"}, t.now()))
		return scenes.Reply{}, api.ErrOverloaded
	}
	select {
	case r := <-done:
		return r, nil
	case <-ctx.Done():
		return scenes.Reply{}, context.Cause(ctx)
	}
}
