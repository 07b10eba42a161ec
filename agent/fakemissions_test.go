package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/scenes"
)

// waitLimit bounds every wait of the trigger service tests: a wait that
// hits it is a failure, never the way a test synchronises.
const waitLimit = 10 * time.Second

// fakeMissions is the driver as the trigger service sees it (Missions),
// the seam the service is faked at: missions in memory, found by
// request key, and every call recorded. Like *driver.Driver it tells
// its observer (the trigger service) of each change before the call
// that made it returns; a test ends a run with end, as a driver worker
// would. The function fields change its answers; set them before the
// first trigger.
type fakeMissions struct {
	obs driver.Observer

	// beforeSubmit runs first in every Submit, outside the fake's lock,
	// so that a test can hold submits in flight.
	beforeSubmit func(driver.Spec)
	// submitErr and lookupErr, when set, are what Submit and Lookup
	// fail with.
	submitErr, lookupErr error
	// cancel decides what CancelFor does to a live mission (a copy):
	// the state it leaves it in, or an error. Nil does what the driver
	// does: a paused mission is cancelled at once, any other keeps its
	// state with the cancel requested (a step is in flight).
	cancel func(m *driver.Mission) (driver.State, error)

	mu       sync.Mutex
	clock    time.Time
	n        int
	missions map[string]*driver.Mission // by ID
	byKey    map[string]string          // request key -> mission ID
	submits  []driver.Spec
	cancels  []cancelCall
	resumes  []string
	lookups  []string
	changed  chan struct{} // closed and replaced after every call
}

type cancelCall struct{ id, reason string }

func newFakeMissions() *fakeMissions {
	return &fakeMissions{
		clock:    time.Date(2026, 1, 1, 8, 0, 0, 0, time.UTC),
		missions: map[string]*driver.Mission{},
		byKey:    map[string]string{},
		changed:  make(chan struct{}),
	}
}

// nowLocked is the fake's clock: each reading is a second after the
// last, so missions are created in call order.
func (f *fakeMissions) nowLocked() time.Time {
	f.clock = f.clock.Add(time.Second)
	return f.clock
}

// tell hands the observer events of m, as the driver does before the
// call that made them returns.
func (f *fakeMissions) tell(m *driver.Mission, evs ...driver.Event) {
	for _, ev := range evs {
		ev.MissionID, ev.Type, ev.Step = m.ID, m.Type, -1
		f.obs.Observe(ev, m)
	}
}

// notify wakes the waits; every call ends with it, after its events.
func (f *fakeMissions) notify() {
	f.mu.Lock()
	defer f.mu.Unlock()
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *fakeMissions) Submit(_ context.Context, spec driver.Spec) (*driver.Mission, bool, error) {
	if f.beforeSubmit != nil {
		f.beforeSubmit(spec)
	}
	defer f.notify()
	f.mu.Lock()
	f.submits = append(f.submits, spec)
	if f.submitErr != nil {
		f.mu.Unlock()
		return nil, false, f.submitErr
	}
	if id, ok := f.byKey[spec.RequestKey]; ok {
		m := f.missions[id].Clone()
		f.mu.Unlock()
		return m, false, nil // the store's request-key index
	}
	f.n++
	now := f.nowLocked()
	m := &driver.Mission{
		ID: fmt.Sprintf("m-%03d", f.n), Type: spec.Type, Priority: spec.Priority, State: driver.StateStepRunning,
		Meta: driver.Metadata{
			Created: now, Started: now, Updated: now, RequestKey: spec.RequestKey,
			Source: spec.Source, Labels: maps.Clone(spec.Labels),
		},
	}
	events := []driver.Event{
		{Input: driver.InSubmit, To: driver.StatePending},
		{Input: driver.InStart, From: driver.StatePending, To: driver.StateRunning},
		{Input: driver.InBeginStep, From: driver.StateRunning, To: driver.StateStepRunning},
	}
	if spec.Hold {
		m.State, m.Meta.Started = driver.StatePaused, time.Time{}
		events = []driver.Event{{Input: driver.InSubmit, To: driver.StatePaused}}
	}
	f.missions[m.ID] = m
	if spec.RequestKey != "" {
		f.byKey[spec.RequestKey] = m.ID
	}
	snap := m.Clone()
	f.mu.Unlock()
	f.tell(snap, events...)
	return snap.Clone(), true, nil
}

func (f *fakeMissions) CancelFor(_ context.Context, id, reason string) (*driver.Mission, error) {
	defer f.notify()
	f.mu.Lock()
	f.cancels = append(f.cancels, cancelCall{id, reason})
	m := f.missions[id]
	switch {
	case m == nil:
		f.mu.Unlock()
		return nil, fmt.Errorf("cancel %s: %w", id, driver.ErrNotFound)
	case m.State.Terminal():
		f.mu.Unlock()
		return m.Clone(), fmt.Errorf("%w: %s is %s", driver.ErrTerminal, id, m.State)
	}
	from, to := m.State, m.State
	if from == driver.StatePaused {
		to = driver.StateCancelled
	}
	if f.cancel != nil {
		var err error
		if to, err = f.cancel(m.Clone()); err != nil {
			f.mu.Unlock()
			return m.Clone(), err
		}
	}
	m.Control.Cancel, m.Control.CancelReason, m.State = true, reason, to
	snap := m.Clone()
	f.mu.Unlock()
	if to.Terminal() {
		f.tell(snap, driver.Event{Input: driver.InCancel, From: from, To: to, Detail: reason})
	}
	return snap.Clone(), nil
}

func (f *fakeMissions) Resume(_ context.Context, id string) (*driver.Mission, error) {
	defer f.notify()
	f.mu.Lock()
	f.resumes = append(f.resumes, id)
	m := f.missions[id]
	switch {
	case m == nil:
		f.mu.Unlock()
		return nil, fmt.Errorf("resume %s: %w", id, driver.ErrNotFound)
	case m.State != driver.StatePaused:
		f.mu.Unlock()
		return m.Clone(), &driver.TransitionError{From: m.State, Input: driver.InResume}
	}
	m.State = driver.StateRunning
	if m.Meta.Started.IsZero() {
		m.Meta.Started = f.nowLocked()
	}
	snap := m.Clone()
	f.mu.Unlock()
	f.tell(snap, driver.Event{Input: driver.InResume, From: driver.StatePaused, To: driver.StateRunning})
	return snap.Clone(), nil
}

func (f *fakeMissions) Lookup(_ context.Context, requestKey string) (*driver.Mission, error) {
	defer f.notify()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lookups = append(f.lookups, requestKey)
	if f.lookupErr != nil {
		return nil, f.lookupErr
	}
	id, ok := f.byKey[requestKey]
	if !ok {
		return nil, fmt.Errorf("request %s: %w", requestKey, driver.ErrNotFound)
	}
	return f.missions[id].Clone(), nil
}

// add stores missions that exist before the trigger service starts and
// returns copies of them, as the store's Active does, for seed.
func (f *fakeMissions) add(ms ...*driver.Mission) []*driver.Mission {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]*driver.Mission, 0, len(ms))
	for _, m := range ms {
		f.missions[m.ID] = m.Clone()
		if k := m.Meta.RequestKey; k != "" {
			f.byKey[k] = m.ID
		}
		out = append(out, m.Clone())
	}
	return out
}

// end finishes a live run as a driver worker would: the mission becomes
// state, a terminal one, and the observer hears of it.
func (f *fakeMissions) end(t testing.TB, id string, state driver.State) {
	t.Helper()
	in := map[driver.State]driver.Input{
		driver.StateSucceeded: driver.InComplete, driver.StateFailed: driver.InFail, driver.StateCancelled: driver.InCancel,
	}[state]
	f.mu.Lock()
	m := f.missions[id]
	if m == nil || m.State.Terminal() || in == "" {
		f.mu.Unlock()
		t.Fatalf("end %s as %s: no such live mission or not a terminal state", id, state)
	}
	from := m.State
	m.State = state
	snap := m.Clone()
	f.mu.Unlock()
	f.tell(snap, driver.Event{Input: in, From: from, To: state})
	f.notify()
}

func (f *fakeMissions) submitted() []driver.Spec {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.submits)
}

func (f *fakeMissions) cancelled() []cancelCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.cancels)
}

func (f *fakeMissions) resumed() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.resumes)
}

func (f *fakeMissions) lookedUp() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.lookups)
}

// waitResumed waits until Resume has been called as often as want has
// entries and checks that it was called for want, in order.
func (f *fakeMissions) waitResumed(t testing.TB, want ...string) {
	t.Helper()
	deadline := time.After(waitLimit)
	for {
		f.mu.Lock()
		got, ch := slices.Clone(f.resumes), f.changed
		f.mu.Unlock()
		if len(got) >= len(want) {
			if !slices.Equal(got, want) {
				t.Fatalf("resumed %v, want %v", got, want)
			}
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("resumed %v, want %v", got, want)
		}
	}
}

// modeScenes are the API tests' scenes (single "solo", parallel "many",
// parallel "cool" with a trigger parameter bounded by the registry at
// 16..30) plus a scene of each of the two other modes.
var modeScenes = apiScenes + `
[[scene]]
name = "again"
mode = "restart"
[[scene.step]]
delay = "1s"

[[scene]]
name = "line"
mode = "queued"
[[scene.step]]
delay = "1s"
`

// modesFixture is the real trigger service, with the real registry and
// scene catalogue, over fakeMissions; its replies go to pub.
type modesFixture struct {
	trig    *Triggers
	fake    *fakeMissions
	pub     chanPublisher
	metrics *instruments
}

// replyTopic is the fixture's reply topic prefix (gateway "gw").
const replyTopic = "sortie/gateways/gw/replies/"

func newModesFixture(t testing.TB) *modesFixture {
	t.Helper()
	reg, err := devices.LoadRegistry(testkit.RepoPath("configs/devices.toml"))
	if err != nil {
		t.Fatal(err)
	}
	cat, err := scenes.Parse([]byte(modeScenes), "modes.toml", reg)
	if err != nil {
		t.Fatal(err)
	}
	f := &modesFixture{fake: newFakeMissions(), pub: make(chanPublisher, 512), metrics: newInstruments()}
	f.trig = newTriggers(slog.New(slog.DiscardHandler), cat, f.fake, f.pub, newAgentTopics("sortie", "gw"), f.metrics)
	f.fake.obs = f.trig
	return f
}

// runner is a running trigger service.
type runner struct {
	cancel context.CancelFunc
	done   chan error
}

// run runs the trigger service; it is stopped, and checked to stop,
// when the test ends if not before.
func (f *modesFixture) run(t testing.TB) *runner {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &runner{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- f.trig.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop ends Run's context and waits for Run to return.
func (r *runner) stop(t testing.TB) {
	t.Helper()
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok && err != nil {
			t.Errorf("Run: %v", err)
		}
		if ok {
			close(r.done)
		}
	case <-time.After(waitLimit):
		t.Errorf("Run did not return after its context ended")
	}
}

// call decides a trigger through Call, as the HTTP API and the hub do.
func (f *modesFixture) call(t testing.TB, scene, requestID string) scenes.Reply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	r, err := f.trig.Call(ctx, scenes.Trigger{Scene: scene, RequestID: requestID, Source: "test"})
	if err != nil {
		t.Fatalf("trigger %s %s: %v", scene, requestID, err)
	}
	return r
}

// publish hands a payload to the trigger subscription's handler, as
// the MQTT client does.
func (f *modesFixture) publish(payload string) {
	f.trig.onMessage(f.trig.topics.Trigger(), []byte(payload))
}

// reply waits for the next published reply and returns the last segment
// of its topic and its decoded body.
func (f *modesFixture) reply(t testing.TB) (string, scenes.Reply) {
	t.Helper()
	s := testkit.Receive(t, f.pub, waitLimit, "no reply published")
	topic, body, _ := strings.Cut(s, " ")
	id, ok := strings.CutPrefix(topic, replyTopic)
	if !ok {
		t.Fatalf("published on %s, want %s...", topic, replyTopic)
	}
	var r scenes.Reply
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatalf("reply on %s: %v: %s", topic, err, body)
	}
	return id, r
}

// wantAccepted checks that r accepts a trigger with a mission in state.
func wantAccepted(t testing.TB, r scenes.Reply, state driver.State, duplicate bool) {
	t.Helper()
	if r.Status != scenes.StatusAccepted || r.MissionID == "" || r.State != state || r.Duplicate != duplicate {
		t.Fatalf("reply %+v, want accepted, state %s, duplicate %v", r, state, duplicate)
	}
}

// wantRejected checks that r rejects a trigger for reason, with a message.
func wantRejected(t testing.TB, r scenes.Reply, reason string) {
	t.Helper()
	if r.Status != scenes.StatusRejected || r.Reason != reason || r.Message == "" || r.MissionID != "" {
		t.Fatalf("reply %+v, want rejected for %s with a message", r, reason)
	}
}

// holds lists the Hold flag of each submitted spec.
func holds(specs []driver.Spec) []bool {
	out := make([]bool, len(specs))
	for i, s := range specs {
		out[i] = s.Hold
	}
	return out
}
