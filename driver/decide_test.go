package driver

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestDecide is the table of what an attempt's outcome leads to, for a
// forward step and for a compensation.
func TestDecide(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	policy := RetryPolicy{MaxAttempts: 3}.WithDefaults()
	busy := RetryableError("busy", errors.New("busy"))
	slow := &StepError{Class: Retryable, Code: "busy", RetryAfter: 5 * time.Second, Err: errors.New("busy, try in 5s")}
	offline := WaitError("lamp", "device_offline", time.Second, errors.New("offline"))
	jammed := PermanentError("jammed", errors.New("jammed"))
	for _, c := range []struct {
		name    string
		o       attemptOutcome
		verdict verdict
		due     time.Duration // after now, for wait and retry
		code    string        // failCode, for fail
		msg     string        // in msg, for fail
	}{
		{name: "success", o: attemptOutcome{}, verdict: verdictDone},
		{name: "retryable, attempts left", o: attemptOutcome{err: busy, attempts: 1}, verdict: verdictRetry, due: 200 * time.Millisecond},
		{name: "retryable names its wait", o: attemptOutcome{err: slow, attempts: 1}, verdict: verdictRetry, due: 5 * time.Second},
		{name: "retryable, attempts spent", o: attemptOutcome{err: busy, attempts: 3}, verdict: verdictFail, code: "busy", msg: "gave up after 3 attempts"},
		{name: "permanent", o: attemptOutcome{err: jammed, attempts: 1}, verdict: verdictFail, code: "jammed", msg: "jammed"},
		{name: "gave way, attempts spent", o: attemptOutcome{err: SupersededError(errors.New("newer")), attempts: 3}, verdict: verdictGaveWay},
		{name: "gave way past the deadline", o: attemptOutcome{err: SkippedError(errors.New("held")), forward: true, limit: now, deadline: now}, verdict: verdictGaveWay},
		{name: "not ready waits its retry-after", o: attemptOutcome{err: offline, limit: now.Add(time.Minute)}, verdict: verdictWait, due: time.Second},
		{name: "not ready waits no later than its limit", o: attemptOutcome{err: offline, limit: now.Add(300 * time.Millisecond)}, verdict: verdictWait, due: 300 * time.Millisecond},
		{name: "not ready past its limit", o: attemptOutcome{err: offline, limit: now}, verdict: verdictFail, code: "not_ready_timeout", msg: "not ready until"},
		{name: "not ready without a retry-after", o: attemptOutcome{err: NotReadyError("x", 0, errors.New("x")), limit: now.Add(time.Hour)}, verdict: verdictWait, due: 7 * time.Second},
		{name: "retry past max_elapsed", o: attemptOutcome{err: slow, attempts: 1, limit: now.Add(time.Second)}, verdict: verdictFail, code: "busy", msg: "retry would pass max_elapsed"},
		{name: "forward retry past the deadline", o: attemptOutcome{err: slow, attempts: 1, forward: true, limit: now.Add(time.Second), deadline: now.Add(time.Second)}, verdict: verdictFail, code: "busy", msg: "retry would pass the mission deadline"},
		{name: "forward step out of time", o: attemptOutcome{err: ErrDeadline, attempts: 1, forward: true}, verdict: verdictFail, code: "deadline", msg: "deadline"},
		{name: "compensation out of the mission's time retries", o: attemptOutcome{err: ErrDeadline, attempts: 1}, verdict: verdictRetry, due: 200 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := c.o
			o.now, o.notReadyRetry = now, 7*time.Second
			if o.policy.MaxAttempts == 0 {
				o.policy = policy
			}
			o.backoff = func() time.Duration { return 200 * time.Millisecond }
			d := decide(o)
			if d.verdict != c.verdict {
				t.Fatalf("verdict %d, want %d (%+v)", d.verdict, c.verdict, d)
			}
			switch d.verdict {
			case verdictWait, verdictRetry:
				if got := d.due.Sub(now); got != c.due {
					t.Errorf("due in %v, want %v", got, c.due)
				}
			case verdictFail:
				if d.failCode != c.code || !strings.Contains(d.msg, c.msg) {
					t.Errorf("fail %q %q, want code %q and a message with %q", d.failCode, d.msg, c.code, c.msg)
				}
			}
		})
	}
}

// TestCompensationRetryHonoursRetryAfter: a compensation refused as busy
// with a time to come back is retried then, as a forward step would be,
// not after the policy's backoff (before the outcome code was merged,
// compensation ignored it).
func TestCompensationRetryHonoursRetryAfter(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{})
	sc.do["b"] = func(StepRequest) (map[string]any, error) { return nil, PermanentError("broken", errors.New("broken")) }
	tries := 0
	sc.do["a/undo"] = func(StepRequest) (map[string]any, error) {
		tries++
		if tries == 1 {
			return nil, &StepError{Class: Retryable, Code: "busy", RetryAfter: 3 * time.Second, Err: errors.New("busy")}
		}
		return nil, nil
	}
	m := submit(t, d, Spec{Type: "t", Steps: steps("a!", "b")})
	drainUntil(t, d, clk, func() bool { return tries == 1 })
	start := clk.Now()
	drainUntil(t, d, clk, func() bool { return tries == 2 })
	if waited := clk.Now().Sub(start); waited != 3*time.Second {
		t.Errorf("compensation retried after %v, want the 3s its error asked for", waited)
	}
	drain(t, d, clk)
	if got := get(t, d, m.ID); got.State != StateFailed || got.Results[0].Status != StepCompensated {
		t.Fatalf("%s %+v, want FAILED with a compensated", got.State, got.Results[0])
	}
}

// TestRefusedTransitionIsReturnedAndCounted: an outcome whose event the
// state table has no edge for (here a step's result for a mission no
// longer running it) comes back as the table's error rather than being
// dropped, for a single step and a compensation alike, and a refusal
// reported is counted in the queue stats.
func TestRefusedTransitionIsReturnedAndCounted(t *testing.T) {
	d, clk, _, _ := fixture(t, Options{})
	m := &Mission{ID: "m", State: StateRunning, Steps: steps("a"), Results: make([]StepResult, 1), Undo: make([]StepResult, 1)}
	for _, comp := range []bool{false, true} {
		tx := &txn{m: m.Clone(), now: clk.Now()}
		err := d.outcome(tx, 0, comp, false, RetryPolicy{}, nil, nil, 0, missionLog(d.log, m))
		if te := (*TransitionError)(nil); !errors.As(err, &te) || te.From != StateRunning {
			t.Fatalf("comp %v: outcome in RUNNING = %v, want a TransitionError from RUNNING", comp, err)
		}
		d.refused(missionLog(d.log, m), "test", err)
	}
	if got := d.Queue().Refused; got != 2 {
		t.Errorf("Queue().Refused = %d, want 2", got)
	}
}
