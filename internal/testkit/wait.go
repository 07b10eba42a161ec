package testkit

import (
	"testing"
	"time"
)

// Eventually polls cond until it holds, and fails tb (FailNow) when
// within has passed first, naming what was awaited. Use it for what
// nothing signals to the test; a channel, an observer or a Changed
// notification is better where the code offers one.
func Eventually(tb testing.TB, within time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(within)
	for pause := 100 * time.Microsecond; !cond(); pause = min(2*pause, 10*time.Millisecond) {
		if time.Now().After(deadline) {
			tb.Fatalf("not within %s: %s", within, what)
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
