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
	d.Step(context.Background())
	if n, _ := d.Step(context.Background()); n != 1 {
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
	d.Step(context.Background())
	if n, _ := d.Step(context.Background()); n != 0 {
		t.Fatalf("a Wake of another key woke the step (advanced %d)", n)
	}
}
