package agent

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sortie-edge/sortie/driver"
)

// EventMessage is what apps following a mission receive on its events
// topic (docs/protocol.md).
type EventMessage struct {
	Gateway   string       `json:"gateway"`
	MissionID string       `json:"mission_id"`
	Scene     string       `json:"scene"`
	Seq       uint64       `json:"seq"`
	Input     driver.Input `json:"input"`
	From      driver.State `json:"from,omitempty"`
	To        driver.State `json:"to"`
	Step      int          `json:"step"` // 0-based; -1 for mission-level events
	StepID    string       `json:"step_id,omitempty"`
	Steps     int          `json:"steps"`
	Attempt   int          `json:"attempt,omitempty"`
	Error     string       `json:"error,omitempty"`
	Code      string       `json:"code,omitempty"`
	Detail    string       `json:"detail,omitempty"`
	Time      time.Time    `json:"time"`
	TraceID   string       `json:"trace_id"`
	RequestID string       `json:"request_id,omitempty"`
}

// feed publishes mission events for apps. The driver must never wait for
// the network, so events go through a bounded queue; when it is full,
// events are dropped and counted (the durable record is the timeline, and
// the hub gets its events through the outbox, not this feed).
type feed struct {
	log     *slog.Logger
	pub     Publisher
	topics  agentTopics
	gateway string
	q       chan EventMessage
	dropped atomic.Uint64
	// listened, when set, says whether anyone subscribes to a topic, and
	// subsAdded counts subscriptions made: a "no" from listened holds
	// until subsAdded changes. The agent sets both with the embedded
	// broker, whose subscriptions it can see. An event nobody follows is
	// not queued, encoded or published: a QoS 0 event is not kept for
	// later subscribers anyway, and waking the feed for each one slowed
	// every step by 3%.
	listened  func(topic string) bool
	subsAdded func() uint64

	mu       sync.Mutex
	followed map[string]followed // by mission ID; bounded by maxFollowed
}

// followed is listened's last answer for a mission's events topic.
type followed struct {
	yes   bool
	since uint64 // subsAdded when asked
}

// maxFollowed bounds feed.followed: a mission's answer is forgotten when
// it ends, and all of them if that many are running.
const maxFollowed = 4096

func newFeed(log *slog.Logger, pub Publisher, topics agentTopics, gateway string) *feed {
	return &feed{log: log, pub: pub, topics: topics, gateway: gateway, q: make(chan EventMessage, 1024), followed: map[string]followed{}}
}

// Observe implements driver.Observer. The internal "next" transition
// (STEP_SUCCEEDED -> RUNNING) carries nothing an app needs and is not
// published.
func (f *feed) Observe(ev driver.Event, m *driver.Mission) {
	if ev.Input == driver.InNext && ev.Error == "" {
		return
	}
	if f.listened != nil && !f.follows(ev) {
		return
	}
	msg := EventMessage{
		Gateway: f.gateway, MissionID: ev.MissionID, Scene: ev.Type, Seq: ev.Seq, Input: ev.Input,
		From: ev.From, To: ev.To, Step: ev.Step, StepID: ev.StepID, Steps: len(m.Steps), Attempt: ev.Attempt,
		Error: ev.Error, Code: ev.Code, Detail: ev.Detail, Time: ev.Time, TraceID: ev.TraceID,
		RequestID: m.Meta.RequestKey,
	}
	select {
	case f.q <- msg:
	default:
		if f.dropped.Add(1)%100 == 1 {
			f.log.Warn("event feed full; dropping progress events", "dropped", f.dropped.Load())
		}
	}
}

// follows says whether anyone subscribes to ev's mission's events,
// asking listened once per mission for as long as no subscription is
// made.
func (f *feed) follows(ev driver.Event) bool {
	var now uint64
	if f.subsAdded != nil {
		now = f.subsAdded()
	}
	f.mu.Lock()
	c, ok := f.followed[ev.MissionID]
	f.mu.Unlock()
	if !ok || (!c.yes && c.since != now) || f.subsAdded == nil {
		c = followed{f.listened(f.topics.Events(ev.MissionID)), now}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case ev.To.Terminal():
		delete(f.followed, ev.MissionID)
	case f.subsAdded != nil:
		if len(f.followed) >= maxFollowed {
			clear(f.followed)
		}
		f.followed[ev.MissionID] = c
	}
	return c.yes
}

// Run publishes queued events until ctx ends.
func (f *feed) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case msg := <-f.q:
			topic := f.topics.Events(msg.MissionID)
			b, err := json.Marshal(msg)
			if err != nil {
				continue
			}
			// QoS 0: progress is advisory and must not cost a broker round
			// trip per event; the timeline (API) and the hub outbox are the
			// durable records.
			if err := f.pub.Publish(topic, 0, false, b); err != nil {
				f.log.Debug("publish event", "mission", msg.MissionID, "err", err)
			}
		}
	}
}
