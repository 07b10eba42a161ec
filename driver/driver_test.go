package driver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/internal/testkit"
)

// newFakeClock is the driver tests' manual clock, at a fixed evening.
func newFakeClock() *testkit.Clock {
	return testkit.NewClock(time.Date(2026, 11, 30, 18, 0, 0, 0, time.UTC))
}

// script is a handler whose behaviour per step ID is given by a function
// of the attempt number; it records every call.
type script struct {
	mu    sync.Mutex
	calls []StepRequest
	do    map[string]func(req StepRequest) (map[string]any, error)
}

func newScript() *script { return &script{do: map[string]func(StepRequest) (map[string]any, error){}} }

func (s *script) Execute(ctx context.Context, req StepRequest) (map[string]any, error) {
	s.mu.Lock()
	s.calls = append(s.calls, req)
	f := s.do[req.StepID]
	if req.Compensating {
		f = s.do[req.StepID+"/undo"]
	}
	s.mu.Unlock()
	if f == nil {
		return map[string]any{req.StepID: "done"}, nil
	}
	return f(req)
}

// trace returns "id" or "id/undo" for each call, in order.
func (s *script) trace() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, c := range s.calls {
		id := c.StepID
		if c.Compensating {
			id += "/undo"
		}
		out = append(out, id)
	}
	return out
}

func fixture(t *testing.T, opts Options) (*Driver, *testkit.Clock, *memStore, *script) {
	t.Helper()
	clk := newFakeClock()
	st := newMemStore(t)
	sc := newScript()
	opts.Store = st
	opts.Clock = clk
	opts.Seed = 1
	if opts.Handlers == nil {
		opts.Handlers = map[string]Handler{"test": sc}
	}
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return d, clk, st, sc
}

func steps(ids ...string) []Step {
	var out []Step
	for _, id := range ids {
		s := Step{ID: strings.TrimSuffix(id, "!"), Kind: "test", Retry: RetryPolicy{MaxAttempts: 3, InitialBackoff: Duration(100 * time.Millisecond), MaxBackoff: Duration(time.Second)}}
		if strings.HasSuffix(id, "!") { // "!" marks a compensable step
			s.Compensate = &Compensation{Kind: "test"}
		}
		out = append(out, s)
	}
	return out
}

func submit(t *testing.T, d *Driver, spec Spec) *Mission {
	t.Helper()
	m, created, err := d.Submit(context.Background(), spec)
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	if !created {
		t.Fatalf("submit: not created")
	}
	return m
}

// drain advances the driver synchronously, moving the fake clock to each
// next wake-up, until nothing is left to do.
func drain(t *testing.T, d *Driver, clk *testkit.Clock) {
	t.Helper()
	for range 100000 {
		n, err := d.Step(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			continue
		}
		w := d.NextWake()
		if w.IsZero() {
			return
		}
		clk.AdvanceTo(w)
	}
	t.Fatal("drain: driver did not settle")
}

// step advances what is due now, as Step does, and reports its error.
// It uses Error, not Fatal, because tests also call it from goroutines
// that block in a handler.
func step(t testing.TB, d *Driver) int {
	t.Helper()
	n, err := d.Step(context.Background())
	if err != nil {
		t.Error(err)
	}
	return n
}

// start starts d's loop and stops it when the test ends, reporting a
// Stop that had to cancel steps. Stop is idempotent, so a test may also
// stop d itself and check what Stop returns.
func start(t testing.TB, d *Driver) {
	t.Helper()
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Stop(context.Background()); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
}

func get(t *testing.T, d *Driver, id string) *Mission {
	t.Helper()
	m, err := d.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func inputs(t *testing.T, d *Driver, id string) string {
	t.Helper()
	evs, err := d.Timeline(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var parts []string
	for _, e := range evs {
		parts = append(parts, string(e.Input))
	}
	return strings.Join(parts, ",")
}

func eq(t *testing.T, what string, got, want any) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%s: got %v, want %v", what, got, want)
	}
}

func TestSuccess(t *testing.T) {
	d, clk, st, sc := fixture(t, Options{})
	sc.do["b"] = func(req StepRequest) (map[string]any, error) {
		if req.Context["a"] != "done" {
			return nil, PermanentError("", errors.New("b did not see a's output"))
		}
		return map[string]any{"b": 2}, nil
	}
	m := submit(t, d, Spec{Type: "go_home", Steps: steps("a", "b", "c"), Values: map[string]any{"temp": 24}})
	drain(t, d, clk)
	got := get(t, d, m.ID)
	eq(t, "state", got.State, StateSucceeded)
	eq(t, "trace", sc.trace(), []string{"a", "b", "c"})
	eq(t, "context b", got.Context.Values["b"], 2)
	eq(t, "context temp", got.Context.Values["temp"], 24)
	eq(t, "inputs", inputs(t, d, m.ID), "submit,start,begin_step,step_ok,next,begin_step,step_ok,next,begin_step,step_ok,next,complete")
	for i, r := range got.Results {
		if r.Status != StepSucceeded || r.Attempts != 1 {
			t.Errorf("result %d: %+v", i, r)
		}
	}
	if got.Meta.Finished.IsZero() || got.Meta.Started.IsZero() {
		t.Errorf("meta times not set: %+v", got.Meta)
	}
	// The creation commit starts the mission and begins its first step;
	// then one commit per step: the result of k with the begin of k+1.
	eq(t, "saves after create", st.saves, 3)
	keys := map[string]bool{}
	for _, c := range sc.calls {
		keys[c.IdempotencyKey] = true
	}
	eq(t, "distinct keys", len(keys), 3)
}

func TestRetryThenSuccessWithBackoff(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{})
	var keys []string
	sc.do["a"] = func(req StepRequest) (map[string]any, error) {
		keys = append(keys, req.IdempotencyKey)
		if req.Attempt < 3 {
			return nil, errors.New("busy")
		}
		return nil, nil
	}
	m := submit(t, d, Spec{Type: "t", Steps: steps("a")})
	start := clk.Now()
	if _, err := d.Step(context.Background()); err != nil {
		t.Fatal(err)
	}
	eq(t, "state after 1st failure", get(t, d, m.ID).State, StateStepFailed)
	eq(t, "first backoff", d.NextWake().Sub(start), 100*time.Millisecond)
	// Not due yet: nothing happens.
	clk.Advance(99 * time.Millisecond)
	if n := step(t, d); n != 0 {
		t.Fatalf("advanced %d missions before backoff elapsed", n)
	}
	clk.Advance(time.Millisecond)
	step(t, d)
	eq(t, "second backoff", d.NextWake().Sub(clk.Now()), 200*time.Millisecond)
	drain(t, d, clk)
	got := get(t, d, m.ID)
	eq(t, "state", got.State, StateSucceeded)
	eq(t, "attempts", got.Results[0].Attempts, 3)
	if keys[0] != keys[1] || keys[1] != keys[2] {
		t.Errorf("idempotency key changed across retries: %v", keys)
	}
}

func TestRetryExhausted(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{})
	sc.do["a"] = func(StepRequest) (map[string]any, error) { return nil, errors.New("busy") }
	m := submit(t, d, Spec{Type: "t", Steps: steps("a", "b")})
	drain(t, d, clk)
	got := get(t, d, m.ID)
	eq(t, "state", got.State, StateFailed)
	eq(t, "attempts", got.Results[0].Attempts, 3)
	eq(t, "b skipped", got.Results[1].Status, StepSkipped)
	if !strings.Contains(got.Error, "gave up after 3 attempts") {
		t.Errorf("error %q", got.Error)
	}
}

func TestPermanentFailsAtOnce(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{})
	sc.do["a"] = func(StepRequest) (map[string]any, error) {
		return nil, PermanentError("invalid_param", errors.New("target 40 above 30"))
	}
	m := submit(t, d, Spec{Type: "t", Steps: steps("a")})
	drain(t, d, clk)
	got := get(t, d, m.ID)
	eq(t, "state", got.State, StateFailed)
	eq(t, "attempts", got.Results[0].Attempts, 1)
	eq(t, "code", got.Results[0].Code, "invalid_param")
	eq(t, "reason", got.Reason, "step_failed")
}

func TestStepTimeout(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{StepTimeout: time.Second})
	started := make(chan struct{}, 3)
	sc.do["a"] = func(req StepRequest) (map[string]any, error) {
		if req.Attempt == 2 {
			return nil, nil
		}
		started <- struct{}{}
		return nil, errors.New("no answer") // returned only after the context ends
	}
	blocking := sc.do["a"]
	sc.do["a"] = func(req StepRequest) (map[string]any, error) {
		return blocking(req)
	}
	// Wrap to wait on ctx for the first attempt.
	h := HandlerFunc(func(ctx context.Context, req StepRequest) (map[string]any, error) {
		if req.Attempt == 1 {
			started <- struct{}{}
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return nil, nil
	})
	d.Register("test", h)
	m := submit(t, d, Spec{Type: "t", Steps: steps("a")})
	done := make(chan struct{})
	go func() { step(t, d); close(done) }()
	<-started
	clk.Advance(time.Second)
	<-done
	got := get(t, d, m.ID)
	eq(t, "state", got.State, StateStepFailed)
	eq(t, "code", got.Results[0].Code, "timeout")
	drain(t, d, clk)
	eq(t, "final", get(t, d, m.ID).State, StateSucceeded)
}

func TestNotReadyWaitsWithoutSpendingAttempts(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{NotReadyRetry: time.Minute})
	offline := true
	var mu sync.Mutex
	sc.do["a"] = func(StepRequest) (map[string]any, error) {
		mu.Lock()
		defer mu.Unlock()
		if offline {
			return nil, WaitError("light-1", "device_offline", 0, errors.New("light offline"))
		}
		return nil, nil
	}
	m := submit(t, d, Spec{Type: "t", Steps: steps("a")})
	for range 5 { // five waits; the policy allows 3 attempts
		step(t, d)
		clk.AdvanceTo(d.NextWake())
	}
	got := get(t, d, m.ID)
	eq(t, "state while waiting", got.State, StateRunning)
	eq(t, "step status while waiting", got.Results[0].Status, StepWaiting)
	eq(t, "attempts spent", got.Results[0].Attempts, 0)
	eq(t, "waits", got.Results[0].Waits, 5)
	// The device comes back: Wake makes the step due at once, without
	// waiting for the minute to pass.
	step(t, d)
	mu.Lock()
	offline = false
	mu.Unlock()
	d.Wake("another-device")
	if n := step(t, d); n != 0 {
		t.Fatalf("Wake of another key woke the mission (advanced %d)", n)
	}
	d.Wake("light-1")
	if n := step(t, d); n != 1 {
		t.Fatalf("Wake did not make the waiting mission due (advanced %d)", n)
	}
	got = get(t, d, m.ID)
	eq(t, "state", got.State, StateSucceeded)
	eq(t, "attempts", got.Results[0].Attempts, 1)
}

func TestNotReadyUntilDeadline(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{NotReadyRetry: time.Second})
	sc.do["a"] = func(StepRequest) (map[string]any, error) {
		return nil, NotReadyError("device_offline", 0, errors.New("offline"))
	}
	m := submit(t, d, Spec{Type: "t", Steps: steps("a"), Timeout: 10 * time.Second})
	drain(t, d, clk)
	got := get(t, d, m.ID)
	eq(t, "state", got.State, StateFailed)
	eq(t, "reason", got.Reason, "deadline")
}

func TestCompensationReverseOrderOnFailure(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{})
	sc.do["c"] = func(StepRequest) (map[string]any, error) {
		return nil, PermanentError("jammed", errors.New("lock jammed"))
	}
	var fwd map[string]any
	sc.do["a/undo"] = func(req StepRequest) (map[string]any, error) { fwd = req.Forward; return nil, nil }
	m := submit(t, d, Spec{Type: "t", Steps: steps("a!", "x", "b!", "c!", "d!")})
	drain(t, d, clk)
	got := get(t, d, m.ID)
	eq(t, "trace", sc.trace(), []string{"a", "x", "b", "c", "b/undo", "a/undo"})
	eq(t, "state", got.State, StateFailed)
	eq(t, "statuses", []StepStatus{got.Results[0].Status, got.Results[1].Status, got.Results[2].Status, got.Results[3].Status, got.Results[4].Status},
		[]StepStatus{StepCompensated, StepSucceeded, StepCompensated, StepFailed, StepSkipped})
	eq(t, "undo a", got.Undo[0].Status, StepSucceeded)
	eq(t, "forward outputs passed to compensation", fwd["a"], "done")
	if !strings.Contains(inputs(t, d, m.ID), "compensate,comp_begin,comp_result,comp_begin,comp_result,fail") {
		t.Errorf("timeline: %s", inputs(t, d, m.ID))
	}
}

func TestCompensationFailureRecorded(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{})
	sc.do["b"] = func(StepRequest) (map[string]any, error) { return nil, PermanentError("x", errors.New("boom")) }
	sc.do["a/undo"] = func(StepRequest) (map[string]any, error) { return nil, errors.New("busy") }
	m := submit(t, d, Spec{Type: "t", Steps: steps("a!", "b")})
	drain(t, d, clk)
	got := get(t, d, m.ID)
	eq(t, "state", got.State, StateFailed)
	eq(t, "undo status", got.Undo[0].Status, StepFailed)
	eq(t, "undo attempts", got.Undo[0].Attempts, 3)
	if !strings.Contains(got.Error, "compensation of a failed") {
		t.Errorf("error %q", got.Error)
	}
}

func TestCancelMidStepCompensates(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{})
	inB := make(chan struct{})
	release := make(chan struct{})
	sc.do["b"] = func(StepRequest) (map[string]any, error) {
		close(inB)
		<-release
		return nil, nil
	}
	m := submit(t, d, Spec{Type: "t", Steps: steps("a!", "b!", "c!")})
	step(t, d) // a
	done := make(chan struct{})
	go func() { step(t, d); close(done) }() // b, blocked
	<-inB
	cm, err := d.Cancel(context.Background(), m.ID)
	if err != nil {
		t.Fatal(err)
	}
	eq(t, "state during step", cm.State, StateStepRunning)
	eq(t, "cancel flag", cm.Control.Cancel, true)
	close(release)
	<-done
	drain(t, d, clk)
	got := get(t, d, m.ID)
	eq(t, "state", got.State, StateCancelled)
	eq(t, "trace", sc.trace(), []string{"a", "b", "b/undo", "a/undo"})
	eq(t, "reason", got.Reason, "cancelled")
}

func TestCancelPendingAndTerminal(t *testing.T) {
	d, clk, _, _ := fixture(t, Options{})
	m := submit(t, d, Spec{Type: "t", Steps: steps("a!")})
	got, err := d.Cancel(context.Background(), m.ID)
	if err != nil {
		t.Fatal(err)
	}
	eq(t, "state", got.State, StateCancelled)
	drain(t, d, clk)
	if _, err := d.Cancel(context.Background(), m.ID); !errors.Is(err, ErrTerminal) {
		t.Errorf("cancel terminal: %v, want ErrTerminal", err)
	}
	if _, err := d.Pause(context.Background(), m.ID); !errors.Is(err, ErrTerminal) {
		t.Errorf("pause terminal: %v, want ErrTerminal", err)
	}
	if _, err := d.Cancel(context.Background(), "nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("cancel unknown: %v, want ErrNotFound", err)
	}
}

func TestPauseResumeMidMission(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{})
	m := submit(t, d, Spec{Type: "t", Steps: steps("a", "b", "c")})
	step(t, d) // a done, b begun (write-ahead) but not run
	pm, err := d.Pause(context.Background(), m.ID)
	if err != nil {
		t.Fatal(err)
	}
	eq(t, "a step not yet run is taken back", pm.State, StatePaused)
	drain(t, d, clk)
	got := get(t, d, m.ID)
	eq(t, "state", got.State, StatePaused)
	eq(t, "trace", sc.trace(), []string{"a"})
	eq(t, "progress", got.Progress.Step, 1)
	eq(t, "b attempts", got.Results[1].Attempts, 0)
	if _, err := d.Resume(context.Background(), m.ID); err != nil {
		t.Fatal(err)
	}
	drain(t, d, clk)
	eq(t, "state", get(t, d, m.ID).State, StateSucceeded)
	eq(t, "trace", sc.trace(), []string{"a", "b", "c"})
	eq(t, "b attempts", get(t, d, m.ID).Results[1].Attempts, 1)
	if _, err := d.Resume(context.Background(), m.ID); !errors.Is(err, ErrTerminal) {
		t.Errorf("resume succeeded mission: %v, want ErrTerminal", err)
	}
}

func TestPauseWhileWaitingForRetry(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{})
	sc.do["a"] = func(req StepRequest) (map[string]any, error) {
		if req.Attempt == 1 {
			return nil, errors.New("busy")
		}
		return nil, nil
	}
	m := submit(t, d, Spec{Type: "t", Steps: steps("a")})
	step(t, d)
	pm, err := d.Pause(context.Background(), m.ID)
	if err != nil {
		t.Fatal(err)
	}
	eq(t, "state", pm.State, StatePaused)
	drain(t, d, clk)
	eq(t, "still paused", get(t, d, m.ID).State, StatePaused)
	if _, err := d.Resume(context.Background(), m.ID); err != nil {
		t.Fatal(err)
	}
	drain(t, d, clk)
	got := get(t, d, m.ID)
	eq(t, "state", got.State, StateSucceeded)
	eq(t, "attempts", got.Results[0].Attempts, 2)
}

func TestPriorityOrder(t *testing.T) {
	d, _, _, sc := fixture(t, Options{})
	low := submit(t, d, Spec{Type: "low", Priority: 10, Steps: steps("low")})
	high := submit(t, d, Spec{Type: "high", Priority: 90, Steps: steps("high")})
	mid := submit(t, d, Spec{Type: "mid", Priority: 50, Steps: steps("mid")})
	step(t, d)
	eq(t, "order", sc.trace(), []string{"high", "mid", "low"})
	// Reprioritise: low jumps ahead for its next step.
	_ = high
	_ = mid
	if _, err := d.SetPriority(context.Background(), low.ID, 101); !errors.Is(err, ErrInvalid) {
		t.Errorf("priority 101: %v", err)
	}
}

func TestSetPriorityReorders(t *testing.T) {
	d, _, _, sc := fixture(t, Options{})
	a := submit(t, d, Spec{Type: "a", Priority: 10, Steps: steps("a1", "a2")})
	submit(t, d, Spec{Type: "b", Priority: 50, Steps: steps("b1", "b2")})
	if _, err := d.SetPriority(context.Background(), a.ID, 60); err != nil {
		t.Fatal(err)
	}
	step(t, d)
	eq(t, "order", sc.trace(), []string{"a1", "b1"})
	if !strings.Contains(inputs(t, d, a.ID), "priority") {
		t.Errorf("priority change not on the timeline")
	}
}

func TestIdempotentSubmit(t *testing.T) {
	d, clk, _, _ := fixture(t, Options{})
	spec := Spec{Type: "go_home", Steps: steps("a"), RequestKey: "req-1"}
	m1 := submit(t, d, spec)
	m2, created, err := d.Submit(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if created || m2.ID != m1.ID {
		t.Fatalf("second submit: created=%v id=%s, want same mission %s", created, m2.ID, m1.ID)
	}
	drain(t, d, clk)
	m3, created, _ := d.Submit(context.Background(), spec)
	if created || m3.ID != m1.ID || m3.State != StateSucceeded {
		t.Fatalf("submit after finish: %v %s %s", created, m3.ID, m3.State)
	}
}

func TestSubmitRejectsBadSpecs(t *testing.T) {
	d, _, _, _ := fixture(t, Options{})
	cases := map[string]Spec{
		"no steps":      {Type: "t"},
		"no type":       {Steps: steps("a")},
		"slash in type": {Type: "a/b", Steps: steps("a")},
		"wildcard key":  {Type: "t", Steps: steps("a"), RequestKey: "x+y"},
		"dup step":      {Type: "t", Steps: steps("a", "a")},
		"unknown kind":  {Type: "t", Steps: []Step{{ID: "a", Kind: "nope"}}},
		"bad retry":     {Type: "t", Steps: []Step{{ID: "a", Kind: "test", Retry: RetryPolicy{Jitter: 2}}}},
		"priority":      {Type: "t", Steps: steps("a"), Priority: -1},
	}
	for name, spec := range cases {
		t.Run(name, func(t *testing.T) {
			if _, _, err := d.Submit(context.Background(), spec); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

func TestDeadline(t *testing.T) {
	t.Run("retry would pass deadline", func(t *testing.T) {
		d, clk, _, sc := fixture(t, Options{})
		sc.do["a"] = func(StepRequest) (map[string]any, error) { return nil, RetryableError("busy", errors.New("busy")) }
		st := steps("a")
		st[0].Retry.InitialBackoff = Duration(5 * time.Second)
		st[0].Retry.MaxBackoff = Duration(5 * time.Second)
		m := submit(t, d, Spec{Type: "t", Steps: st, Timeout: 2 * time.Second})
		drain(t, d, clk)
		got := get(t, d, m.ID)
		eq(t, "state", got.State, StateFailed)
		eq(t, "attempts", got.Results[0].Attempts, 1)
		if !strings.Contains(got.Error, "deadline") {
			t.Errorf("error %q does not say deadline", got.Error)
		}
	})
	t.Run("paused past deadline", func(t *testing.T) {
		d, clk, _, _ := fixture(t, Options{})
		m := submit(t, d, Spec{Type: "t", Steps: steps("a!", "b!"), Timeout: time.Minute})
		step(t, d)
		if _, err := d.Pause(context.Background(), m.ID); err != nil {
			t.Fatal(err)
		}
		step(t, d)
		eq(t, "paused", get(t, d, m.ID).State, StatePaused)
		drain(t, d, clk)
		got := get(t, d, m.ID)
		eq(t, "state", got.State, StateFailed)
		eq(t, "reason", got.Reason, "deadline")
		eq(t, "a compensated", got.Results[0].Status, StepCompensated)
	})
	t.Run("step context bounded by deadline", func(t *testing.T) {
		d, clk, _, _ := fixture(t, Options{StepTimeout: time.Hour})
		var dl time.Time
		d.Register("test", HandlerFunc(func(ctx context.Context, req StepRequest) (map[string]any, error) {
			dl = req.Deadline
			return nil, nil
		}))
		submit(t, d, Spec{Type: "t", Steps: steps("a"), Timeout: 3 * time.Second})
		start := clk.Now()
		drain(t, d, clk)
		eq(t, "attempt deadline", dl.Sub(start), 3*time.Second)
	})
}

func TestRetryFailedMission(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{})
	broken := true
	var keys []string
	sc.do["b"] = func(req StepRequest) (map[string]any, error) {
		keys = append(keys, req.IdempotencyKey)
		if broken {
			return nil, PermanentError("jammed", errors.New("jammed"))
		}
		return nil, nil
	}
	m := submit(t, d, Spec{Type: "t", Steps: steps("a!", "b", "c"), Timeout: time.Minute})
	drain(t, d, clk)
	eq(t, "failed", get(t, d, m.ID).State, StateFailed)
	broken = false
	clk.Advance(2 * time.Minute) // past the first deadline: retry gets a fresh budget
	rm, err := d.Retry(context.Background(), m.ID)
	if err != nil {
		t.Fatal(err)
	}
	eq(t, "retried state", rm.State, StateRunning)
	eq(t, "restart from compensated step", rm.Progress.Step, 0)
	drain(t, d, clk)
	got := get(t, d, m.ID)
	eq(t, "state", got.State, StateSucceeded)
	eq(t, "trace", sc.trace(), []string{"a", "b", "a/undo", "a", "b", "c"})
	if keys[0] == keys[1] {
		t.Errorf("retry reused the first run's idempotency key %s", keys[0])
	}
	if _, err := d.Retry(context.Background(), m.ID); !errors.Is(err, ErrTerminal) || !strings.Contains(err.Error(), "only a FAILED mission can be retried") {
		t.Errorf("retry succeeded mission: %v, want ErrTerminal saying what can be retried", err)
	}
}

func TestContinueOnError(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{})
	sc.do["music"] = func(StepRequest) (map[string]any, error) {
		return nil, PermanentError("x", errors.New("speaker broken"))
	}
	st := steps("light", "music", "ac")
	st[1].ContinueOnError = true
	m := submit(t, d, Spec{Type: "t", Steps: st})
	drain(t, d, clk)
	got := get(t, d, m.ID)
	eq(t, "state", got.State, StateSucceeded)
	eq(t, "reason", got.Reason, "completed_with_errors")
	eq(t, "trace", sc.trace(), []string{"light", "music", "ac"})
}

func TestHandlerPanicIsPermanentFailure(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{})
	sc.do["a"] = func(StepRequest) (map[string]any, error) { panic("boom") }
	m := submit(t, d, Spec{Type: "t", Steps: steps("a")})
	drain(t, d, clk)
	got := get(t, d, m.ID)
	eq(t, "state", got.State, StateFailed)
	eq(t, "code", got.Results[0].Code, "panic")
}

func TestSaveFailureDoesNotLoseMission(t *testing.T) {
	d, clk, st, _ := fixture(t, Options{})
	m := submit(t, d, Spec{Type: "t", Steps: steps("a", "b")})
	st.mu.Lock()
	st.failNext = errors.New("disk full")
	st.mu.Unlock()
	step(t, d)
	got := get(t, d, m.ID)
	eq(t, "unchanged after failed save", got.State, StateStepRunning)
	eq(t, "a not recorded", got.Results[0].Status, StepRunning)
	drain(t, d, clk)
	eq(t, "state", get(t, d, m.ID).State, StateSucceeded)
}

func TestMissionJSONRoundTrip(t *testing.T) {
	d, clk, _, _ := fixture(t, Options{})
	m := submit(t, d, Spec{Type: "t", Steps: steps("a!", "b"), Values: map[string]any{"n": 1.5}, Timeout: time.Hour})
	drain(t, d, clk)
	got := get(t, d, m.ID)
	b, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	var back Mission
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	b2, _ := json.Marshal(&back)
	if string(b) != string(b2) {
		t.Errorf("round trip differs:\n%s\n%s", b, b2)
	}
}

func TestHoldThenResume(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{})
	m := submit(t, d, Spec{Type: "t", Steps: steps("a"), Hold: true})
	eq(t, "held", m.State, StatePaused)
	drain(t, d, clk)
	eq(t, "nothing ran", len(sc.trace()), 0)
	if _, err := d.Resume(context.Background(), m.ID); err != nil {
		t.Fatal(err)
	}
	drain(t, d, clk)
	got := get(t, d, m.ID)
	eq(t, "state", got.State, StateSucceeded)
	if got.Meta.Started.IsZero() {
		t.Error("started time not set")
	}
}

func TestPauseWaitsForRunningStep(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{})
	inA := make(chan struct{})
	release := make(chan struct{})
	sc.do["a"] = func(StepRequest) (map[string]any, error) {
		close(inA)
		<-release
		return nil, nil
	}
	m := submit(t, d, Spec{Type: "t", Steps: steps("a", "b")})
	done := make(chan struct{})
	go func() { step(t, d); close(done) }()
	<-inA
	pm, err := d.Pause(context.Background(), m.ID)
	if err != nil {
		t.Fatal(err)
	}
	eq(t, "pause waits for the running step", pm.State, StateStepRunning)
	close(release)
	<-done
	drain(t, d, clk)
	got := get(t, d, m.ID)
	eq(t, "state", got.State, StatePaused)
	eq(t, "a done", got.Results[0].Status, StepSucceeded)
	eq(t, "trace", sc.trace(), []string{"a"})
}

func TestCancelBeforeFirstStepRuns(t *testing.T) {
	d, _, _, sc := fixture(t, Options{})
	m := submit(t, d, Spec{Type: "t", Steps: steps("a!", "b!")})
	eq(t, "begun at submit", m.State, StateStepRunning)
	got, err := d.Cancel(context.Background(), m.ID)
	if err != nil {
		t.Fatal(err)
	}
	eq(t, "state", got.State, StateCancelled)
	step(t, d)
	eq(t, "nothing ran", len(sc.trace()), 0)
	eq(t, "a skipped", get(t, d, m.ID).Results[0].Status, StepSkipped)
}

// TestStepTimeoutRealClock: with the system clock a step's context ends
// at its deadline, with ErrStepTimeout as the cause, and the attempt is
// recorded as a retryable timeout.
func TestStepTimeoutRealClock(t *testing.T) {
	var cause error
	var hasDeadline bool
	h := HandlerFunc(func(ctx context.Context, req StepRequest) (map[string]any, error) {
		_, hasDeadline = ctx.Deadline()
		<-ctx.Done()
		cause = context.Cause(ctx)
		return nil, ctx.Err()
	})
	d, err := New(Options{Store: newMemStore(t), Handlers: map[string]Handler{"test": h}, StepTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	m, _, err := d.Submit(context.Background(), Spec{Type: "t", Steps: steps("a")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Step(context.Background()); err != nil { // start, begin and run the step
		t.Fatal(err)
	}
	got := get(t, d, m.ID)
	if !hasDeadline || !errors.Is(cause, ErrStepTimeout) {
		t.Errorf("context: deadline %v, cause %v; want a deadline and ErrStepTimeout", hasDeadline, cause)
	}
	eq(t, "state", got.State, StateStepFailed)
	eq(t, "code", got.Results[0].Code, "timeout")
}

// MaxLive bounds what a burst of triggers holds in memory: a Submit past
// it creates nothing and says so, and a mission ending frees its place.
func TestSubmitBeyondMaxLiveIsRefusedUntilOneEnds(t *testing.T) {
	d, clk, st, _ := fixture(t, Options{MaxLive: 2})
	a := submit(t, d, Spec{Type: "t", Steps: steps("a"), RequestKey: "r1"})
	submit(t, d, Spec{Type: "t", Steps: steps("a"), RequestKey: "r2"})
	_, created, err := d.Submit(context.Background(), Spec{Type: "t", Steps: steps("a"), RequestKey: "r3"})
	if !errors.Is(err, ErrFull) || created {
		t.Fatalf("third Submit = created %v, %v; want ErrFull", created, err)
	}
	if _, err := st.Lookup(context.Background(), "r3"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the refused request was stored: %v", err)
	}
	// A request sent again gets its mission, full or not.
	if m, created, err := d.Submit(context.Background(), Spec{Type: "t", Steps: steps("a"), RequestKey: "r1"}); err != nil || created || m.ID != a.ID {
		t.Fatalf("Submit of r1 again while full = %v, created %v, %v; want mission %s", m, created, err, a.ID)
	}
	if _, err := d.Cancel(context.Background(), a.ID); err != nil {
		t.Fatal(err)
	}
	drain(t, d, clk)
	if _, created, err := d.Submit(context.Background(), Spec{Type: "t", Steps: steps("a"), RequestKey: "r3"}); err != nil || !created {
		t.Fatalf("Submit once a mission ended = created %v, %v; want a new mission", created, err)
	}
}
