package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/sortie-edge/sortie/broker"
)

// triggerTrail records, on an embedded broker, what became of each
// trigger on its way to the agent: published, queued on which of the
// agent's connections, sent (again, with DUP), acknowledged. A kill
// loop that finds a trigger lost prints its trail beside the agents'
// logs, which say which process decided it: whoever lost it shows.
type triggerTrail struct {
	mqtt.HookBase
	mu    sync.Mutex
	byReq map[string][]string
	// sent maps a connection and packet ID to the request delivered
	// under it, for the PUBACK.
	sent map[string]string
	// times counts the deliveries of each request sent.
	times map[string]int
}

func traceTriggers(tb testing.TB, b *broker.Broker) *triggerTrail {
	tb.Helper()
	h := &triggerTrail{byReq: map[string][]string{}, sent: map[string]string{}, times: map[string]int{}}
	if err := b.Server().AddHook(h, nil); err != nil {
		tb.Fatal(err)
	}
	return h
}

func (h *triggerTrail) ID() string { return "test-trigger-trail" }

func (h *triggerTrail) Provides(b byte) bool {
	return b == mqtt.OnPublish || b == mqtt.OnQosPublish || b == mqtt.OnPacketSent || b == mqtt.OnPacketRead ||
		b == mqtt.OnQosDropped || b == mqtt.OnPublishDropped
}

func isTrigger(pk packets.Packet) bool { return strings.HasSuffix(pk.TopicName, "/trigger") }

func requestOf(payload []byte) string {
	var tr struct {
		RequestID string `json:"request_id"`
	}
	_ = json.Unmarshal(payload, &tr) // a payload that is not a trigger has no trail
	return tr.RequestID
}

func (h *triggerTrail) note(req, format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.byReq[req] = append(h.byReq[req], time.Now().Format("15:04:05.000 ")+fmt.Sprintf(format, args...))
}

func (h *triggerTrail) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if isTrigger(pk) {
		h.note(requestOf(pk.Payload), "published by %s", cl.ID)
	}
	return pk, nil
}

func (h *triggerTrail) OnQosPublish(cl *mqtt.Client, pk packets.Packet, _ int64, _ int) {
	if isTrigger(pk) {
		h.note(requestOf(pk.Payload), "queued on %s %p as %d (connection closed %v, taken over %v)", cl.ID, cl, pk.PacketID, cl.Closed(), cl.IsTakenOver())
	}
}

func (h *triggerTrail) OnPacketSent(cl *mqtt.Client, pk packets.Packet, _ []byte) {
	if pk.FixedHeader.Type != packets.Publish || !isTrigger(pk) {
		return
	}
	req := requestOf(pk.Payload)
	h.mu.Lock()
	h.sent[fmt.Sprintf("%p/%d", cl, pk.PacketID)] = req
	h.times[req]++
	h.mu.Unlock()
	h.note(req, "sent to %s %p as %d (dup %v)", cl.ID, cl, pk.PacketID, pk.FixedHeader.Dup)
}

func (h *triggerTrail) OnPacketRead(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if pk.FixedHeader.Type == packets.Puback {
		h.mu.Lock()
		req, ok := h.sent[fmt.Sprintf("%p/%d", cl, pk.PacketID)]
		h.mu.Unlock()
		if ok {
			h.note(req, "acknowledged by %s %p as %d", cl.ID, cl, pk.PacketID)
		}
	}
	return pk, nil
}

func (h *triggerTrail) OnQosDropped(cl *mqtt.Client, pk packets.Packet) {
	if isTrigger(pk) {
		h.note(requestOf(pk.Payload), "dropped from %s %p's queue", cl.ID, cl)
	}
}

func (h *triggerTrail) OnPublishDropped(cl *mqtt.Client, pk packets.Packet) {
	if isTrigger(pk) {
		h.note(requestOf(pk.Payload), "dropped: %s's outbound queue full", cl.ID)
	}
}

// of is the trail of a request; nil h has none.
func (h *triggerTrail) of(req string) []string {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.byReq[req]
}

// redelivered counts the requests sent to the agent more than once (a
// kill came before their acknowledgement).
func (h *triggerTrail) redelivered() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, times := range h.times {
		if times > 1 {
			n++
		}
	}
	return n
}
