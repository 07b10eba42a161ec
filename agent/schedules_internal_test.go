package agent

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/store"

	"github.com/sortie-edge/sortie/scenes"
	"github.com/sortie-edge/sortie/scenes/schedule"
)

// TestJitterKeepsFiringsInOrder: a jitter longer than the schedule's
// period never runs a firing after the next one, which would hold that
// one up until it counted as missed.
func TestJitterKeepsFiringsInOrder(t *testing.T) {
	c, err := schedule.ParseCron("*/5 * * * *")
	if err != nil {
		t.Fatal(err)
	}
	e := &scheduleEntry{s: scenes.Schedule{Scene: "s", Name: "1", Cron: c, Jitter: 20 * time.Minute}, loc: time.UTC, when: c}
	at := c.Next(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC), time.UTC)
	jittered := 0
	for range 1000 {
		next := c.Next(at, time.UTC)
		f := e.fireAt(at)
		if f.Before(at) || !f.Before(next) {
			t.Fatalf("the firing of %v runs at %v, not before the next instant %v", at, f, next)
		}
		if f.After(at) {
			jittered++
		}
		at = next
	}
	if jittered < 900 {
		t.Errorf("only %d of 1000 firings jittered", jittered)
	}
}

// TestFiringIDsAreStableAndBounded: the request ID of a firing is the
// same on every run, readable, and within the ID limit however long the
// names.
func TestFiringIDsAreStableAndBounded(t *testing.T) {
	at := time.Date(2026, 12, 2, 6, 0, 0, 0, time.FixedZone("CET", 3600))
	s := scenes.Schedule{Scene: "good_morning", Name: "weekdays"}
	if got := firingID(s, at); got != "sched-good_morning-weekdays-20261202T050000Z" {
		t.Errorf("firingID = %q", got)
	}
	long := scenes.Schedule{Scene: strings.Repeat("x", 128), Name: "n"}
	if id := firingID(long, at); len(id) > 128 || id != firingID(long, at) {
		t.Errorf("long firing ID %q (%d bytes)", id, len(id))
	}
}

// TestABackOffFromBeforeTheClockWasSteppedBackIsDropped: a firing's
// back-off set while the clock read 2030 does not hold the schedule
// until 2030 once the clock reads 2026.
func TestABackOffFromBeforeTheClockWasSteppedBackIsDropped(t *testing.T) {
	c, err := schedule.ParseCron("* * * * *")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 3, 1, 10, 0, 30, 0, time.UTC)
	e := &scheduleEntry{s: scenes.Schedule{Scene: "s", Name: "1", Cron: c}, loc: time.UTC, when: c,
		cursor: now.Add(-30 * time.Second), retry: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), backoff: time.Minute}
	e.next = c.Next(e.cursor, time.UTC)
	sc := &scheduler{log: slog.New(slog.DiscardHandler), entries: []*scheduleEntry{e}}
	sc.checkClock(now)
	if !e.retry.IsZero() {
		t.Fatalf("retry = %v, want none", e.retry)
	}
	if due := sc.dueAt(now.Add(30 * time.Second)); len(due) != 1 {
		t.Fatalf("%d schedules due at 10:01, want 1", len(due))
	}
}

// TestSchedulesWaitForAClockThatIsNotSet: at 1970 (a gateway booted
// without a clock battery, before NTP) nothing is due and no cursor is
// moved back to it.
func TestSchedulesWaitForAClockThatIsNotSet(t *testing.T) {
	sc := &scheduler{log: slog.New(slog.DiscardHandler)}
	if sc.clockSet(time.Unix(3600, 0)) || !sc.clockSet(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Fatal("clockSet does not tell 1970 from 2026")
	}
}

// failingTraces refuses writes until told otherwise.
type failingTraces struct {
	mu     sync.Mutex
	fail   bool
	writes chan int
}

func (f *failingTraces) AddTraces(_ context.Context, evs []store.Evaluation, _ []store.Cursor) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail {
		f.fail = false // the next try succeeds
		return errors.New("disk full")
	}
	f.writes <- len(evs)
	return nil
}

func (f *failingTraces) Trace(context.Context, string) (store.Trace, error) {
	return store.Trace{}, driver.ErrNotFound
}

// TestARefusedTraceBatchIsWrittenLaterByItself: records the store
// refused are written on a later try without another record to wake
// the writer.
func TestARefusedTraceBatchIsWrittenLaterByItself(t *testing.T) {
	db := &failingTraces{fail: true, writes: make(chan int, 1)}
	tr := newTracer(db, slog.New(slog.DiscardHandler), 10*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- tr.run(ctx) }()
	tr.record(store.Evaluation{RequestID: "r-1", Outcome: outcomeRejected})
	n := testkit.Receive(t, db.writes, 10*time.Second, "the refused record was never written again")
	if n != 1 {
		t.Fatalf("wrote %d records, want 1", n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run: %v", err)
	}
}
