package agent

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/scenes"
)

// resumeSpy is a Missions that records Resume calls.
type resumeSpy struct {
	Missions
	resumed chan string
}

func (s *resumeSpy) Resume(_ context.Context, id string) (*driver.Mission, error) {
	s.resumed <- id
	return &driver.Mission{ID: id, State: driver.StateRunning}, nil
}

// TestQueuedRunStartsEvenWhenJobsAreFull: the note that a run ended is
// not a slot in the job queue, so a burst of triggers cannot make a held
// run wait forever; and a retried mission counts as a running run again.
func TestQueuedRunStartsEvenWhenJobsAreFull(t *testing.T) {
	reg, err := devices.LoadRegistry(testkit.RepoPath("configs/devices.toml"))
	if err != nil {
		t.Fatal(err)
	}
	cat, err := scenes.Load(testkit.RepoPath("configs/scenes"), reg)
	if err != nil {
		t.Fatal(err)
	}
	spy := &resumeSpy{resumed: make(chan string, 4)}
	trig := newTriggers(slog.New(slog.NewTextHandler(io.Discard, nil)), cat, spy, discardPublisher{}, newAgentTopics("sortie", "t"), nil)
	now := time.Now()
	running := &driver.Mission{ID: "run-1", Type: "leave_home", State: driver.StateStepRunning, Meta: driver.Metadata{Created: now, Started: now}}
	held := &driver.Mission{ID: "held-2", Type: "leave_home", State: driver.StatePaused, Meta: driver.Metadata{Created: now.Add(time.Second)}}
	trig.seed([]*driver.Mission{running, held})
	for len(trig.jobs) < cap(trig.jobs) {
		trig.jobs <- triggerJob{payload: []byte("x")}
	}
	done := *running
	done.State = driver.StateSucceeded
	trig.Observe(driver.Event{MissionID: "run-1", Input: driver.InComplete, From: driver.StateRunning, To: driver.StateSucceeded}, &done)
	testkit.Go(t, trig.Run)
	id := testkit.Receive(t, spy.resumed, 10*time.Second, "the held run never started")
	if id != "held-2" {
		t.Fatalf("resumed %s, want held-2", id)
	}

	// An operator retries the finished run: it is live again.
	retried := done
	retried.State = driver.StateRunning
	trig.Observe(driver.Event{MissionID: "run-1", Input: driver.InRetry, From: driver.StateFailed, To: driver.StateRunning}, &retried)
	found := false
	for _, id := range trig.runs("leave_home") {
		found = found || id == "run-1"
	}
	if !found {
		t.Errorf("retried mission not tracked: %v", trig.runs("leave_home"))
	}
}
