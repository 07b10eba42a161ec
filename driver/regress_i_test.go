package driver

import (
	"errors"
	"testing"
	"time"
)

// Options.MaxWait is documented to bound not-ready waiting, and
// RetryPolicy.MaxElapsed zero as "no bound beyond the mission deadline",
// but waitLimit applies MaxWait to ordinary retries too.
func TestReviewMaxWaitCapsRetries(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{})
	sc.do["a"] = func(req StepRequest) (map[string]any, error) { return nil, errors.New("flaky") }
	st := steps("a")
	st[0].Retry = RetryPolicy{MaxAttempts: 20, InitialBackoff: Duration(2 * time.Minute), MaxBackoff: Duration(5 * time.Minute)}
	m := submit(t, d, Spec{Type: "t", Steps: st})
	drain(t, d, clk)
	got := get(t, d, m.ID)
	t.Logf("state %s attempts %d error %q", got.State, got.Results[0].Attempts, got.Results[0].Error)
	if got.Results[0].Attempts < 20 {
		t.Errorf("gave up after %d of 20 attempts with no max_elapsed and no deadline", got.Results[0].Attempts)
	}
}
