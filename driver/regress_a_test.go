package driver

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A step begun write-ahead (at Submit) gets its lease then; if it waits
// for a worker longer than timeout+grace, the lease has expired before the
// handler even starts, so expire fires at once and the step runs twice
// although the handler is well within its timeout.
func TestReviewStaleLeaseOnQueuedStep(t *testing.T) {
	var bCalls atomic.Int32
	var mu sync.Mutex
	var keys []string
	h := HandlerFunc(func(ctx context.Context, req StepRequest) (map[string]any, error) {
		if req.MissionType == "long" {
			time.Sleep(600 * time.Millisecond) // within its own 5s timeout
			return nil, nil
		}
		bCalls.Add(1)
		mu.Lock()
		keys = append(keys, req.IdempotencyKey)
		mu.Unlock()
		time.Sleep(100 * time.Millisecond) // well within its 200ms timeout
		return nil, nil
	})
	done := make(chan string, 4)
	st := newMemStore(t)
	d, _ := New(Options{Store: st, Handlers: map[string]Handler{"test": h}, Workers: 2,
		StepTimeout: 200 * time.Millisecond, LeaseGrace: 100 * time.Millisecond,
		Observers: []Observer{ObserverFunc(func(ev Event, m *Mission) {
			if ev.To.Terminal() {
				done <- m.ID
			}
		})}})
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer d.Stop(context.Background())
	long := steps("a")
	long[0].Timeout = Duration(5 * time.Second)
	ctx := context.Background()
	d.Submit(ctx, Spec{Type: "long", Priority: 10, Steps: long})
	d.Submit(ctx, Spec{Type: "long", Priority: 10, Steps: long})
	b, _, _ := d.Submit(ctx, Spec{Type: "short", Steps: steps("b")})
	for range 3 {
		<-done
	}
	if n := bCalls.Load(); n != 1 {
		t.Errorf("step b executed %d times (keys %v); want 1: timeline %s", n, keys, inputs(t, d, b.ID))
	}
}
