package driver

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/internal/testkit"
)

// parker is a handler that parks each fresh attempt on the key its
// mission names, and on resume succeeds if woken, or parks again until
// its deadline. It records every call.
type parker struct {
	mu      sync.Mutex
	fresh   chan string // mission IDs as their first call parks
	calls   []StepRequest
	onFresh func(req StepRequest) // runs before a fresh call returns Pending
}

func (p *parker) Execute(_ context.Context, req StepRequest) (map[string]any, error) {
	p.mu.Lock()
	p.calls = append(p.calls, req)
	p.mu.Unlock()
	key := "ack/" + req.IdempotencyKey
	if req.Resume == nil {
		if p.onFresh != nil {
			p.onFresh(req)
		}
		if p.fresh != nil {
			p.fresh <- req.MissionID
		}
		return nil, InFlight(key, req.Deadline, "sent", map[string]any{"sent": true})
	}
	if req.Resume.Woken {
		return map[string]any{"note": req.Resume.Note, "sent": req.Resume.Out["sent"]}, nil
	}
	return nil, InFlight(key, req.Resume.Until, req.Resume.Note, req.Resume.Out)
}

func (p *parker) requests() []StepRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]StepRequest(nil), p.calls...)
}

// TestParkedStepsHoldNoWorker: with one worker, fifty missions each park
// their step (the first call of every one runs although none finished),
// and each resumes and succeeds when its key is woken.
func TestParkedStepsHoldNoWorker(t *testing.T) {
	const n = 50
	p := &parker{fresh: make(chan string, n)}
	d, _, _, _ := fixture(t, Options{Workers: 1, Handlers: map[string]Handler{"test": p}})
	done := make(chan string, n)
	d.Observe(ObserverFunc(func(ev Event, m *Mission) {
		if ev.To == StateSucceeded {
			done <- m.ID
		}
	}))
	start(t, d)
	ids := map[string]bool{}
	for i := range n {
		m := submit(t, d, Spec{Type: "t", Steps: steps(fmt.Sprintf("s%d", i))})
		ids[m.ID] = true
	}
	deadline := time.After(10 * time.Second)
	for range n {
		select {
		case <-p.fresh:
		case <-deadline:
			t.Fatalf("only some steps started with one worker: the parked ones held it (%d parked)", d.Queue().Parked)
		}
	}
	for _, r := range p.requests() {
		d.Wake("ack/" + r.IdempotencyKey)
	}
	for range n {
		select {
		case id := <-done:
			delete(ids, id)
		case <-deadline:
			t.Fatalf("%d missions did not finish after their wake", len(ids))
		}
	}
	for _, r := range p.requests() {
		if r.Resume != nil && (r.Resume.Note != "sent" || r.Resume.Out["sent"] != true || !r.Resume.Woken) {
			t.Errorf("resume of %s: %+v, want the note and outputs it parked with, woken", r.MissionID, r.Resume)
		}
	}
}

// TestParkedStepResumesAtUntil: nothing wakes a parked attempt, so the
// driver resumes it at the time it gave (Woken false), with the
// attempt's first deadline, and the attempt times out at that deadline
// as a retryable failure: the next attempt starts afresh.
func TestParkedStepResumesAtUntil(t *testing.T) {
	p := &parker{}
	d, clk, _, _ := fixture(t, Options{StepTimeout: 2 * time.Second, Handlers: map[string]Handler{"test": p}})
	m := submit(t, d, Spec{Type: "t", Steps: steps("a")})
	step(t, d)
	calls := p.requests()
	if len(calls) != 1 || calls[0].Resume != nil {
		t.Fatalf("calls %+v, want one fresh call", calls)
	}
	firstDeadline := calls[0].Deadline
	if got := d.NextWake(); !got.Equal(firstDeadline) {
		t.Fatalf("next wake %v, want the attempt's deadline %v", got, firstDeadline)
	}
	clk.AdvanceTo(firstDeadline)
	step(t, d)
	calls = p.requests()
	if len(calls) < 2 || calls[1].Resume == nil || calls[1].Resume.Woken || !calls[1].Deadline.Equal(firstDeadline) || calls[1].Attempt != 1 {
		t.Fatalf("second call %+v, want a resume of attempt 1, not woken, same deadline", calls[1])
	}
	// Still pending at its deadline, it gets a last word (to let go of
	// what it holds), then times out.
	if len(calls) != 3 || calls[2].Resume == nil || !calls[2].Resume.Until.Equal(firstDeadline) {
		t.Fatalf("%d calls, want the resume and a last word at the deadline", len(calls))
	}
	got, err := d.Get(context.Background(), m.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != StateStepFailed || got.Results[0].Code != "timeout" {
		t.Fatalf("after the deadline: %s %+v, want STEP_FAILED with a timeout", got.State, got.Results[0])
	}
	drainUntil(t, d, clk, func() bool { return len(p.requests()) >= 4 })
	if c := p.requests()[3]; c.Resume != nil || c.Attempt != 2 || c.IdempotencyKey != calls[0].IdempotencyKey {
		t.Fatalf("retry %+v, want a fresh attempt 2 with the same idempotency key", c)
	}
}

// TestWakeDuringExecuteIsNotLost: an outcome that arrives while the
// handler is still returning Pending (an in-process ack is that fast)
// resumes the attempt at once, not at its timeout.
func TestWakeDuringExecuteIsNotLost(t *testing.T) {
	p := &parker{}
	d, _, _, _ := fixture(t, Options{Handlers: map[string]Handler{"test": p}})
	p.onFresh = func(req StepRequest) { d.Wake("ack/" + req.IdempotencyKey) }
	m := submit(t, d, Spec{Type: "t", Steps: steps("a")})
	step(t, d) // parks, already woken
	step(t, d) // resumes without the clock moving
	got, err := d.Get(context.Background(), m.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != StateSucceeded {
		t.Fatalf("state %s, want SUCCEEDED without waiting for the timeout", got.State)
	}
}

// TestParkedStepRecoveredAfterCrash: a process that dies with a step
// parked leaves it STEP_RUNNING under its lease; the next one recovers
// it and executes it afresh (no Resume: the park lived in memory) with
// the same idempotency key, so a device applies the command once.
func TestParkedStepRecoveredAfterCrash(t *testing.T) {
	p := &parker{}
	d, clk, st, _ := fixture(t, Options{Owner: "first", Handlers: map[string]Handler{"test": p}})
	m := submit(t, d, Spec{Type: "t", Steps: steps("a")})
	step(t, d)
	key := p.requests()[0].IdempotencyKey
	// The first process is gone; a second opens the same store.
	p2 := &parker{}
	d2, err := New(Options{Store: st, Clock: clk, Owner: "second", Seed: 1, Handlers: map[string]Handler{"test": p2}})
	if err != nil {
		t.Fatal(err)
	}
	step(t, d2)
	calls := p2.requests()
	if len(calls) != 1 || calls[0].Resume != nil || calls[0].IdempotencyKey != key {
		t.Fatalf("after restart: %+v, want one fresh call with key %s", calls, key)
	}
	d2.Wake("ack/" + key)
	step(t, d2)
	got, err := st.Get(context.Background(), m.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != StateSucceeded {
		t.Fatalf("state %s, want SUCCEEDED", got.State)
	}
}

// TestCancelWaitsForParkedStep: a cancel asked while the step is parked
// takes effect when the attempt ends (its command may have been applied),
// then compensation undoes it; the cancel itself does not resume the
// attempt early.
func TestCancelWaitsForParkedStep(t *testing.T) {
	p := &parker{}
	d, _, _, _ := fixture(t, Options{Handlers: map[string]Handler{"test": p}})
	m := submit(t, d, Spec{Type: "t", Steps: steps("a!", "b")})
	step(t, d)
	if _, err := d.Cancel(context.Background(), m.ID); err != nil {
		t.Fatal(err)
	}
	if n := step(t, d); n != 0 || len(p.requests()) != 1 {
		t.Fatalf("the cancel resumed the parked attempt (%d advanced, %d calls)", n, len(p.requests()))
	}
	// The step's outcome, then its compensation's (which parks too).
	for i := 0; i < 2; i++ {
		calls := p.requests()
		d.Wake("ack/" + calls[len(calls)-1].IdempotencyKey)
		for step(t, d) > 0 {
		}
	}
	if c := p.requests(); len(c) != 4 || !c[2].Compensating || c[3].Resume == nil {
		t.Fatalf("calls %d, want the step's two and its compensation's two (parked, then resumed)", len(c))
	}
	got, err := d.Get(context.Background(), m.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != StateCancelled || got.Results[0].Status != StepCompensated {
		t.Fatalf("%s %+v, want CANCELLED with step a compensated", got.State, got.Results)
	}
}

// drainUntil is drain that stops once done says so.
func drainUntil(t *testing.T, d *Driver, clk *testkit.Clock, done func() bool) {
	t.Helper()
	for range 10000 {
		if done() {
			return
		}
		if step(t, d) > 0 {
			continue
		}
		w := d.NextWake()
		if w.IsZero() {
			t.Fatal("drainUntil: nothing left to do")
		}
		clk.AdvanceTo(w)
	}
	t.Fatal("drainUntil: never done")
}

// TestStopWaitsForAttemptsParkedInFlight: Stop lets an attempt parked
// in flight (a command sent, its ack to come) finish when its outcome
// arrives, and saves it, as it does for a step executing; an attempt
// parked before its effect started (waiting for its turn) is left for
// the next start, and nothing new begins.
func TestStopWaitsForAttemptsParkedInFlight(t *testing.T) {
	var mu sync.Mutex
	calls := map[string]int{}
	h := HandlerFunc(func(_ context.Context, req StepRequest) (map[string]any, error) {
		mu.Lock()
		calls[req.MissionID]++
		mu.Unlock()
		if req.Resume != nil {
			return map[string]any{"ok": true}, nil
		}
		if req.MissionType == "sent" {
			return nil, InFlight("ack/"+req.MissionID, time.Time{}, "ack", nil)
		}
		return nil, Pending("turn/"+req.MissionID, time.Time{}, "turn", nil)
	})
	d, err := New(Options{Store: newMemStore(t), Handlers: map[string]Handler{"test": h}, StopGrace: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	sent := submit(t, d, Spec{Type: "sent", Steps: steps("a", "b")})
	queued := submit(t, d, Spec{Type: "queued", Steps: steps("a")})
	for d.Queue().Parked < 2 {
		runtime.Gosched() // both park at once: the submit dispatches them
	}
	stopped := make(chan error, 1)
	go func() { stopped <- d.Stop(context.Background()) }()
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned (%v) with an attempt in flight", err)
	case <-time.After(50 * time.Millisecond): // Stop must still be waiting; nothing to await but its return
	}
	d.Wake("turn/" + queued.ID) // its turn comes during the stop: it must not send
	d.Wake("ack/" + sent.ID)
	if err := <-stopped; err != nil {
		t.Fatalf("stop: %v", err)
	}
	got := get(t, d, sent.ID)
	if got.Results[0].Status != StepSucceeded {
		t.Fatalf("the in-flight attempt's outcome was not saved: %+v", got.Results[0])
	}
	mu.Lock()
	defer mu.Unlock()
	if calls[sent.ID] != 2 {
		t.Errorf("the sent mission's handler ran %d times, want 2 (its step, its resume; not step b)", calls[sent.ID])
	}
	if calls[queued.ID] != 1 {
		t.Errorf("the queued attempt was resumed during the stop (%d calls): it would have sent a command", calls[queued.ID])
	}
}

// TestCancelGivesUpAStepWaitingForItsTurn: a step parked before its
// effect started (waiting for its device's turn) is given up when its
// mission is cancelled: the handler is told to let go (Abandon) and
// sends nothing, the attempt is not spent, and the steps done before
// are undone. Found by review: the command of a cancelled mission went
// out when its turn came.
func TestCancelGivesUpAStepWaitingForItsTurn(t *testing.T) {
	var mu sync.Mutex
	var got []StepRequest
	h := HandlerFunc(func(_ context.Context, req StepRequest) (map[string]any, error) {
		mu.Lock()
		got = append(got, req)
		mu.Unlock()
		if req.StepID == "b" && !req.Compensating && (req.Resume == nil || !req.Resume.Abandon) {
			return nil, Pending("turn/"+req.IdempotencyKey, time.Time{}, "turn", nil)
		}
		return nil, nil
	})
	d, _, _, _ := fixture(t, Options{Handlers: map[string]Handler{"test": h}})
	m := submit(t, d, Spec{Type: "t", Steps: steps("a!", "b")})
	for step(t, d) > 0 {
	}
	if _, err := d.Cancel(context.Background(), m.ID); err != nil {
		t.Fatal(err)
	}
	d.Wake("turn/" + m.ID + "-0-1") // its turn comes after the cancel
	for step(t, d) > 0 {
	}
	mission := get(t, d, m.ID)
	if mission.State != StateCancelled || mission.Results[0].Status != StepCompensated || mission.Results[1].Attempts != 0 {
		t.Fatalf("%s %+v, want CANCELLED, a compensated, b never attempted", mission.State, mission.Results)
	}
	mu.Lock()
	defer mu.Unlock()
	var trace []string
	for _, r := range got {
		s := r.StepID
		switch {
		case r.Compensating:
			s += "/undo"
		case r.Resume != nil && r.Resume.Abandon:
			s += "/abandon"
		case r.Resume != nil:
			s += "/resume"
		}
		trace = append(trace, s)
	}
	if want := "a b b/abandon a/undo"; strings.Join(trace, " ") != want {
		t.Errorf("calls %v, want %s", trace, want)
	}
}
