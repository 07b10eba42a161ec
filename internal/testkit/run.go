package testkit

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Runner is a component with the life of agent.Agent: Start, then Run
// until its context ends, then Close.
type Runner interface {
	Start(ctx context.Context) error
	Run(ctx context.Context) error
	Close()
}

// StopWithin bounds how long a stop of Run waits for Run to return.
const StopWithin = 30 * time.Second

// Run starts r and runs it, failing tb (FailNow, after closing r) if it
// does not start. It returns the stop: it ends Run's context, fails tb if
// Run returns an error or not within StopWithin, and closes r. Only its
// first call does anything; the test's cleanup calls it too.
func Run(tb testing.TB, r Runner) (stop func()) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	if err := r.Start(ctx); err != nil {
		cancel()
		r.Close()
		tb.Fatalf("start: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	stop = sync.OnceFunc(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				tb.Errorf("run: %v", err)
			}
		case <-time.After(StopWithin):
			tb.Errorf("run did not return within %s of its stop", StopWithin)
		}
		r.Close()
	})
	tb.Cleanup(stop)
	return stop
}
