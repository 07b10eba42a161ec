package driver

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Submit publishes its events to observers after the entry is already
// schedulable and without the entry lock, so a worker can commit and
// publish later events of the same mission first.
func TestReviewSubmitObserverOrder(t *testing.T) {
	var mu sync.Mutex
	seen := map[string][]uint64{}
	kick := make(chan struct{})
	var once sync.Once
	var d *Driver
	obs := ObserverFunc(func(ev Event, m *Mission) {
		if ev.Type == "slow" && ev.Input == InSubmit {
			once.Do(func() { close(kick) })
			time.Sleep(100 * time.Millisecond) // e.g. a log write, or just preemption
		}
	})
	// Like the agent: metrics is registered before the triggers observer,
	// which records what it is called with, on entry.
	rec := ObserverFunc(func(ev Event, m *Mission) {
		mu.Lock()
		seen[ev.MissionID] = append(seen[ev.MissionID], ev.Seq)
		mu.Unlock()
	})
	h := HandlerFunc(func(ctx context.Context, req StepRequest) (map[string]any, error) { return nil, nil })
	d, _ = New(Options{Store: newMemStore(t), Handlers: map[string]Handler{"test": h}, Observers: []Observer{obs, rec}})
	d.Start(context.Background())
	defer d.Stop(context.Background())
	go func() {
		<-kick
		d.Submit(context.Background(), Spec{Type: "other", Steps: steps("x")}) // wakes the loop
	}()
	m, _, _ := d.Submit(context.Background(), Spec{Type: "slow", Steps: steps("a")})
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	got := seen[m.ID]
	for i := 1; i < len(got); i++ {
		if got[i] < got[i-1] {
			t.Fatalf("observer saw mission %s events out of order: seqs %v (final state %s)", m.ID, got, get(t, d, m.ID).State)
		}
	}
}
