package driver

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A Wake that comes while the step runs, between the handler's look at
// the device and its not-ready answer (a state report right behind an
// ack), is not lost: the step is due again at once, not after its retry
// interval.
func TestWakeWhileStepRunsIsKept(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{})
	calls := 0
	sc.do["a"] = func(StepRequest) (map[string]any, error) {
		calls++
		if calls == 1 {
			d.Wake("dev") // the report arrives before the handler returns
			return nil, WaitError("dev", "waiting_state", time.Minute, errors.New("not yet"))
		}
		return nil, nil
	}
	m := submit(t, d, Spec{Type: "t", Steps: steps("a")})
	step(t, d)
	if n := step(t, d); n != 1 {
		t.Fatalf("the step waits out its retry interval (advanced %d, next wake in %v)", n, d.NextWake().Sub(clk.Now()))
	}
	if got := get(t, d, m.ID); got.State != StateSucceeded {
		t.Fatalf("state %s, want SUCCEEDED", got.State)
	}
	// Another key's Wake during a run does not count.
	sc.do["b"] = func(StepRequest) (map[string]any, error) {
		d.Wake("other")
		return nil, WaitError("dev2", "waiting_state", time.Minute, errors.New("not yet"))
	}
	submit(t, d, Spec{Type: "t", Steps: steps("b")})
	step(t, d)
	if n := step(t, d); n != 0 {
		t.Fatalf("a Wake of another key woke the step (advanced %d)", n)
	}
}

// A Wake is kept for the waiting step even when a control op (here
// SetPriority) commits before the step runs again. Found by review J:
// e.woken was consumed by whichever transaction began next, so the
// control op ate it and the wake-up was lost.
func TestWakeSurvivesControlOp(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{})
	ready := false
	sc.do["a"] = func(req StepRequest) (map[string]any, error) {
		if !ready {
			return nil, WaitError("dev", "device_offline", time.Minute, errors.New("offline"))
		}
		return nil, nil
	}
	m := submit(t, d, Spec{Type: "t", Steps: steps("a")})
	step(t, d)
	ready = true
	d.Wake("dev") // the device came online
	if _, err := d.SetPriority(context.Background(), m.ID, 70); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	step(t, d)
	if got := get(t, d, m.ID); got.State != StateSucceeded {
		t.Errorf("after Wake the step was not retried: %s (next wake %v)", got.State, d.NextWake().Sub(clk.Now()))
	}
}

// Device chatter does not grow a not-ready step's timeline: the agent
// calls Wake on every state report, and a delay woken early is not
// re-run and recorded each time. Found by review K: every Wake re-ran
// every not-ready step and committed two events.
func TestWakeChatterDoesNotGrowTimeline(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{})
	sc.do["wait"] = func(req StepRequest) (map[string]any, error) { // like scenes.DelayHandler
		if rem := req.Started.Add(2 * time.Minute).Sub(clk.Now()); rem > 0 {
			return nil, NotReadyError("delay", rem, errors.New("left"))
		}
		return nil, nil
	}
	m := submit(t, d, Spec{Type: "t", Steps: steps("wait")})
	step(t, d)
	for range 120 { // a sensor reporting once a second
		clk.Advance(time.Second)
		d.Wake("sensor")
		step(t, d)
	}
	drain(t, d, clk)
	evs, err := d.Timeline(context.Background(), m.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) > 20 {
		got := get(t, d, m.ID)
		t.Errorf("timeline grows with device chatter: %d events, %d waits for one 2-minute delay (state %s)",
			len(evs), got.Results[0].Waits, got.State)
	}
}

// A compensation woken early from a not-ready wait that then succeeds
// leaves no stale due time: the next compensation is due at once. Found
// by review L: m.Due kept the old wake time and the next compensation
// waited for it.
func TestWokenCompensationLeavesNoStaleDue(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{})
	online := false
	sc.do["b/undo"] = func(req StepRequest) (map[string]any, error) {
		if !online {
			return nil, WaitError("dev", "device_offline", 0, errors.New("offline"))
		}
		return nil, nil
	}
	sc.do["c"] = func(req StepRequest) (map[string]any, error) { return nil, PermanentError("x", errors.New("x")) }
	m := submit(t, d, Spec{Type: "t", Steps: steps("a!", "b!", "c")})
	for range 5 {
		step(t, d)
	}
	online = true
	d.Wake("dev")
	step(t, d) // b/undo succeeds
	step(t, d) // a/undo should be due now
	if got := get(t, d, m.ID); got.State != StateFailed {
		t.Errorf("a/undo waits for the stale not-ready due time of b/undo: state %s, trace %v, next wake in %v",
			got.State, sc.trace(), d.NextWake().Sub(clk.Now()))
	}
}

// A retry's backoff ends at a Wake of the key its error names: a
// command's ack that came after the attempt gave up makes the retry go
// at once, not when the backoff runs out. Other keys do not.
func TestWakeEndsRetryBackoffOfItsKey(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{})
	calls := 0
	sc.do["a"] = func(StepRequest) (map[string]any, error) {
		if calls++; calls == 1 {
			return nil, &StepError{Class: Retryable, Code: "ack_timeout", WaitFor: "ack/cmd-1", Err: ErrAckTimeout}
		}
		return map[string]any{"ok": true}, nil
	}
	st := steps("a")
	st[0].Retry = RetryPolicy{MaxAttempts: 3, InitialBackoff: Duration(time.Hour)}
	m := submit(t, d, Spec{Type: "t", Steps: st})
	step(t, d)
	got := get(t, d, m.ID)
	eq(t, "state after the timeout", got.State, StateStepFailed)
	eq(t, "retry key", got.Control.WaitFor, "ack/cmd-1")
	d.Wake("ack/other")
	eq(t, "steps run after another key's wake", step(t, d), 0)
	d.Wake("ack/cmd-1")
	step(t, d)
	got = get(t, d, m.ID)
	eq(t, "state after the late ack's wake", got.State, StateSucceeded)
	eq(t, "attempts", got.Results[0].Attempts, 2)
	eq(t, "clock", clk.Now().Sub(got.Meta.Created) < time.Hour, true)
	eq(t, "control after", got.Control.WaitFor, "")
	drain(t, d, clk)
}
