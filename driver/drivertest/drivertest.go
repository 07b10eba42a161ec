// Package drivertest holds fixtures for tests that run a driver.Driver:
// an observer that awaits missions' states (Watcher) and a step handler
// that holds or fails steps on demand (Gate), in the shape of
// net/http/httptest. Only tests import it.
package drivertest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
)

// Within bounds every wait of this package.
const Within = 10 * time.Second

// Watcher is a driver.Observer that records each mission's latest state
// and wakes its waiters. The state is the event's, not the mission's: a
// commit's events are observed one by one, each by every observer, with
// the mission as the whole commit left it, so a waiter woken by the
// first would run ahead of the observers yet to see the last (the
// metrics' end of the mission, say).
type Watcher struct {
	mu     sync.Mutex
	states map[string]driver.State
	ch     chan struct{}
}

// NewWatcher returns a Watcher that has seen nothing.
func NewWatcher() *Watcher {
	return &Watcher{states: map[string]driver.State{}, ch: make(chan struct{})}
}

// Observe records ev's state for m.
func (w *Watcher) Observe(ev driver.Event, m *driver.Mission) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.states[m.ID] = ev.To
	close(w.ch)
	w.ch = make(chan struct{})
}

// Wait waits until mission id's latest event took it to want, and fails
// tb (FailNow) if that is not so within Within.
func (w *Watcher) Wait(tb testing.TB, id string, want driver.State) {
	tb.Helper()
	deadline := time.NewTimer(Within)
	defer deadline.Stop()
	for {
		w.mu.Lock()
		got, ch := w.states[id], w.ch
		w.mu.Unlock()
		if got == want {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			tb.Fatalf("mission %s is %s after %s, want %s", id, got, Within, want)
		}
	}
}

// Gate is a driver.Handler whose attempts succeed at once, fail
// permanently while Fail is set, and, while Hold is set, send their
// mission's ID on Entered and wait for a value on Release (or their
// context's end).
type Gate struct {
	Hold, Fail atomic.Bool
	Entered    chan string
	Release    chan struct{}
}

// NewGate returns an open Gate; Entered holds 16 IDs.
func NewGate() *Gate {
	return &Gate{Entered: make(chan string, 16), Release: make(chan struct{})}
}

// Execute runs one attempt as the switches say.
func (g *Gate) Execute(ctx context.Context, req driver.StepRequest) (map[string]any, error) {
	if g.Fail.Load() {
		return nil, driver.PermanentError("broken", errors.New("broken on purpose"))
	}
	if g.Hold.Load() {
		g.Entered <- req.MissionID
		select {
		case <-g.Release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return nil, nil
}

// Open lets every attempt through, held or yet to come, for good: a
// fixture's cleanup calls it before stopping the driver, so that a held
// step does not keep the stop waiting.
func (g *Gate) Open() {
	g.Hold.Store(false)
	close(g.Release)
}
