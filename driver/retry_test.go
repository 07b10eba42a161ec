package driver

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/internal/testkit"
)

// gateStore holds the first save of a FAILED mission until the test lets
// it proceed, so a control op can be lined up behind that commit.
type gateStore struct {
	*memStore
	once    sync.Once
	saving  chan struct{}
	proceed chan struct{}
}

func (s *gateStore) Save(ctx context.Context, m *Mission, evs []Event) error {
	if m.State == StateFailed {
		s.once.Do(func() { close(s.saving); <-s.proceed })
	}
	return s.memStore.Save(ctx, m, evs)
}

// A Retry that races with the commit making the mission FAILED leaves
// exactly one tracked entry, so the retried step never runs twice at
// once. Found by review C: control took the entry before the worker
// deleted it from d.entries and re-placed it in the scheduler; the
// orphan and the entry the next control op built were both dispatched.
func TestRetryRacingFailureCommitRunsStepOnce(t *testing.T) {
	st := &gateStore{memStore: newMemStore(t), saving: make(chan struct{}), proceed: make(chan struct{})}
	var calls, inFlight, peak atomic.Int32
	retried := make(chan struct{}, 4)
	release := make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, req StepRequest) (map[string]any, error) {
		n := calls.Add(1)
		if n == 1 {
			return nil, PermanentError("boom", errors.New("first run fails"))
		}
		raise(&peak, inFlight.Add(1))
		defer inFlight.Add(-1)
		retried <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil, nil
	})
	done := make(chan State, 4) // terminal states after the first failure
	d, err := New(Options{Store: st, Handlers: map[string]Handler{"test": h}, Workers: 4, StopGrace: time.Second,
		Observers: []Observer{ObserverFunc(func(ev Event, m *Mission) {
			if ev.To.Terminal() && ev.To != StateFailed {
				done <- ev.To
			}
		})}})
	if err != nil {
		t.Fatal(err)
	}
	start(t, d)
	m, _, err := d.Submit(context.Background(), Spec{Type: "t", Steps: steps("a")})
	if err != nil {
		t.Fatal(err)
	}
	<-st.saving // the worker holds e.mu, committing FAILED
	retryErr := make(chan error, 1)
	go func() { _, err := d.Retry(context.Background(), m.ID); retryErr <- err }()
	// Retry must have taken the entry and be blocked on e.mu: seen only
	// in the goroutines' stacks.
	testkit.Eventually(t, 10*time.Second, "Retry blocked on the entry's lock", func() bool {
		return testkit.GoroutineIn("(*Driver).lockEntry", "sync.(*Mutex).Lock")
	})
	close(st.proceed)
	if err := <-retryErr; err != nil {
		t.Fatalf("retry: %v", err)
	}
	// The retried step is running: the failing worker has handed the
	// entry back by then, whichever of it and Retry placed it last.
	<-retried
	d.mu.Lock()
	_, tracked := d.entries[m.ID]
	d.mu.Unlock()
	if !tracked {
		t.Errorf("retried mission is scheduled but not in d.entries (orphan entry)")
	}
	// A control op on the running mission must not build a second entry.
	if _, err := d.Cancel(context.Background(), m.ID); err != nil {
		t.Logf("cancel: %v", err)
	}
	close(release)
	<-done
	if err := d.Stop(context.Background()); err != nil { // waits for any duplicate run
		t.Fatalf("stop: %v", err)
	}
	if p := peak.Load(); p > 1 {
		t.Errorf("the retried step ran %d times concurrently (calls %d); timeline %s", p, calls.Load(), inputs(t, d, m.ID))
	}
}

// A failed attempt's step_error event carries the error class in Detail,
// which metrics and logs read. Found by review E: the detail was
// overwritten with the error text.
func TestStepErrorEventDetailIsErrorClass(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{})
	sc.do["a"] = func(req StepRequest) (map[string]any, error) {
		if req.Attempt < 3 {
			return nil, errors.New("flaky")
		}
		return nil, nil
	}
	m := submit(t, d, Spec{Type: "t", Steps: steps("a")})
	drain(t, d, clk)
	evs, err := d.Timeline(context.Background(), m.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		if ev.Input == InStepError {
			if ev.Detail != Retryable.String() {
				t.Errorf("InStepError Detail %q (code %q), want the error class %q", ev.Detail, ev.Code, Retryable)
			}
		}
	}
}

// Options.MaxWait bounds not-ready waiting only; ordinary retries with
// no RetryPolicy.MaxElapsed and no mission deadline use every attempt.
// Found by review I: waitLimit applied MaxWait to retries too.
func TestMaxWaitDoesNotCapRetries(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{})
	sc.do["a"] = func(req StepRequest) (map[string]any, error) { return nil, errors.New("flaky") }
	st := steps("a")
	st[0].Retry = RetryPolicy{MaxAttempts: 20, InitialBackoff: Duration(2 * time.Minute), MaxBackoff: Duration(5 * time.Minute)}
	m := submit(t, d, Spec{Type: "t", Steps: st})
	drain(t, d, clk)
	got := get(t, d, m.ID)
	if got.Results[0].Attempts < 20 {
		t.Errorf("gave up after %d of 20 attempts with no max_elapsed and no deadline (state %s, error %q)",
			got.Results[0].Attempts, got.State, got.Results[0].Error)
	}
}
