package agent

import (
	"strings"
	"testing"
	"time"

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
