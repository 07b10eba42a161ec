package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/sortie-edge/sortie/driver"
)

// eventMsg is what apps following a mission receive on its events topic.
type eventMsg struct {
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
	pub     publisher
	topics  agentTopics
	gateway string
	q       chan eventMsg
	dropped atomic.Uint64
	// listened, when set, says whether anyone subscribes to a topic; the
	// agent sets it with the embedded broker, whose subscriptions it can
	// see. An event nobody follows is not encoded or published: a QoS 0
	// event is not kept for later subscribers anyway, and each costs the
	// agent and the broker more than the step's own commit.
	listened func(topic string) bool
}

func newFeed(log *slog.Logger, pub publisher, topics agentTopics, gateway string) *feed {
	return &feed{log: log, pub: pub, topics: topics, gateway: gateway, q: make(chan eventMsg, 1024)}
}

// Observe implements driver.Observer. The internal "next" transition
// (STEP_SUCCEEDED -> RUNNING) carries nothing an app needs and is not
// published.
func (f *feed) Observe(ev driver.Event, m *driver.Mission) {
	if ev.Input == driver.InNext && ev.Error == "" {
		return
	}
	msg := eventMsg{
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

// Run publishes queued events until ctx ends.
func (f *feed) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case msg := <-f.q:
			topic := f.topics.Events(msg.MissionID)
			if f.listened != nil && !f.listened(topic) {
				continue
			}
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
