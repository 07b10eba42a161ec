package testkit

import (
	"errors"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// Eventually polls cond until it holds, and fails tb (FailNow) when
// within has passed first, naming what was awaited. Use it for what
// nothing signals to the test; a channel, an observer or a Changed
// notification is better where the code offers one.
func Eventually(tb testing.TB, within time.Duration, what string, cond func() bool) {
	tb.Helper()
	Until(tb, within, func() error {
		if cond() {
			return nil
		}
		return errors.New(what)
	})
}

// Until is Eventually for a condition that can say why it does not
// hold yet: cond returns nil once it holds, and the failure reports its
// last error (the state the test saw, against the one it wanted).
func Until(tb testing.TB, within time.Duration, cond func() error) {
	tb.Helper()
	deadline := time.Now().Add(within)
	for pause := 100 * time.Microsecond; ; pause = min(2*pause, 10*time.Millisecond) {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("not within %s: %v", within, err)
		}
		time.Sleep(pause)
	}
}

// Receive returns the next value from ch, and fails tb (FailNow) when
// within passes first, naming what was awaited. A closed channel yields
// its zero value, as a receive does.
func Receive[T any](tb testing.TB, ch <-chan T, within time.Duration, what string) T {
	tb.Helper()
	t := time.NewTimer(within)
	defer t.Stop()
	select {
	case v := <-ch:
		return v
	case <-t.C:
		tb.Fatalf("not within %s: %s", within, what)
		panic("unreachable")
	}
}

// GoroutineIn reports whether some goroutine's stack names every one of
// funcs (substrings of its frames, such as "(*Driver).lockEntry" and
// "sync.(*Mutex).Lock"): the only way to see that a goroutine waits on
// a mutex, for Eventually to await.
func GoroutineIn(funcs ...string) bool {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	for _, g := range strings.Split(string(buf), "\n\n") {
		if !slices.ContainsFunc(funcs, func(f string) bool { return !strings.Contains(g, f) }) {
			return true
		}
	}
	return false
}
