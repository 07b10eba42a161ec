package driver

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// wallClock is the system clock without monotonic readings (as times read
// back from the store are) whose wall time can be stepped back, as NTP does.
type wallClock struct{ back atomic.Int64 }

func (c *wallClock) Now() time.Time {
	return time.Now().Round(0).Add(-time.Duration(c.back.Load()))
}
func (c *wallClock) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}

// armLocked skips re-arming when the earliest wake equals the time of a
// timer that has already fired; if the timer fired "early" by the wall
// clock, nothing ever wakes the loop for that mission again.
func TestReviewTimerNotRearmedAfterWallClockStepBack(t *testing.T) {
	clk := &wallClock{}
	var calls atomic.Int32
	h := HandlerFunc(func(ctx context.Context, req StepRequest) (map[string]any, error) {
		if calls.Add(1) == 1 {
			return nil, RetryableError("busy", errors.New("busy"))
		}
		return nil, nil
	})
	d, _ := New(Options{Store: newMemStore(t), Clock: clk, Handlers: map[string]Handler{"test": h}})
	d.Start(context.Background())
	defer d.Stop(context.Background())
	st := steps("a")
	st[0].Retry = RetryPolicy{MaxAttempts: 3, InitialBackoff: Duration(300 * time.Millisecond)}
	m, _, _ := d.Submit(context.Background(), Spec{Type: "t", Steps: st})
	time.Sleep(50 * time.Millisecond)
	clk.back.Store(int64(200 * time.Millisecond)) // wall clock steps back 200ms
	time.Sleep(2 * time.Second)                   // the wall clock is long past the retry time
	if got := get(t, d, m.ID); got.State != StateSucceeded {
		t.Errorf("mission still %s after 2s; retry was due 300ms after the failure (calls %d, NextWake %v, now %v)",
			got.State, calls.Load(), d.NextWake().Format(time.StampMilli), clk.Now().Format(time.StampMilli))
	}
}
