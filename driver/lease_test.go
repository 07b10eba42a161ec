package driver

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/internal/testkit"
)

// A step begun write-ahead (at Submit) is leased then, but the clock for
// abandoning it starts when a worker hands it to its handler: a step that
// waited for a worker longer than timeout+grace still runs once. Found by
// review A: the stale lease expired the moment the handler started, so
// the step ran twice although the handler kept well within its timeout.
func TestStepQueuedPastItsLeaseRunsOnce(t *testing.T) {
	clk := newFakeClock()
	var bCalls atomic.Int32
	var mu sync.Mutex
	var keys []string
	longEntered := make(chan struct{}, 2)
	releaseLong := make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, req StepRequest) (map[string]any, error) {
		if req.MissionType == "long" {
			longEntered <- struct{}{}
			<-releaseLong // within its own 5s timeout: the clock is fake
			return nil, nil
		}
		bCalls.Add(1)
		mu.Lock()
		keys = append(keys, req.IdempotencyKey)
		mu.Unlock()
		clk.Advance(100 * time.Millisecond) // well within its 200ms timeout
		return nil, nil
	})
	done := make(chan string, 4)
	d, err := New(Options{Store: newMemStore(t), Clock: clk, Handlers: map[string]Handler{"test": h}, Workers: 2,
		StepTimeout: 200 * time.Millisecond, LeaseGrace: 100 * time.Millisecond,
		Observers: []Observer{ObserverFunc(func(ev Event, m *Mission) {
			if ev.To.Terminal() {
				done <- m.ID
			}
		})}})
	if err != nil {
		t.Fatal(err)
	}
	start(t, d)
	long := steps("a")
	long[0].Timeout = Duration(5 * time.Second)
	ctx := context.Background()
	for range 2 {
		if _, _, err := d.Submit(ctx, Spec{Type: "long", Priority: 10, Steps: long}); err != nil {
			t.Fatal(err)
		}
	}
	<-longEntered // both workers are busy
	<-longEntered
	b, _, err := d.Submit(ctx, Spec{Type: "short", Steps: steps("b")})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(600 * time.Millisecond) // b waits for a worker, past its 300ms lease
	close(releaseLong)
	for range 3 {
		<-done
	}
	if n := bCalls.Load(); n != 1 {
		t.Errorf("step b executed %d times (keys %v); want 1: timeline %s", n, keys, inputs(t, d, b.ID))
	}
}

// TestZombieStepLeaseExpires: a handler that ignores its context keeps
// running past timeout + lease grace; the attempt counts as failed, the
// retry runs with the same idempotency key, the mission finishes, and the
// zombie's late outcome is dropped.
func TestZombieStepLeaseExpires(t *testing.T) {
	clk := newFakeClock()
	st := newMemStore(t)
	entered := make(chan string, 2)
	releaseZombie := make(chan struct{})
	zombieDone := make(chan struct{})
	var calls atomic.Int32
	h := HandlerFunc(func(ctx context.Context, req StepRequest) (map[string]any, error) {
		if calls.Add(1) == 1 {
			entered <- req.IdempotencyKey
			<-releaseZombie // ignores ctx
			defer close(zombieDone)
			return nil, PermanentError("zombie", errors.New("late and wrong"))
		}
		entered <- req.IdempotencyKey
		return nil, nil
	})
	done := make(chan *Mission, 1)
	d, _ := New(Options{Store: st, Clock: clk, Handlers: map[string]Handler{"test": h},
		StepTimeout: time.Second, LeaseGrace: time.Second, StopGrace: 100 * time.Millisecond,
		Observers: []Observer{ObserverFunc(func(ev Event, m *Mission) {
			if ev.To.Terminal() {
				done <- m
			}
		})}})
	start(t, d)
	m, _, _ := d.Submit(context.Background(), Spec{Type: "t", Steps: steps("a")})
	first := <-entered
	clk.Advance(2 * time.Second) // timeout + grace: the lease expires
	// The abandoned attempt counts as failed; its retry waits the backoff.
	var w time.Time
	for w.IsZero() {
		w = d.NextWake()
		runtime.Gosched()
	}
	clk.AdvanceTo(w)
	second := <-entered
	if first != second {
		t.Errorf("re-execution used key %s, first %s", second, first)
	}
	got := testkit.Receive(t, done, 10*time.Second, "mission did not finish after the lease expired")
	if got.State != StateSucceeded {
		t.Fatalf("state %s", got.State)
	}
	close(releaseZombie)
	<-zombieDone
	if err := d.Stop(context.Background()); err != nil {
		t.Errorf("stop: %v", err)
	}
	final := get(t, d, m.ID)
	if final.State != StateSucceeded || final.Results[0].Attempts != 2 {
		t.Errorf("zombie outcome leaked or attempt not counted: state %s attempts %d", final.State, final.Results[0].Attempts)
	}
	evs, _ := d.Timeline(context.Background(), m.ID)
	expired := false
	for _, ev := range evs {
		expired = expired || (ev.Input == InStepError && ev.Code == "lease_expired")
	}
	if !expired {
		t.Errorf("no lease_expired attempt on the timeline: %s", inputs(t, d, m.ID))
	}
}

// TestZombiesDoNotExhaustWorkers: handlers that ignore their timeout are
// abandoned with their attempts counted, so the step fails after
// max_attempts instead of being re-run forever, and the abandoned
// handlers do not keep worker slots from other missions.
func TestZombiesDoNotExhaustWorkers(t *testing.T) {
	clk := newFakeClock()
	st := newMemStore(t)
	release := make(chan struct{})
	entered := make(chan StepRequest, 16)
	okRan := make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, req StepRequest) (map[string]any, error) {
		if req.MissionType == "ok" {
			close(okRan)
			return nil, nil
		}
		entered <- req
		<-release // ignores ctx
		return nil, nil
	})
	done := make(chan *Mission, 4)
	d, _ := New(Options{Store: st, Clock: clk, Handlers: map[string]Handler{"test": h}, Workers: 2,
		StepTimeout: time.Second, LeaseGrace: time.Second, StopGrace: 50 * time.Millisecond,
		Observers: []Observer{ObserverFunc(func(ev Event, m *Mission) {
			if ev.To.Terminal() {
				done <- m
			}
		})}})
	start(t, d)
	t.Cleanup(func() { close(release) }) // before start's Stop: cleanups run last-in first-out
	zs := steps("a")
	zs[0].Retry = RetryPolicy{MaxAttempts: 2, InitialBackoff: Duration(100 * time.Millisecond)}
	z, _, _ := d.Submit(context.Background(), Spec{Type: "zombie", Steps: zs})
	for i := range 2 {
		req := <-entered
		if req.Attempt != i+1 {
			t.Fatalf("execution %d has attempt %d", i+1, req.Attempt)
		}
		clk.Advance(2 * time.Second) // the lease expires
		if i == 0 {
			var w time.Time
			for w.IsZero() {
				w = d.NextWake()
				runtime.Gosched()
			}
			clk.AdvanceTo(w) // the retry's backoff
		}
	}
	select {
	case m := <-done:
		if m.ID != z.ID || m.State != StateFailed || m.Results[0].Code != "lease_expired" {
			t.Fatalf("zombie mission ended %s (%s), want FAILED with lease_expired", m.State, m.Results[0].Code)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("zombie mission did not fail after its attempts: %s", inputs(t, d, z.ID))
	}
	if q := d.Queue(); q.Zombies != 2 || q.Running != 0 {
		t.Errorf("queue %+v: want 2 zombies and no slot held", q)
	}
	if _, _, err := d.Submit(context.Background(), Spec{Type: "ok", Steps: steps("b")}); err != nil {
		t.Fatal(err)
	}
	testkit.Receive(t, okRan, 10*time.Second, "an unrelated mission never ran: zombies hold the worker slots")
}
