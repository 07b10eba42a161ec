package testkit

import (
	"slices"
	"testing"
	"time"
)

// TestClockRunsDueCallbacksInTimeOrderAtTheirOwnTime: a move runs the
// callbacks it passes, earliest first, each reading its own time, and
// one a callback schedules within the move; a cancelled one never runs;
// a step back runs nothing and AdvanceTo never steps back.
func TestClockRunsDueCallbacksInTimeOrderAtTheirOwnTime(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	c := NewClock(t0)
	var ran []time.Duration
	record := func() { ran = append(ran, c.Now().Sub(t0)) }
	c.AfterFunc(3*time.Second, record)
	c.AfterFunc(time.Second, func() { record(); c.AfterFunc(time.Second, record) })
	cancel := c.AfterFunc(2*time.Second, record)
	c.AfterFunc(10*time.Second, record)
	if !cancel() || cancel() {
		t.Fatal("cancel: want true once, then false")
	}
	c.Advance(5 * time.Second)
	if want := []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}; !slices.Equal(ran, want) || c.Now() != t0.Add(5*time.Second) {
		t.Fatalf("ran at %v, now %v; want %v, now +5s", ran, c.Now().Sub(t0), want)
	}
	if c.Pending() != 1 {
		t.Errorf("pending %d, want 1", c.Pending())
	}
	c.Set(t0)
	c.AdvanceTo(t0.Add(-time.Hour))
	if len(ran) != 3 || c.Now() != t0 {
		t.Fatalf("after a step back: ran %v, now %v", ran, c.Now().Sub(t0))
	}
	done := make(chan struct{})
	c.AfterFunc(0, func() { close(done) })
	Receive(t, done, 10*time.Second, "AfterFunc(0) running at once")
}
