package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/scenes"
)

// The trigger service's scene modes, idempotency, rejections and
// shutdown, against fakeMissions: no broker, no store, no sleeps.

func TestSingleModeRejectsASecondRunUntilTheFirstEnds(t *testing.T) {
	for _, end := range []driver.State{driver.StateSucceeded, driver.StateFailed, driver.StateCancelled} {
		t.Run("first run "+strings.ToLower(string(end)), func(t *testing.T) {
			f := newModesFixture(t)
			f.run(t)
			first := f.call(t, "solo", "r-1")
			wantAccepted(t, first, driver.StateStepRunning, false)

			second := f.call(t, "solo", "r-2")
			wantRejected(t, second, scenes.ReasonAlreadyRunning)
			if second.RequestID != "r-2" || second.Scene != "solo" || !strings.Contains(second.Message, first.MissionID) {
				t.Errorf("rejection %+v, want it to echo r-2 and solo and name the running %s", second, first.MissionID)
			}
			if n := len(f.fake.submitted()); n != 1 {
				t.Errorf("%d submits, want 1: a rejected trigger creates nothing", n)
			}

			f.fake.end(t, first.MissionID, end)
			third := f.call(t, "solo", "r-3")
			wantAccepted(t, third, driver.StateStepRunning, false)
			if third.MissionID == first.MissionID {
				t.Errorf("third trigger got the first mission %s", first.MissionID)
			}
			if got := holds(f.fake.submitted()); !slices.Equal(got, []bool{false, false}) {
				t.Errorf("submitted held %v, want no run held", got)
			}
		})
	}
}

func TestRestartModeCancelsTheRunningMission(t *testing.T) {
	const reason = "replaced by a new run of again (restart mode, request r-2)"
	cases := []struct {
		name string
		// cancel is the driver's answer to CancelFor the running mission.
		cancel func(*driver.Mission) (driver.State, error)
		// held: the new run waits for the old one to end.
		held bool
	}{
		{"step in flight: the new run waits until the old one ends", nil, true},
		{"cancelled before its step ran: the new run starts at once",
			func(*driver.Mission) (driver.State, error) { return driver.StateCancelled, nil }, false},
		{"already ended: the new run starts at once",
			func(m *driver.Mission) (driver.State, error) {
				return "", fmt.Errorf("%w: %s is SUCCEEDED", driver.ErrTerminal, m.ID)
			}, false},
		{"cancel refused while compensating: the new run waits until the old one ends",
			func(m *driver.Mission) (driver.State, error) {
				return "", &driver.TransitionError{From: driver.StateCompensating, Input: driver.InCancel}
			}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newModesFixture(t)
			f.fake.cancel = c.cancel
			f.run(t)
			old := f.call(t, "again", "r-1")
			wantAccepted(t, old, driver.StateStepRunning, false)

			state := driver.StateStepRunning
			if c.held {
				state = driver.StatePaused
			}
			next := f.call(t, "again", "r-2")
			wantAccepted(t, next, state, false)
			if got, want := f.fake.cancelled(), []cancelCall{{old.MissionID, reason}}; !slices.Equal(got, want) {
				t.Errorf("CancelFor calls %v, want %v", got, want)
			}
			if got := holds(f.fake.submitted()); !slices.Equal(got, []bool{false, c.held}) {
				t.Errorf("submitted held %v, want [false %v]", got, c.held)
			}
			if c.held {
				f.fake.end(t, old.MissionID, driver.StateCancelled)
				f.fake.waitResumed(t, next.MissionID)
			}
		})
	}
}

// TestRestartModeReplacesEveryRunOfTheScene: a trigger that arrives while
// an earlier replacement still waits cancels that one too; only the
// newest run starts once the cancelled run has ended.
func TestRestartModeReplacesEveryRunOfTheScene(t *testing.T) {
	f := newModesFixture(t)
	f.run(t)
	a := f.call(t, "again", "r-1")
	b := f.call(t, "again", "r-2")
	wantAccepted(t, b, driver.StatePaused, false)
	c := f.call(t, "again", "r-3")
	wantAccepted(t, c, driver.StatePaused, false)
	want := []cancelCall{
		{a.MissionID, "replaced by a new run of again (restart mode, request r-2)"},
		{a.MissionID, "replaced by a new run of again (restart mode, request r-3)"},
		{b.MissionID, "replaced by a new run of again (restart mode, request r-3)"},
	}
	if got := f.fake.cancelled(); !slices.Equal(got, want) {
		t.Errorf("CancelFor calls %v, want %v", got, want)
	}
	f.fake.end(t, a.MissionID, driver.StateCancelled)
	f.fake.waitResumed(t, c.MissionID)
}

func TestQueuedModeStartsHeldRunsOneAtATimeInOrder(t *testing.T) {
	f := newModesFixture(t)
	f.run(t)
	first := f.call(t, "line", "q-1")
	wantAccepted(t, first, driver.StateStepRunning, false)
	var held []string
	for _, id := range []string{"q-2", "q-3", "q-4", "q-5"} {
		r := f.call(t, "line", id)
		wantAccepted(t, r, driver.StatePaused, false)
		held = append(held, r.MissionID)
	}
	if got := holds(f.fake.submitted()); !slices.Equal(got, []bool{false, true, true, true, true}) {
		t.Errorf("submitted held %v, want all but the first held", got)
	}
	if n := len(f.fake.cancelled()); n != 0 {
		t.Errorf("%d CancelFor calls, want none in queued mode", n)
	}

	f.fake.end(t, first.MissionID, driver.StateSucceeded)
	f.fake.waitResumed(t, held[0])
	// A failed run frees the queue as a succeeded one does.
	f.fake.end(t, held[0], driver.StateFailed)
	f.fake.waitResumed(t, held[0], held[1])
	// An operator cancels a held run: it is skipped, not started.
	f.fake.end(t, held[2], driver.StateCancelled)
	f.fake.end(t, held[1], driver.StateSucceeded)
	f.fake.waitResumed(t, held[0], held[1], held[3])
	f.fake.end(t, held[3], driver.StateSucceeded)

	// The queue is empty: the next trigger runs at once.
	last := f.call(t, "line", "q-6")
	wantAccepted(t, last, driver.StateStepRunning, false)
}

func TestParallelModeRunsSideBySide(t *testing.T) {
	const n = 3
	f := newModesFixture(t)
	f.run(t)
	inside, release := holdSubmits(t, f, n)
	replies := make(chan scenes.Reply, n)
	for i := range n {
		go func() {
			r, _ := f.trig.Call(context.Background(), scenes.Trigger{Scene: "many", RequestID: fmt.Sprintf("p-%d", i)})
			replies <- r
		}()
	}
	// Every trigger reaches the driver before any returns: parallel
	// triggers do not wait for each other's decision.
	for i := range n {
		select {
		case <-inside:
		case <-time.After(waitLimit):
			t.Fatalf("%d of %d triggers of a parallel scene reached Submit together, want all", i, n)
		}
	}
	release()
	ids := map[string]bool{}
	for range n {
		r := <-replies
		wantAccepted(t, r, driver.StateStepRunning, false)
		ids[r.MissionID] = true
	}
	if len(ids) != n {
		t.Errorf("missions %v, want %d distinct", ids, n)
	}
	if got := holds(f.fake.submitted()); slices.Contains(got, true) {
		t.Errorf("submitted held %v, want none held", got)
	}
	if len(f.fake.cancelled()) != 0 || len(f.fake.resumed()) != 0 {
		t.Errorf("CancelFor %v, Resume %v: parallel runs ignore each other", f.fake.cancelled(), f.fake.resumed())
	}
}

// holdSubmits makes the fake's Submit wait until release: inside hears
// of each submit that waits. Call it after run (cleanups run last
// first: the release at the test's end comes before Run's stop) and
// before the first trigger.
func holdSubmits(t testing.TB, f *modesFixture, n int) (inside <-chan struct{}, release func()) {
	in, gate := make(chan struct{}, n), make(chan struct{})
	f.fake.beforeSubmit = func(driver.Spec) {
		in <- struct{}{}
		<-gate
	}
	release = sync.OnceFunc(func() { close(gate) })
	t.Cleanup(release)
	return in, release
}

func TestRepeatedRequestIDReturnsTheFirstMission(t *testing.T) {
	f := newModesFixture(t)
	f.run(t)
	first := f.call(t, "solo", "r-1")

	// While it runs: the first mission again, not already_running.
	again := f.call(t, "solo", "r-1")
	wantAccepted(t, again, driver.StateStepRunning, true)
	if again.MissionID != first.MissionID {
		t.Errorf("repeated request got %s, want %s", again.MissionID, first.MissionID)
	}
	// After it ended: the mission in its final state.
	f.fake.end(t, first.MissionID, driver.StateSucceeded)
	done := f.call(t, "solo", "r-1")
	wantAccepted(t, done, driver.StateSucceeded, true)
	// The ID is the whole key, whatever the scene (docs/protocol.md).
	other := f.call(t, "many", "r-1")
	wantAccepted(t, other, driver.StateSucceeded, true)
	if other.MissionID != first.MissionID || other.Scene != "solo" {
		t.Errorf("request ID reused for another scene: %+v, want the solo mission %s", other, first.MissionID)
	}
	// Over MQTT, on the request's reply topic.
	f.publish(`{"scene":"solo","request_id":"r-1"}`)
	topic, r := f.reply(t)
	wantAccepted(t, r, driver.StateSucceeded, true)
	if topic != "r-1" || r.MissionID != first.MissionID || r.RequestID != "r-1" {
		t.Errorf("MQTT duplicate on %s: %+v, want on r-1 for %s", topic, r, first.MissionID)
	}
	if n := len(f.fake.submitted()); n != 1 {
		t.Errorf("%d submits, want 1: a repeated request submits nothing", n)
	}
}

// TestConcurrentDuplicatesOfAParallelSceneMakeOneMission: parallel
// triggers are not serialised, so two with one request ID can both miss
// in Lookup; the driver's request-key index then answers the second
// with the first mission, and the reply says duplicate.
func TestConcurrentDuplicatesOfAParallelSceneMakeOneMission(t *testing.T) {
	f := newModesFixture(t)
	f.run(t)
	inside, release := holdSubmits(t, f, 2)
	replies := make(chan scenes.Reply, 2)
	for range 2 {
		go func() {
			r, _ := f.trig.Call(context.Background(), scenes.Trigger{Scene: "many", RequestID: "same"})
			replies <- r
		}()
	}
	for range 2 {
		testkit.Receive(t, inside, waitLimit, "both triggers did not reach Submit together")
	}
	release()
	a, b := <-replies, <-replies
	if a.Duplicate == b.Duplicate || a.MissionID != b.MissionID || a.MissionID == "" {
		t.Errorf("replies %+v and %+v, want one mission, one of them duplicate", a, b)
	}
	if got := f.fake.lookedUp(); !slices.Equal(got, []string{"same", "same"}) {
		t.Errorf("lookups %v, want both triggers looked up", got)
	}
}

func TestBadTriggersAreRejectedOnTheReplyTopic(t *testing.T) {
	f := newModesFixture(t)
	f.run(t)
	big := `{"scene":"solo","request_id":"big","params":{"x":"` + strings.Repeat("a", scenes.MaxTriggerSize) + `"}}`
	cases := []struct {
		name, payload string
		// topic is the reply topic's last segment; echo the reply's
		// request_id; scene the reply's scene.
		topic, echo, scene, reason string
	}{
		{"not json", `hello`, "_invalid", "", "", scenes.ReasonBadJSON},
		{"not an object", `[1]`, "_invalid", "", "", scenes.ReasonBadJSON},
		{"data after the object", `{"scene":"solo","request_id":"b0"} {}`, "_invalid", "", "", scenes.ReasonBadJSON},
		{"over 16 KiB", big, "_invalid", "", "", scenes.ReasonTooLarge},
		{"unknown field", `{"scene":"solo","request_id":"b1","sceen":"x"}`, "b1", "b1", "", scenes.ReasonInvalidField},
		{"missing scene", `{"request_id":"b2"}`, "b2", "b2", "", scenes.ReasonMissingField},
		{"missing request id", `{"scene":"solo"}`, "_invalid", "", "", scenes.ReasonMissingField},
		{"request id with a slash", `{"scene":"solo","request_id":"a/b"}`, "_invalid", "a/b", "", scenes.ReasonInvalidField},
		{"request id with a wildcard", `{"scene":"solo","request_id":"a+b"}`, "_invalid", "a+b", "", scenes.ReasonInvalidField},
		{"params not an object", `{"scene":"cool","request_id":"b3","params":[1]}`, "b3", "b3", "", scenes.ReasonInvalidField},
		{"unknown scene", `{"scene":"nope","request_id":"b4"}`, "b4", "b4", "nope", scenes.ReasonUnknownScene},
		{"param out of range", `{"scene":"cool","request_id":"b5","params":{"temperature":40}}`, "b5", "b5", "cool", scenes.ReasonInvalidParam},
		{"param of the wrong type", `{"scene":"cool","request_id":"b6","params":{"temperature":"hot"}}`, "b6", "b6", "cool", scenes.ReasonInvalidParam},
		{"param the scene does not read", `{"scene":"solo","request_id":"b7","params":{"temperature":21}}`, "b7", "b7", "solo", scenes.ReasonInvalidParam},
		{"param not a scalar", `{"scene":"cool","request_id":"b8","params":{"temperature":[21]}}`, "b8", "b8", "", scenes.ReasonInvalidParam},
	}
	counts := map[string]float64{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f.publish(c.payload)
			topic, r := f.reply(t)
			wantRejected(t, r, c.reason)
			if topic != c.topic || r.RequestID != c.echo || r.Scene != c.scene {
				t.Errorf("reply on %s: %+v, want on %s with request_id %q, scene %q", topic, r, c.topic, c.echo, c.scene)
			}
			if c.reason == scenes.ReasonInvalidParam && c.scene != "" && !strings.Contains(r.Message, "temperature") {
				t.Errorf("message %q does not name the parameter", r.Message)
			}
		})
		counts[c.reason]++
	}
	if n := len(f.fake.submitted()); n != 0 {
		t.Errorf("%d submits, want none: a rejected trigger creates nothing", n)
	}
	for reason, want := range counts {
		if got := testutil.ToFloat64(f.metrics.rejections.WithLabelValues(reason)); got != want {
			t.Errorf("rejections{reason=%q} = %v, want %v", reason, got, want)
		}
	}
}

// TestAcceptedTriggerBecomesTheMissionSpec: a trigger over MQTT is
// submitted with its request ID as the request key, its source, its
// parameters and the gateway label, and accepted on its reply topic.
func TestAcceptedTriggerBecomesTheMissionSpec(t *testing.T) {
	f := newModesFixture(t)
	f.run(t)
	f.publish(`{"scene":"cool","request_id":"r-1","source":"alexa","params":{"temperature":21}}`)
	topic, r := f.reply(t)
	wantAccepted(t, r, driver.StateStepRunning, false)
	if topic != "r-1" || r.RequestID != "r-1" || r.Scene != "cool" {
		t.Errorf("reply on %s: %+v, want on r-1 for cool", topic, r)
	}
	specs := f.fake.submitted()
	if len(specs) != 1 {
		t.Fatalf("%d submits, want 1", len(specs))
	}
	s := specs[0]
	if s.Type != "cool" || s.RequestKey != "r-1" || s.Source != "alexa" || len(s.Labels) != 0 ||
		s.Values["temperature"] != int64(21) || s.Hold || len(s.Steps) != 1 {
		t.Errorf("spec %+v, want cool with key r-1, source alexa, no labels, temperature 21, not held", s)
	}
}

// TestDriverFailuresBecomeReasons: what the driver answers decides the
// rejection's reason, and a failed lookup submits nothing.
func TestDriverFailuresBecomeReasons(t *testing.T) {
	cases := []struct {
		name                 string
		submitErr, lookupErr error
		reason               string
		submits              int
	}{
		{"driver stopping", fmt.Errorf("submit: %w", driver.ErrClosed), nil, scenes.ReasonShuttingDown, 1},
		{"driver refuses the mission", fmt.Errorf("%w: priority 101", driver.ErrInvalid), nil, scenes.ReasonInvalidParam, 1},
		{"too many missions live (max_live)", fmt.Errorf("%w: 1000 missions are live, the bound", driver.ErrFull), nil, scenes.ReasonOverloaded, 1},
		{"store fails to create", errors.New("disk full"), nil, scenes.ReasonInternal, 1},
		{"store fails to look up", nil, errors.New("disk unreadable"), scenes.ReasonInternal, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newModesFixture(t)
			f.fake.submitErr, f.fake.lookupErr = c.submitErr, c.lookupErr
			f.run(t)
			f.publish(`{"scene":"many","request_id":"r-1"}`)
			topic, r := f.reply(t)
			wantRejected(t, r, c.reason)
			if topic != "r-1" || r.Scene != "many" {
				t.Errorf("reply on %s: %+v, want on r-1 for many", topic, r)
			}
			if n := len(f.fake.submitted()); n != c.submits {
				t.Errorf("%d submits, want %d", n, c.submits)
			}
		})
	}
}

// TestFullQueueRejectsOverloaded: with every job slot taken, Call fails
// with api.ErrOverloaded and an MQTT trigger is answered overloaded at
// once, both without asking the driver; once the queue drains, triggers
// are decided again.
func TestFullQueueRejectsOverloaded(t *testing.T) {
	f := newModesFixture(t)
	for len(f.trig.jobs) < cap(f.trig.jobs) {
		f.trig.jobs <- triggerJob{payload: []byte("x")}
	}
	if _, err := f.trig.Call(context.Background(), scenes.Trigger{Scene: "many", RequestID: "r-call"}); !errors.Is(err, api.ErrOverloaded) {
		t.Errorf("Call on a full queue: %v, want api.ErrOverloaded", err)
	}
	f.publish(`{"scene":"many","request_id":"r-mqtt"}`)
	topic, r := f.reply(t)
	wantRejected(t, r, scenes.ReasonOverloaded)
	if topic != "r-mqtt" || r.RequestID != "r-mqtt" {
		t.Errorf("overloaded reply on %s: %+v, want on r-mqtt", topic, r)
	}
	if got := testutil.ToFloat64(f.metrics.rejections.WithLabelValues(scenes.ReasonOverloaded)); got != 2 {
		t.Errorf("overloaded rejections %v, want 2", got)
	}
	if len(f.fake.lookedUp()) != 0 || len(f.fake.submitted()) != 0 {
		t.Errorf("the driver was asked: lookups %v, submits %v", f.fake.lookedUp(), f.fake.submitted())
	}

	f.run(t)
	for range cap(f.trig.jobs) { // each filler is answered bad_json once decided
		if _, r := f.reply(t); r.Reason != scenes.ReasonBadJSON {
			t.Fatalf("reply to a filler: %+v", r)
		}
	}
	wantAccepted(t, f.call(t, "many", "r-after"), driver.StateStepRunning, false)
}

// TestStopWaitsForTheTriggerBeingDecided: when Run's context ends, a
// trigger already with the driver is still decided and answered before
// Run returns.
func TestStopWaitsForTheTriggerBeingDecided(t *testing.T) {
	f := newModesFixture(t)
	run := f.run(t)
	inside, release := holdSubmits(t, f, 1)
	f.publish(`{"scene":"solo","request_id":"r-stop"}`)
	testkit.Receive(t, inside, waitLimit, "the trigger never reached Submit")
	run.cancel()
	select {
	case err := <-run.done:
		run.done <- err // for the stop at the end
		t.Fatal("Run returned while a trigger was with the driver")
	default:
	}
	release()
	run.stop(t)
	select {
	case s := <-f.pub:
		if !strings.HasPrefix(s, replyTopic+"r-stop ") || !strings.Contains(s, `"status":"accepted"`) {
			t.Errorf("reply %s, want accepted on r-stop", s)
		}
	default:
		t.Error("Run returned before the trigger in hand was answered")
	}
}

// TestAfterStopTriggersAreAnsweredShuttingDown: once Run has returned,
// nothing decides triggers any more, so each is answered shutting_down
// at once (the sender retries with the same request ID when the agent is
// back) instead of waiting unanswered; none reaches the driver.
func TestAfterStopTriggersAreAnsweredShuttingDown(t *testing.T) {
	f := newModesFixture(t)
	f.run(t).stop(t)

	rep, err := f.trig.Call(context.Background(), scenes.Trigger{Scene: "many", RequestID: "r-late"})
	if err != nil || rep.Reason != scenes.ReasonShuttingDown || rep.RequestID != "r-late" {
		t.Errorf("Call after stop: %+v, %v; want a shutting_down reply", rep, err)
	}
	f.publish(`{"scene":"many","request_id":"r-mqtt"}`)
	select {
	case s := <-f.pub:
		if !strings.HasPrefix(s, replyTopic+"r-mqtt ") || !strings.Contains(s, `"reason":"shutting_down"`) {
			t.Errorf("reply %s, want shutting_down on r-mqtt", s)
		}
	default:
		t.Error("an MQTT trigger after stop got no reply")
	}
	if len(f.fake.lookedUp()) != 0 || len(f.fake.submitted()) != 0 {
		t.Errorf("the driver was asked after stop: lookups %v, submits %v", f.fake.lookedUp(), f.fake.submitted())
	}
}

// TestTriggerCaughtByShutdownIsShuttingDown: a trigger a worker takes as
// Run's context ends is answered shutting_down, not internal: the
// driver refuses a done context, which is no store failure.
func TestTriggerCaughtByShutdownIsShuttingDown(t *testing.T) {
	f := newModesFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	f.fake.lookupErr = context.Canceled
	rep := f.trig.submit(ctx, scenes.Trigger{Scene: "many", RequestID: "r-caught"})
	if rep.Reason != scenes.ReasonShuttingDown {
		t.Errorf("reply %+v, want shutting_down", rep)
	}
}

// TestSeededRunsCountForModes: missions active when the service starts
// (seed, from the store) are runs of their scenes like any other.
func TestSeededRunsCountForModes(t *testing.T) {
	t0 := time.Date(2025, 12, 31, 23, 0, 0, 0, time.UTC)
	running := func(id, scene string) *driver.Mission {
		return &driver.Mission{ID: id, Type: scene, State: driver.StateStepRunning, Meta: driver.Metadata{Created: t0, Started: t0}}
	}
	// held is a run submitted held and never started; created orders them.
	held := func(id, scene string, created time.Duration) *driver.Mission {
		return &driver.Mission{ID: id, Type: scene, State: driver.StatePaused, Meta: driver.Metadata{Created: t0.Add(created)}}
	}
	cases := []struct {
		name   string
		seeded []*driver.Mission
		// scene is triggered once after the start; the reply is
		// rejected for reason, or else accepted in state.
		scene  string
		reason string
		state  driver.State
		// resumedAtStart are the runs Run starts at once; end then ends
		// the first seeded run and resumedAfter follow.
		resumedAtStart, resumedAfter []string
		cancels                      []string
	}{
		{name: "single: a run from before is running",
			seeded: []*driver.Mission{running("old", "solo")}, scene: "solo", reason: scenes.ReasonAlreadyRunning},
		{name: "restart: a run from before is replaced",
			seeded: []*driver.Mission{running("old", "again")}, scene: "again", state: driver.StatePaused,
			cancels: []string{"old"}, resumedAfter: []string{"m-001"}},
		{name: "restart: a replacement held before the start starts when the replaced run ends",
			seeded: []*driver.Mission{running("old", "again"), held("new", "again", time.Second)}, scene: "many", state: driver.StateStepRunning,
			resumedAfter: []string{"new"}},
		{name: "queued: held runs wait for the running one and start oldest first",
			seeded: []*driver.Mission{running("old", "line"), held("q-b", "line", 2*time.Second), held("q-a", "line", 3*time.Second)},
			scene:  "line", state: driver.StatePaused, resumedAfter: []string{"q-b"}},
		{name: "queued: a held run whose predecessor ended while the agent was down starts at once",
			seeded: []*driver.Mission{held("q-a", "line", time.Second), held("q-b", "line", 2*time.Second)}, scene: "line", state: driver.StatePaused,
			resumedAtStart: []string{"q-a"}},
		{name: "queued: a run an operator paused is running, not held",
			seeded: []*driver.Mission{func() *driver.Mission { m := running("old", "line"); m.State = driver.StatePaused; return m }()},
			scene:  "line", state: driver.StatePaused},
		{name: "parallel: runs from before do not matter",
			seeded: []*driver.Mission{running("old", "many")}, scene: "many", state: driver.StateStepRunning},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newModesFixture(t)
			f.trig.seed(f.fake.add(c.seeded...))
			f.run(t)
			// Run starts held runs before its workers take a trigger, so
			// once this reply is in, the start is over.
			r := f.call(t, c.scene, "r-1")
			if c.reason != "" {
				wantRejected(t, r, c.reason)
			} else {
				wantAccepted(t, r, c.state, false)
			}
			if got := f.fake.resumed(); !slices.Equal(got, c.resumedAtStart) {
				t.Errorf("resumed at start %v, want %v", got, c.resumedAtStart)
			}
			var cancels []string
			for _, cc := range f.fake.cancelled() {
				cancels = append(cancels, cc.id)
			}
			if !slices.Equal(cancels, c.cancels) {
				t.Errorf("cancelled %v, want %v", cancels, c.cancels)
			}
			if c.resumedAfter != nil {
				f.fake.end(t, c.seeded[0].ID, driver.StateSucceeded)
				f.fake.waitResumed(t, append(slices.Clone(c.resumedAtStart), c.resumedAfter...)...)
			}
		})
	}
}
