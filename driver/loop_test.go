package driver

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestConcurrentMissionsNeverShareAWorker runs the real loop (Start, real
// clock) over many missions and checks that no mission ever has two steps
// in flight, that the worker bound holds, and that all succeed.
func TestConcurrentMissionsNeverShareAWorker(t *testing.T) {
	const missions, workers = 60, 6
	var inFlight sync.Map // mission ID -> *atomic.Int32
	var total, peak atomic.Int32
	h := HandlerFunc(func(ctx context.Context, req StepRequest) (map[string]any, error) {
		c, _ := inFlight.LoadOrStore(req.MissionID, new(atomic.Int32))
		if n := c.(*atomic.Int32).Add(1); n > 1 {
			t.Errorf("mission %s has %d steps in flight", req.MissionID, n)
		}
		defer c.(*atomic.Int32).Add(-1)
		raise(&peak, total.Add(1))
		defer total.Add(-1)
		if req.Attempt == 1 && req.StepIndex == 1 {
			return nil, RetryableError("busy", errors.New("busy")) // exercise the backoff timer
		}
		time.Sleep(time.Millisecond) // simulated work, not synchronisation
		return nil, nil
	})
	done := make(chan string, missions)
	obs := ObserverFunc(func(ev Event, m *Mission) {
		if ev.To.Terminal() {
			done <- m.ID
		}
	})
	st := newMemStore(t)
	d, err := New(Options{Store: st, Handlers: map[string]Handler{"test": h}, Workers: workers, Observers: []Observer{obs}})
	if err != nil {
		t.Fatal(err)
	}
	start(t, d)
	for i := range missions {
		st := steps("a", "b", "c")
		st[1].Retry = RetryPolicy{MaxAttempts: 3, InitialBackoff: Duration(time.Millisecond), MaxBackoff: Duration(5 * time.Millisecond)}
		if _, _, err := d.Submit(context.Background(), Spec{Type: "t", Priority: i % 3, Steps: st}); err != nil {
			t.Fatal(err)
		}
	}
	timeout := time.After(60 * time.Second)
	for range missions {
		select {
		case id := <-done:
			if m := get(t, d, id); m.State != StateSucceeded {
				t.Errorf("mission %s ended %s: %s", id, m.State, m.Error)
			}
		case <-timeout:
			t.Fatal("missions did not finish")
		}
	}
	if p := peak.Load(); p > workers {
		t.Errorf("peak concurrency %d exceeds %d workers", p, workers)
	}
	if err := d.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if q := d.Queue(); len(q.ByState) != 0 {
		t.Errorf("missions still tracked: %v", q.ByState)
	}
}

// TestStopWaitsForInFlightStep: Stop lets a running step finish and be
// saved; no new step starts after Stop.
func TestStopWaitsForInFlightStep(t *testing.T) {
	entered := make(chan struct{})
	var calls atomic.Int32
	var d *Driver
	h := HandlerFunc(func(ctx context.Context, req StepRequest) (map[string]any, error) {
		calls.Add(1)
		if req.StepIndex == 0 {
			close(entered)
			<-d.stopCh // finish only once Stop has begun
		}
		return nil, nil
	})
	st := newMemStore(t)
	d, _ = New(Options{Store: st, Handlers: map[string]Handler{"test": h}})
	start(t, d)
	m, _, _ := d.Submit(context.Background(), Spec{Type: "t", Steps: steps("a", "b")})
	<-entered
	stopped := make(chan error)
	go func() { stopped <- d.Stop(context.Background()) }()
	if err := <-stopped; err != nil {
		t.Fatalf("stop: %v", err)
	}
	got := get(t, d, m.ID)
	if got.Results[0].Status != StepSucceeded {
		t.Fatalf("in-flight step result not saved: %+v", got.Results[0])
	}
	if calls.Load() != 1 {
		t.Fatalf("a step started after Stop (calls=%d)", calls.Load())
	}
	if got.State != StateStepRunning {
		t.Fatalf("state %s; want STEP_RUNNING (b begun write-ahead, recovered on restart)", got.State)
	}
	if _, _, err := d.Submit(context.Background(), Spec{Type: "t", Steps: steps("a")}); !errors.Is(err, ErrClosed) {
		t.Fatalf("submit after stop: %v, want ErrClosed", err)
	}
	// A new driver on the same store takes over the lease and finishes.
	d2, _ := New(Options{Store: st, Handlers: map[string]Handler{"test": h}, Clock: newFakeClock()})
	for range 10 {
		step(t, d2)
	}
	got = get(t, d2, m.ID)
	if got.State != StateSucceeded {
		t.Fatalf("after restart: %s", got.State)
	}
	if in := inputs(t, d2, m.ID); !contains(in, "recover") {
		t.Fatalf("timeline has no recovery: %s", in)
	}
}

// TestStopGraceCancelsStuckStep: a step that outlives the grace period is
// cancelled and left leased, not recorded as a failed attempt.
func TestStopGraceCancelsStuckStep(t *testing.T) {
	entered := make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, req StepRequest) (map[string]any, error) {
		close(entered)
		<-ctx.Done()
		return nil, ctx.Err()
	})
	st := newMemStore(t)
	d, _ := New(Options{Store: st, Handlers: map[string]Handler{"test": h}, StopGrace: 50 * time.Millisecond})
	start(t, d)
	m, _, _ := d.Submit(context.Background(), Spec{Type: "t", Steps: steps("a")})
	<-entered
	if err := d.Stop(context.Background()); err == nil {
		t.Fatal("stop: want an error saying steps were cancelled")
	}
	got := get(t, d, m.ID)
	if got.State != StateStepRunning || got.Results[0].Attempts != 1 || got.Lease.Owner != d.Owner() {
		t.Fatalf("after cancelled stop: state %s attempts %d lease %+v", got.State, got.Results[0].Attempts, got.Lease)
	}
}

// raise sets peak to n if n is higher, for handlers that track the most
// steps they ever saw in flight at once.
func raise(peak *atomic.Int32, n int32) {
	for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
	}
}

func contains(s, sub string) bool {
	return len(sub) == 0 || (len(s) >= len(sub) && (s == sub || indexOf(s, sub) >= 0))
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// TestRandomized drives random missions, failures, pauses and cancels
// through the synchronous loop and checks the invariants. The seed is
// printed; set SORTIE_SEED to reproduce a run.
func TestRandomized(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := envSeed(); s != 0 {
		seed = s
	}
	t.Logf("seed %d (rerun with SORTIE_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	// Outcomes depend only on (mission type, step, attempt), so the run is
	// reproducible whatever order the loop takes.
	outcome := func(req StepRequest) error {
		h := fnv.New64a()
		_, _ = fmt.Fprintf(h, "%d/%s/%s/%d/%v/%d", seed, req.MissionType, req.StepID, req.Attempt, req.Compensating, req.Context["gen"])
		switch x := h.Sum64() % 10; {
		case x < 5:
			return nil
		case x < 7:
			return RetryableError("busy", errors.New("busy"))
		case x < 8:
			return PermanentError("bad", errors.New("bad"))
		default:
			return NotReadyError("offline", time.Duration(x)*time.Millisecond, errors.New("offline"))
		}
	}
	// Some attempts park first (an ack to wait for): woken at random by
	// the test, or resumed at their time; the outcome is the same either
	// way, as a device's ack would be.
	parks := func(req StepRequest) bool {
		h := fnv.New64a()
		_, _ = fmt.Fprintf(h, "park/%d/%s/%s/%d/%v", seed, req.MissionType, req.StepID, req.Attempt, req.Compensating)
		return h.Sum64()%3 == 0
	}
	var keysMu sync.Mutex
	var keys []string
	h := HandlerFunc(func(ctx context.Context, req StepRequest) (map[string]any, error) {
		if req.Resume == nil && parks(req) {
			key := fmt.Sprintf("ack/%s/%d", req.IdempotencyKey, req.Attempt)
			keysMu.Lock()
			keys = append(keys, key)
			keysMu.Unlock()
			return nil, Pending(key, time.Time{}, "sent", nil)
		}
		if req.Resume != nil && (req.Resume.Note != "sent" || !parks(req)) {
			t.Errorf("%s attempt %d resumed with %+v, but it never parked so", req.IdempotencyKey, req.Attempt, req.Resume)
		}
		return nil, outcome(req)
	})
	d, clk, st, _ := fixture(t, Options{Handlers: map[string]Handler{"test": h}, MaxWait: 5 * time.Second, NotReadyRetry: 200 * time.Millisecond})
	var ids []string
	for i := range 150 {
		switch r := rng.IntN(11); {
		case r == 10:
			keysMu.Lock()
			if len(keys) > 0 {
				k := keys[rng.IntN(len(keys))]
				keysMu.Unlock()
				d.Wake(k)
			} else {
				keysMu.Unlock()
			}
		case r < 4 || len(ids) == 0:
			n := 1 + rng.IntN(5)
			var ss []Step
			for j := range n {
				s := Step{ID: fmt.Sprintf("s%d", j), Kind: "test", Retry: RetryPolicy{MaxAttempts: 1 + rng.IntN(4), InitialBackoff: Duration(10 * time.Millisecond)}}
				if rng.IntN(2) == 0 {
					s.Compensate = &Compensation{Kind: "test", Retry: RetryPolicy{MaxAttempts: 2}}
				}
				s.ContinueOnError = rng.IntN(8) == 0
				ss = append(ss, s)
			}
			var timeout time.Duration
			if rng.IntN(3) == 0 {
				timeout = time.Duration(1+rng.IntN(5)) * time.Second
			}
			m, _, err := d.Submit(context.Background(), Spec{Type: fmt.Sprintf("m%d", i), Priority: rng.IntN(3), Steps: ss, Timeout: timeout})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, m.ID)
		// Random control ops often meet a mission in a state that
		// refuses them (ErrTerminal and the like); that is the point.
		case r < 5:
			_, _ = d.Pause(context.Background(), ids[rng.IntN(len(ids))])
		case r < 6:
			_, _ = d.Resume(context.Background(), ids[rng.IntN(len(ids))])
		case r < 7:
			_, _ = d.Cancel(context.Background(), ids[rng.IntN(len(ids))])
		case r < 8:
			_, _ = d.Retry(context.Background(), ids[rng.IntN(len(ids))])
		default:
			step(t, d)
			clk.Advance(time.Duration(rng.IntN(200)) * time.Millisecond)
		}
	}
	// Let everything finish: resume what is paused, then drain.
	for range 5 {
		for _, id := range ids {
			if m := get(t, d, id); m.State == StatePaused {
				if _, err := d.Resume(context.Background(), id); err != nil {
					t.Fatalf("resume paused %s: %v", id, err)
				}
			}
		}
		drain(t, d, clk)
	}
	for _, id := range ids {
		m := get(t, d, id)
		if !m.State.Terminal() {
			t.Errorf("mission %s (%s) not terminal: %s", id, m.Type, m.State)
		}
		for i, r := range m.Results {
			if max := m.Steps[i].Retry.WithDefaults().MaxAttempts; r.Attempts > max {
				t.Errorf("mission %s step %d: %d attempts > %d", id, i, r.Attempts, max)
			}
		}
		checkCompensationOrder(t, st, id)
	}
}

// checkCompensationOrder: within each run (generation), compensations
// begin in the reverse order of the completions they undo.
func checkCompensationOrder(t *testing.T, st *memStore, id string) {
	t.Helper()
	st.mu.Lock()
	evs := append([]Event(nil), st.events[id]...)
	st.mu.Unlock()
	var completed, undone []int
	check := func() {
		// undone must be a prefix of completed reversed, restricted to steps
		// that were undone.
		pos := map[int]int{}
		for i, s := range completed {
			pos[s] = i
		}
		last := len(completed)
		for _, s := range undone {
			p, ok := pos[s]
			if !ok {
				t.Errorf("mission %s compensated step %d that never completed", id, s)
				return
			}
			if p >= last {
				t.Errorf("mission %s: compensations %v not in reverse of completions %v", id, undone, completed)
				return
			}
			last = p
		}
	}
	for _, ev := range evs {
		switch ev.Input {
		case InStepOK:
			completed = append(completed, ev.Step)
		case InCompBegin:
			if len(undone) == 0 || undone[len(undone)-1] != ev.Step {
				undone = append(undone, ev.Step)
			}
		case InRetry:
			check()
			// Steps before the restart point still hold; the rest are redone.
			var kept []int
			for _, s := range completed {
				if s < ev.Step {
					kept = append(kept, s)
				}
			}
			completed, undone = kept, nil
		}
	}
	check()
}

// wallClock is the system clock without monotonic readings (as times read
// back from the store are) whose wall time can be stepped back, as NTP does.
type wallClock struct{ back atomic.Int64 }

func (c *wallClock) Now() time.Time {
	return time.Now().Round(0).Add(-time.Duration(c.back.Load()))
}
func (c *wallClock) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}

// A retry timer that fires "early" by a wall clock stepped back is set
// again, so the retry still runs. Found by review G: armLocked skipped
// re-arming when the earliest wake equalled the time of a timer that had
// already fired, and nothing woke the loop for that mission again.
func TestRetryTimerRearmedAfterWallClockStepBack(t *testing.T) {
	clk := &wallClock{}
	var calls atomic.Int32
	h := HandlerFunc(func(ctx context.Context, req StepRequest) (map[string]any, error) {
		if calls.Add(1) == 1 {
			return nil, RetryableError("busy", errors.New("busy"))
		}
		return nil, nil
	})
	failed := make(chan struct{}, 1)
	done := make(chan struct{})
	d, err := New(Options{Store: newMemStore(t), Clock: clk, Handlers: map[string]Handler{"test": h},
		Observers: []Observer{ObserverFunc(func(ev Event, m *Mission) {
			switch {
			case ev.Input == InStepError:
				failed <- struct{}{}
			case ev.To.Terminal():
				close(done)
			}
		})}})
	if err != nil {
		t.Fatal(err)
	}
	start(t, d)
	st := steps("a")
	st[0].Retry = RetryPolicy{MaxAttempts: 3, InitialBackoff: Duration(300 * time.Millisecond)}
	m, _, err := d.Submit(context.Background(), Spec{Type: "t", Steps: st})
	if err != nil {
		t.Fatal(err)
	}
	<-failed
	// The loop arms the retry timer after the failure is published; the
	// clock must step back under an armed timer.
	for armed := false; !armed; runtime.Gosched() {
		d.mu.Lock()
		armed = d.timerStop != nil
		d.mu.Unlock()
	}
	clk.back.Store(int64(200 * time.Millisecond)) // wall clock steps back 200ms
	select {
	case <-done:
	case <-time.After(10 * time.Second): // the retry was due 500ms from now
		t.Fatalf("mission still %s; retry was due 300ms after the failure (calls %d, NextWake %v, now %v)",
			get(t, d, m.ID).State, calls.Load(), d.NextWake().Format(time.StampMilli), clk.Now().Format(time.StampMilli))
	}
	if got := get(t, d, m.ID); got.State != StateSucceeded {
		t.Errorf("state %s, want SUCCEEDED", got.State)
	}
}
