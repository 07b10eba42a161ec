package driver

import (
	"testing"
	"time"
)

// A mission whose last step succeeds with the commit at (or just after)
// the deadline succeeds: all steps done beats late. Found by review H:
// settle checked "late" before "all steps done", so the mission ended
// FAILED and its completed steps were compensated.
func TestCompletionAtDeadlineSucceeds(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{})
	sc.do["b"] = func(req StepRequest) (map[string]any, error) {
		clk.AdvanceTo(req.Deadline) // the device acked just as time ran out
		return nil, nil
	}
	m := submit(t, d, Spec{Type: "t", Steps: steps("a!", "b"), Timeout: 10 * time.Second})
	clk.Advance(5 * time.Second)
	drain(t, d, clk)
	if got := get(t, d, m.ID); got.State != StateSucceeded {
		t.Errorf("every step succeeded, mission ended %s (reason %q, trace %v)", got.State, got.Reason, sc.trace())
	}
}
