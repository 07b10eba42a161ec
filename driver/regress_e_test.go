package driver

import (
	"context"
	"errors"
	"testing"
)

func TestReviewStepErrorDetailIsOverwritten(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{})
	sc.do["a"] = func(req StepRequest) (map[string]any, error) {
		if req.Attempt < 3 {
			return nil, errors.New("flaky")
		}
		return nil, nil
	}
	m := submit(t, d, Spec{Type: "t", Steps: steps("a")})
	drain(t, d, clk)
	evs, _ := d.Timeline(context.Background(), m.ID)
	for _, ev := range evs {
		if ev.Input == InStepError {
			t.Logf("step_error event: Detail=%q Code=%q", ev.Detail, ev.Code)
			if ev.Detail != Retryable.String() {
				t.Errorf("InStepError Detail %q, but metrics and logs read it as the error class", ev.Detail)
			}
		}
	}
}
