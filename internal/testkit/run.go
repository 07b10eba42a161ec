package testkit

import (
	"context"
	"net"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"
)

// StopWithin bounds how long a stop waits for a run to return.
const StopWithin = 30 * time.Second

// Go calls run on a goroutine of its own with a context that the stop
// it returns ends; the stop then fails tb if run returns an error or not
// within StopWithin. Only the stop's first call does anything; the
// test's cleanup calls it too.
func Go(tb testing.TB, run func(context.Context) error) (stop func()) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	return goWith(tb, ctx, cancel, run)
}

func goWith(tb testing.TB, ctx context.Context, cancel context.CancelFunc, run func(context.Context) error) (stop func()) {
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
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
	})
	tb.Cleanup(stop)
	return stop
}

// Runner is a component with the life of agent.Agent: Start, then Run
// until its context ends, then Close.
type Runner interface {
	Start(ctx context.Context) error
	Run(ctx context.Context) error
	Close()
}

// Run starts r and runs it (as Go does), both with the context the stop
// ends, failing tb (FailNow, after closing r) if it does not start. Its
// stop is Go's, and closes r after.
func Run(tb testing.TB, r Runner) (stop func()) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	if err := r.Start(ctx); err != nil {
		cancel()
		r.Close()
		tb.Fatalf("start: %v", err)
	}
	stopRun := goWith(tb, ctx, cancel, r.Run)
	stop = sync.OnceFunc(func() {
		stopRun()
		r.Close()
	})
	tb.Cleanup(stop)
	return stop
}

// RepoPath is the absolute path of p, a path relative to the
// repository's root, wherever the test runs.
func RepoPath(p string) string {
	_, here, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(here), "..", "..", p)
}

// FreeAddr is a free port of 127.0.0.1 (host:port), for a listener a
// test starts later or for an address where nothing listens; a race with
// another taker fails that start loudly.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = ln.Close() }() // freed for the taker
	return ln.Addr().String()
}
