package driver

import (
	"testing"
	"time"
)

// The last step succeeds; the commit of its outcome happens at (or just
// after) the deadline. settle checks "late" before "all steps done", so a
// mission whose every step succeeded ends FAILED and is compensated.
func TestReviewDeadlineBeatsCompletion(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{})
	sc.do["b"] = func(req StepRequest) (map[string]any, error) {
		clk.AdvanceTo(req.Deadline) // the device acked just as time ran out
		return nil, nil
	}
	m := submit(t, d, Spec{Type: "t", Steps: steps("a!", "b"), Timeout: 10 * time.Second})
	clk.Advance(5 * time.Second)
	drain(t, d, clk)
	got := get(t, d, m.ID)
	t.Logf("state %s reason %q trace %v results %v/%v", got.State, got.Reason, sc.trace(), got.Results[0].Status, got.Results[1].Status)
	if got.State != StateSucceeded {
		t.Errorf("every step succeeded, mission ended %s and undid step a", got.State)
	}
}
