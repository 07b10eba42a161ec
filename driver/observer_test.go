package driver

import (
	"context"
	"sync"
	"testing"
	"time"
)

func TestObserversSeeEveryEventInOrder(t *testing.T) {
	var mu sync.Mutex
	seen := map[string][]uint64{}
	obs := ObserverFunc(func(ev Event, m *Mission) {
		mu.Lock()
		defer mu.Unlock()
		seen[ev.MissionID] = append(seen[ev.MissionID], ev.Seq)
		if m.Seq < ev.Seq {
			t.Errorf("snapshot seq %d behind event %d", m.Seq, ev.Seq)
		}
	})
	d, clk, _, _ := fixture(t, Options{Observers: []Observer{obs}})
	m := submit(t, d, Spec{Type: "t", Steps: steps("a", "b")})
	drain(t, d, clk)
	evs, _ := d.Timeline(context.Background(), m.ID)
	if len(seen[m.ID]) != len(evs) {
		t.Fatalf("observed %d events, timeline has %d", len(seen[m.ID]), len(evs))
	}
	for i, s := range seen[m.ID] {
		if s != uint64(i+1) {
			t.Fatalf("observed seqs %v", seen[m.ID])
		}
	}
}

// Observers see a mission's submit events before any later event of it,
// even when an observer is slow and the loop is woken meanwhile. Found
// by review D: Submit published after the entry was schedulable and
// without the entry lock, so a worker could commit and publish later
// events of the same mission first.
func TestObserversSeeSubmitEventsFirst(t *testing.T) {
	var mu sync.Mutex
	seen := map[string][]uint64{}
	kick := make(chan struct{})
	var once sync.Once
	obs := ObserverFunc(func(ev Event, m *Mission) {
		if ev.Type == "slow" && ev.Input == InSubmit {
			once.Do(func() { close(kick) })
			// A slow observer (a log write, or just preemption) widens
			// the window a worker would need; this sleep is the work
			// being simulated, not synchronisation.
			time.Sleep(100 * time.Millisecond)
		}
	})
	// Like the agent: metrics is registered before the triggers observer,
	// which records what it is called with, on entry.
	done := make(chan string, 2)
	rec := ObserverFunc(func(ev Event, m *Mission) {
		mu.Lock()
		seen[ev.MissionID] = append(seen[ev.MissionID], ev.Seq)
		mu.Unlock()
		if ev.To.Terminal() {
			done <- ev.MissionID
		}
	})
	h := HandlerFunc(func(ctx context.Context, req StepRequest) (map[string]any, error) { return nil, nil })
	d, err := New(Options{Store: newMemStore(t), Handlers: map[string]Handler{"test": h}, Observers: []Observer{obs, rec}})
	if err != nil {
		t.Fatal(err)
	}
	start(t, d)
	go func() {
		<-kick
		if _, _, err := d.Submit(context.Background(), Spec{Type: "other", Steps: steps("x")}); err != nil { // wakes the loop
			t.Error(err)
		}
	}()
	m, _, err := d.Submit(context.Background(), Spec{Type: "slow", Steps: steps("a")})
	if err != nil {
		t.Fatal(err)
	}
	<-done // both missions end
	<-done
	mu.Lock()
	defer mu.Unlock()
	got := seen[m.ID]
	for i := 1; i < len(got); i++ {
		if got[i] < got[i-1] {
			t.Fatalf("observer saw mission %s events out of order: seqs %v", m.ID, got)
		}
	}
}
