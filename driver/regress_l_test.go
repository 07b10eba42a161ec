package driver

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A compensation woken early from a not-ready wait succeeds, but m.Due
// keeps the old wake time, so the next compensation waits for it.
func TestReviewCompensationStaleDue(t *testing.T) {
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
		d.Step(context.Background())
	}
	online = true
	d.Wake("dev")
	d.Step(context.Background()) // b/undo succeeds
	d.Step(context.Background()) // a/undo should be due now
	t.Logf("trace %v, state %s, next wake in %v", sc.trace(), get(t, d, m.ID).State, d.NextWake().Sub(clk.Now()))
	if got := get(t, d, m.ID); got.State != StateFailed {
		t.Errorf("a/undo waits for the stale not-ready due time of b/undo")
	}
	_ = time.Second
}
