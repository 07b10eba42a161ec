package testkit

import (
	"sort"
	"sync"
	"time"
)

// Clock is a manual clock, a driver.Clock that moves only when a test
// moves it: Advance and Set run the AfterFunc callbacks that fall due, in
// time order, on the caller's goroutine. It is safe for concurrent use.
type Clock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*timer
}

type timer struct {
	at      time.Time
	f       func()
	stopped bool
}

// NewClock returns a clock that reads now until it is moved.
func NewClock(now time.Time) *Clock { return &Clock{now: now} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc schedules f for when the clock has moved d on; the function
// returned cancels it and reports whether it was still pending. A d of
// zero or less runs f at once on a goroutine of its own, as
// time.AfterFunc does.
func (c *Clock) AfterFunc(d time.Duration, f func()) func() bool {
	if d <= 0 {
		go f()
		return func() bool { return false }
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &timer{at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		was := !t.stopped
		t.stopped = true
		c.drop(t)
		return was
	}
}

func (c *Clock) drop(t *timer) {
	for i, x := range c.timers {
		if x == t {
			c.timers = append(c.timers[:i], c.timers[i+1:]...)
			return
		}
	}
}

// Advance moves the clock d on, running the callbacks that fall due on
// the way, each with the clock at its own time.
func (c *Clock) Advance(d time.Duration) { c.Set(c.Now().Add(d)) }

// Set moves the clock to t, running the callbacks due by then; a t
// before the clock's time steps it back and runs nothing (a wall clock
// set back by NTP).
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	for {
		sort.SliceStable(c.timers, func(i, j int) bool { return c.timers[i].at.Before(c.timers[j].at) })
		if len(c.timers) == 0 || c.timers[0].at.After(t) {
			break
		}
		due := c.timers[0]
		c.timers = c.timers[1:]
		due.stopped = true
		if due.at.After(c.now) {
			c.now = due.at
		}
		c.mu.Unlock()
		due.f() // unlocked: it may read the clock or schedule again
		c.mu.Lock()
	}
	c.now = t
	c.mu.Unlock()
}

// AdvanceTo moves the clock to t if t is ahead of it, as Set does, and
// leaves it where it is otherwise: for a due time that may have passed.
func (c *Clock) AdvanceTo(t time.Time) {
	if t.After(c.Now()) {
		c.Set(t)
	}
}

// Pending counts the callbacks neither run nor cancelled.
func (c *Clock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}
