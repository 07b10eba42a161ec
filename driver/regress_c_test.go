package driver

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

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

// Retry racing with the commit that makes the mission FAILED: control
// took the entry before the worker deleted it from d.entries, then
// re-placed it in the scheduler. The entry is now an orphan; the next
// control op builds a second entry for the same mission and both get
// dispatched: the step runs twice concurrently.
func TestReviewOrphanEntryAfterRetryRace(t *testing.T) {
	st := &gateStore{memStore: newMemStore(t), saving: make(chan struct{}), proceed: make(chan struct{})}
	var calls, inFlight, peak atomic.Int32
	release := make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, req StepRequest) (map[string]any, error) {
		n := calls.Add(1)
		if n == 1 {
			return nil, PermanentError("boom", errors.New("first run fails"))
		}
		c := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			p := peak.Load()
			if c <= p || peak.CompareAndSwap(p, c) {
				break
			}
		}
		select {
		case <-release:
		case <-time.After(2 * time.Second):
		}
		return nil, nil
	})
	d, _ := New(Options{Store: st, Handlers: map[string]Handler{"test": h}, Workers: 4, StopGrace: time.Second})
	d.Start(context.Background())
	defer d.Stop(context.Background())
	m, _, _ := d.Submit(context.Background(), Spec{Type: "t", Steps: steps("a")})
	<-st.saving // the worker holds e.mu, committing FAILED
	retryErr := make(chan error, 1)
	go func() { _, err := d.Retry(context.Background(), m.ID); retryErr <- err }()
	time.Sleep(50 * time.Millisecond) // Retry has the entry and waits on e.mu
	close(st.proceed)
	if err := <-retryErr; err != nil {
		t.Fatalf("retry: %v", err)
	}
	time.Sleep(50 * time.Millisecond)
	d.mu.Lock()
	_, tracked := d.entries[m.ID]
	d.mu.Unlock()
	t.Logf("after Retry: mission tracked in d.entries = %v", tracked)
	// Now a control op on the running mission.
	time.Sleep(50 * time.Millisecond)
	if _, err := d.Cancel(context.Background(), m.ID); err != nil {
		t.Logf("cancel: %v", err)
	}
	time.Sleep(200 * time.Millisecond)
	close(release)
	time.Sleep(200 * time.Millisecond)
	if p := peak.Load(); p > 1 {
		t.Errorf("the retried step ran %d times concurrently (calls %d); timeline %s", p, calls.Load(), inputs(t, d, m.ID))
	}
	if !tracked {
		t.Errorf("retried mission is scheduled but not in d.entries (orphan entry)")
	}
}
