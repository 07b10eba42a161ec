package agent

import (
	"context"
	"encoding/json"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/scenes"
)

// agentTopics are the agent's own topics under prefix/gateways/ID.
type agentTopics struct {
	base string
}

func newAgentTopics(prefix, gateway string) agentTopics {
	return agentTopics{base: prefix + "/gateways/" + gateway}
}

func (t agentTopics) Trigger() string               { return t.base + "/trigger" }
func (t agentTopics) Reply(requestID string) string { return t.base + "/replies/" + requestID }
func (t agentTopics) Events(missionID string) string {
	return t.base + "/missions/" + missionID + "/events"
}

// invalidReplyID is the reply topic suffix for triggers whose request ID
// is missing or unsafe to put in a topic.
const invalidReplyID = "_invalid"

// Missions is what the trigger service needs from the driver
// (*driver.Driver): submit a mission idempotently by request key,
// cancel or resume one for a scene's mode, and find one by request key.
type Missions interface {
	Submit(ctx context.Context, spec driver.Spec) (*driver.Mission, bool, error)
	CancelFor(ctx context.Context, id, reason string) (*driver.Mission, error)
	Resume(ctx context.Context, id string) (*driver.Mission, error)
	Lookup(ctx context.Context, requestKey string) (*driver.Mission, error)
}

// Publisher sends a payload; the trigger service and event feed share
// the agent's MQTT connection through it.
type Publisher interface {
	Publish(topic string, qos byte, retained bool, payload []byte) error
}

// triggerJob is one unit of work for the trigger workers: a trigger
// payload, or a decoded trigger whose reply goes to done (HTTP).
type triggerJob struct {
	payload []byte
	trigger *scenes.Trigger
	done    chan<- scenes.Reply
	via     string // viaMQTT for payloads
	// note, for a schedule's firing run late, says so in its record.
	note string
	// decided, when set, is closed once the job is decided and answered.
	decided chan struct{}
}

// Triggers turns trigger messages into missions and replies, and runs
// the scene modes (single, restart, queued, parallel). Decisions for one
// scene are serialised by its lock so that two triggers cannot race.
type Triggers struct {
	log *slog.Logger
	// cat is the catalog new triggers are built from; a bundle applied
	// replaces it (setCatalog), and missions already built keep their
	// steps.
	cat    atomic.Pointer[scenes.Catalog]
	driver Missions
	pub    Publisher
	topics agentTopics
	jobs   chan triggerJob
	// gone, closed by abandon, frees handlers waiting on a decision
	// that no Run will make (an agent closed without running).
	gone     chan struct{}
	goneOnce sync.Once
	// stopped is set once Run has stopped deciding: later triggers are
	// answered shutting_down at once rather than queued unanswered.
	// Senders hold stopMu's read lock from checking it to queueing, so
	// that Run's last drain sees every job queued before it was set.
	stopMu  sync.RWMutex
	stopped bool
	metrics *instruments
	// traces records every evaluation (nil records none); now stamps them.
	traces *tracer
	now    func() time.Time

	mu     sync.Mutex
	active map[string]map[string]activeRun // scene -> mission ID -> run
	locks  map[string]*sync.Mutex          // scene -> lock over its mode decisions
	// endedScenes are scenes a run of which ended since the last look;
	// ended wakes the goroutine that starts their held runs.
	endedScenes map[string]bool
	ended       chan struct{}
}

type activeRun struct {
	created time.Time
	held    bool // queued behind another run, not yet resumed
}

// TriggerOptions configures a trigger service.
type TriggerOptions struct {
	Logger  *slog.Logger // nil discards
	Catalog *scenes.Catalog
	// Missions is the driver; Publisher sends the replies.
	Missions  Missions
	Publisher Publisher
	// Prefix and Gateway place the trigger and reply topics
	// (Prefix/gateways/Gateway/...).
	Prefix, Gateway string
}

// NewTriggers returns a trigger service: it decodes triggers (from MQTT
// through its subscription, or Call), applies each scene's mode against
// the runs it tracks (Observe must see the driver's events), submits
// missions idempotently by request ID and publishes the replies. Run
// runs its workers.
func NewTriggers(o TriggerOptions) *Triggers {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return newTriggers(o.Logger, o.Catalog, o.Missions, o.Publisher, newAgentTopics(o.Prefix, o.Gateway), nil)
}

func newTriggers(log *slog.Logger, cat *scenes.Catalog, d Missions, pub Publisher, topics agentTopics, m *instruments) *Triggers {
	t := &Triggers{
		log: log, driver: d, pub: pub, topics: topics, metrics: m,
		// As many as mosquitto queues for a session by default: a backlog
		// that waited for the agent arrives at once.
		jobs:        make(chan triggerJob, 1024),
		gone:        make(chan struct{}),
		now:         time.Now,
		active:      map[string]map[string]activeRun{},
		locks:       map[string]*sync.Mutex{},
		endedScenes: map[string]bool{},
		ended:       make(chan struct{}, 1),
	}
	t.cat.Store(cat)
	return t
}

// setCatalog makes cat the catalog of the triggers decided from now on.
func (t *Triggers) setCatalog(cat *scenes.Catalog) { t.cat.Store(cat) }

// seed records the missions that were active at start-up.
func (t *Triggers) seed(ms []*driver.Mission) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, m := range ms {
		t.trackLocked(m)
	}
}

func (t *Triggers) trackLocked(m *driver.Mission) {
	runs := t.active[m.Type]
	if runs == nil {
		runs = map[string]activeRun{}
		t.active[m.Type] = runs
	}
	runs[m.ID] = activeRun{created: m.Meta.Created, held: m.State == driver.StatePaused && m.Meta.Started.IsZero()}
}

// Observe keeps the active-run table current and notes scenes whose run
// ended, so a held run can start. It never blocks the driver, and a note
// is never lost: it is a set entry plus a wake-up, not a queue slot.
func (t *Triggers) Observe(ev driver.Event, m *driver.Mission) {
	t.mu.Lock()
	switch {
	case ev.Input == driver.InSubmit, ev.Input == driver.InRetry:
		t.trackLocked(m)
	case ev.To.Terminal():
		delete(t.active[m.Type], m.ID)
		t.endedScenes[m.Type] = true
	case ev.Input == driver.InResume || ev.Input == driver.InStart:
		if r, ok := t.active[m.Type][m.ID]; ok {
			r.held = false
			t.active[m.Type][m.ID] = r
		}
	}
	t.mu.Unlock()
	if ev.To.Terminal() {
		select {
		case t.ended <- struct{}{}:
		default: // a wake-up is already pending; it will see this scene
		}
	}
}

// takeEnded returns and clears the scenes whose runs ended.
func (t *Triggers) takeEnded() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]string, 0, len(t.endedScenes))
	for s := range t.endedScenes {
		out = append(out, s)
	}
	clear(t.endedScenes)
	sort.Strings(out)
	return out
}

// onMessage is the trigger subscription's handler, on the MQTT receive
// path: it only hands the payload on.
func (t *Triggers) onMessage(_ string, payload []byte) { t.enqueue(payload, nil) }

// onMessageDecided is onMessage for a trigger link to an external
// broker, whose client acknowledges a message when its handler returns:
// it returns once the trigger is decided (its mission written, or its
// refusal answered). A kill before that leaves the trigger unacknowledged
// in the persistent session, which delivers it again at the next start
// (the request ID makes that a duplicate if its mission was written);
// acknowledged at once, a trigger still queued died with the process.
// The client runs each message on its own goroutine, so the wait holds
// up only this one.
func (t *Triggers) onMessageDecided(_ string, payload []byte) {
	decided := make(chan struct{})
	if t.enqueue(payload, decided) {
		select {
		case <-decided: // Run decides every job queued, up to its last
		case <-t.gone:
		}
	}
}

// abandon frees the handlers waiting on decisions: the link's Close
// waits for its handlers, and an agent closed without running decides
// nothing.
func (t *Triggers) abandon() { t.goneOnce.Do(func() { close(t.gone) }) }

// enqueue queues a trigger payload for the workers, or answers it at
// once (shutting down, overloaded); it reports whether it queued it.
func (t *Triggers) enqueue(payload []byte, decided chan struct{}) bool {
	t.stopMu.RLock()
	defer t.stopMu.RUnlock()
	if t.stopped {
		tr := scenes.Trigger{RequestID: requestIDOf(payload)}
		t.answer(viaMQTT, tr, t.shuttingDown(tr))
		return false
	}
	select {
	case t.jobs <- triggerJob{payload: payload, via: viaMQTT, decided: decided}:
		return true
	default:
		t.metrics.rejected(scenes.ReasonOverloaded)
		t.log.Warn("trigger dropped: queue full", "bytes", len(payload))
		tr := scenes.Trigger{RequestID: requestIDOf(payload)}
		t.answer(viaMQTT, tr, scenes.Reply{RequestID: tr.RequestID, Status: scenes.StatusRejected, Reason: scenes.ReasonOverloaded, Message: "agent is overloaded; try again"})
		return false
	}
}

// triggerWorkers decide triggers concurrently, so one trigger's commit
// does not hold up the next; triggers of one scene still serialise
// (sceneLock) unless the scene runs in parallel mode.
const triggerWorkers = 8

// Run processes jobs until ctx ends. At start it resumes queued runs
// whose predecessor finished while the agent was down.
func (t *Triggers) Run(ctx context.Context) error {
	for _, scene := range t.scenesWithRuns() {
		t.startQueued(ctx, scene)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.ended:
				for _, scene := range t.takeEnded() {
					t.startQueued(ctx, scene)
				}
			}
		}
	})
	for range triggerWorkers {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case j := <-t.jobs:
					t.do(ctx, j)
				}
			}
		})
	}
	wg.Wait()
	// Whatever came in since is answered, not left waiting: the sender
	// retries with the same request ID once the agent is back.
	t.stopMu.Lock()
	t.stopped = true
	t.stopMu.Unlock()
	for {
		select {
		case j := <-t.jobs:
			t.do(ctx, j)
		default:
			return nil
		}
	}
}

// do decides one job, or answers shutting_down once ctx has ended (a
// worker may pick a job in the same instant as the end of ctx, and the
// driver refuses a done context anyway).
func (t *Triggers) do(ctx context.Context, j triggerJob) {
	if j.decided != nil {
		defer close(j.decided)
	}
	var rep scenes.Reply
	var tr scenes.Trigger
	switch {
	case ctx.Err() == nil && j.trigger != nil:
		tr = *j.trigger
		rep = t.submit(ctx, tr)
	case ctx.Err() == nil:
		tr, rep = t.handle(ctx, j.payload)
	case j.trigger != nil:
		tr = *j.trigger
		rep = t.shuttingDown(tr)
	default:
		tr = scenes.Trigger{RequestID: requestIDOf(j.payload)}
		rep = t.shuttingDown(tr)
	}
	if j.done != nil {
		e := evaluation(j.via, tr, rep, t.now())
		if j.note != "" && e.Outcome == outcomeAccepted {
			e.Reason, e.Message = reasonCaughtUp, j.note
		}
		t.traces.record(e)
		j.done <- rep // buffered: never blocks
		return
	}
	t.answer(j.via, tr, rep)
}

// declined returns a function that records a trigger refused before it
// reached the trigger service (by the API's or the hub's decoding).
func (t *Triggers) declined(via string) func(scenes.Trigger, scenes.Reply) {
	return func(tr scenes.Trigger, rep scenes.Reply) {
		// Fields of a trigger that did not decode are kept only when they
		// are safe to show.
		if driver.ValidateID("scene", tr.Scene) != nil {
			tr.Scene, rep.Scene = "", ""
		}
		if driver.ValidateID("source", tr.Source) != nil {
			tr.Source = ""
		}
		t.metrics.rejected(rep.Reason)
		t.traces.record(evaluation(via, tr, rep, t.now()))
	}
}

// answer records a trigger's evaluation and publishes its reply. The
// record is queued first, so that a sender who reads the reply and asks
// why finds it.
func (t *Triggers) answer(via string, tr scenes.Trigger, rep scenes.Reply) {
	t.traces.record(evaluation(via, tr, rep, t.now()))
	t.reply(rep)
}

// shuttingDown is the reply to a trigger that came as the agent stops.
func (t *Triggers) shuttingDown(tr scenes.Trigger) scenes.Reply {
	return t.rejected(tr, scenes.ReasonShuttingDown, "the agent is shutting down; send it again (same request_id) once it is back")
}

// sceneLock returns the lock that serialises mode decisions for a scene.
func (t *Triggers) sceneLock(scene string) *sync.Mutex {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.locks[scene]
	if l == nil {
		l = new(sync.Mutex)
		t.locks[scene] = l
	}
	return l
}

func (t *Triggers) scenesWithRuns() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for s, runs := range t.active {
		if len(runs) > 0 {
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return out
}

// startQueued resumes the oldest held run of scene if no run is going.
func (t *Triggers) startQueued(ctx context.Context, scene string) {
	l := t.sceneLock(scene)
	l.Lock()
	defer l.Unlock()
	t.mu.Lock()
	var next string
	var nextAt time.Time
	for id, r := range t.active[scene] {
		if !r.held {
			t.mu.Unlock()
			return // a run is still going
		}
		if next == "" || r.created.Before(nextAt) || (r.created.Equal(nextAt) && id < next) {
			next, nextAt = id, r.created
		}
	}
	t.mu.Unlock()
	if next == "" {
		return
	}
	if _, err := t.driver.Resume(ctx, next); err != nil {
		t.log.Error("start queued run", "scene", scene, "mission", next, "err", err)
		return
	}
	t.log.Info("queued run started", "scene", scene, "mission", next)
}

func (t *Triggers) reply(r scenes.Reply) {
	id := r.RequestID
	if driver.ValidateID("request_id", id) != nil {
		id = invalidReplyID
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.log.Error("encode reply", "err", err)
		return
	}
	if err := t.pub.Publish(t.topics.Reply(id), 1, false, b); err != nil {
		t.log.Warn("publish reply", "request", id, "err", err)
	}
}

// requestIDOf digs the request ID out of a payload that failed to
// decode, so the rejection can still reach the sender when possible.
func requestIDOf(b []byte) string {
	var probe struct {
		RequestID any `json:"request_id"`
	}
	if len(b) > scenes.MaxTriggerSize || json.Unmarshal(b, &probe) != nil {
		return ""
	}
	s, _ := probe.RequestID.(string)
	return s
}

// handle decodes one MQTT trigger and decides it.
func (t *Triggers) handle(ctx context.Context, payload []byte) (scenes.Trigger, scenes.Reply) {
	tr, err := scenes.DecodeTrigger(payload)
	if err != nil {
		tr.RequestID = requestIDOf(payload)
		return tr, t.rejectedErr(tr, err, scenes.ReasonBadJSON)
	}
	return tr, t.submit(ctx, tr)
}

// runs lists the scene's active missions, oldest first.
func (t *Triggers) runs(scene string) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ids []string
	for id := range t.active[scene] {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}
