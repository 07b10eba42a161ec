package broker

// handover delivers the messages mochi queues on a session's old
// connection while a new connection takes the session over.
//
// mochi v2.7.9 takes a persistent session over in steps
// (Server.inheritClientSession, then Clients.Add in attachClient): it
// marks the old connection taken over, copies its queued QoS 1 and 2
// deliveries to the new one, moves its subscriptions, clears the old
// one's queue, and only then lists the new connection under the client
// ID. A message published meanwhile finds the old connection under the
// ID (publishToSubscribers looks subscribers up by ID) and is queued on
// it after the copy: cleared with its queue, or left on a connection no
// one reads. The broker had acknowledged it to its publisher, and no
// subscriber ever got it. The agent's kill loop found it: a restarted
// agent's trigger link takes its session over while apps publish, and
// 2 of ~500 triggers a run were never delivered.
//
// mochi marks the old connection taken over before it copies the queue,
// so a delivery queued after the copy sees the mark in OnQosPublish
// (called after the delivery is queued). The hook queues such a
// delivery again on the session's newest connection: at once if that
// connection is established, else when it is (OnSessionEstablished,
// after mochi has sent the copied queue). One queued before the copy
// but seen after the mark is delivered twice, which QoS 1 allows (the
// agent answers a trigger's second delivery as a duplicate). A clean
// session starts empty, so nothing is handed to it.
//
// A delivery caught on the publisher's goroutine is written to the new
// connection by a goroutine of that connection's, in the order caught,
// so that a subscriber slow to read does not hold the publisher (mochi's
// own deliveries go through each connection's queue) and a topic's
// messages keep their order. And the broker uses no topic aliases towards
// clients (MQTT 5 lets a server choose not to): a delivery queued on the
// old connection may carry that connection's alias in place of its
// topic name, which the new connection does not know and mochi keeps no
// way back from.

import (
	"log/slog"
	"sync"
	"sync/atomic"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

type handover struct {
	mqtt.HookBase
	srv *mqtt.Server
	log *slog.Logger

	mu sync.Mutex
	// current is each client ID's newest established connection.
	current map[string]*mqtt.Client
	// pending are deliveries caught on a taken-over connection before
	// the session's next connection was established.
	pending map[string][]packets.Packet
	// out are deliveries for an established connection, written in
	// order by one goroutine while the connection has any.
	out map[*mqtt.Client][]packets.Packet
	// ending and establishing are, by client ID, a connection whose
	// session ends with it and is not yet unlisted, and a connection
	// being established (relist.go); onWait is a test's seam, told when a
	// new connection waits for an old one.
	ending, establishing map[string]*mqtt.Client
	onWait               func(id string)
}

func newHandover(srv *mqtt.Server, log *slog.Logger) *handover {
	return &handover{srv: srv, log: log, current: map[string]*mqtt.Client{}, pending: map[string][]packets.Packet{}, out: map[*mqtt.Client][]packets.Packet{},
		ending: map[string]*mqtt.Client{}, establishing: map[string]*mqtt.Client{}}
}

func (h *handover) ID() string { return "sortie-handover" }

func (h *handover) Provides(b byte) bool {
	return b == mqtt.OnConnect || b == mqtt.OnQosPublish || b == mqtt.OnSessionEstablish || b == mqtt.OnSessionEstablished || b == mqtt.OnDisconnect || b == mqtt.OnClientExpired
}

// OnConnect turns off topic aliases towards the client: mochi assigns one
// only when the client's CONNECT allows any, read from here on.
func (h *handover) OnConnect(cl *mqtt.Client, _ packets.Packet) error {
	cl.Properties.Props.TopicAliasMaximum = 0
	return nil
}

// OnQosPublish catches a delivery queued on a connection already taken
// over.
func (h *handover) OnQosPublish(cl *mqtt.Client, pk packets.Packet, _ int64, _ int) {
	if pk.FixedHeader.Type != packets.Publish || !cl.IsTakenOver() {
		return
	}
	h.reroute(cl.ID, pk)
}

// reroute queues pk on the session's newest established connection, or
// keeps it until there is one.
func (h *handover) reroute(id string, pk packets.Packet) {
	h.mu.Lock()
	nc := h.current[id]
	if nc == nil || nc.IsTakenOver() {
		h.pending[id] = append(h.pending[id], pk)
		h.mu.Unlock()
		return
	}
	q, running := h.out[nc]
	h.out[nc] = append(q, pk)
	h.mu.Unlock()
	if !running {
		go h.drain(nc) // not on the publisher's goroutine: a slow reader would hold it
	}
}

// drain delivers nc's queued deliveries in order until none is left.
func (h *handover) drain(nc *mqtt.Client) {
	for {
		h.mu.Lock()
		q := h.out[nc]
		if len(q) == 0 {
			delete(h.out, nc)
			h.mu.Unlock()
			return
		}
		pk := q[0]
		h.out[nc] = q[1:]
		h.mu.Unlock()
		h.deliver(nc, pk)
	}
}

// OnSessionEstablished hands the new connection what was caught while it
// took the session over.
func (h *handover) OnSessionEstablished(cl *mqtt.Client, _ packets.Packet) {
	h.established(cl)
	if cl.IsTakenOver() {
		return // a newer connection took it over already: that one is current
	}
	h.mu.Lock()
	h.current[cl.ID] = cl
	caught := h.pending[cl.ID]
	delete(h.pending, cl.ID)
	h.mu.Unlock()
	for _, pk := range caught {
		h.deliver(cl, pk)
	}
}

// deliver queues pk on nc's session and writes it; a failed write leaves
// it queued, for the session's next connection.
func (h *handover) deliver(nc *mqtt.Client, pk packets.Packet) {
	if nc.Properties.Clean {
		return // a clean session starts empty
	}
	id, err := nc.NextPacketID()
	if err != nil {
		h.log.Warn("session handover: no packet identifier free; message dropped", "client", nc.ID, "topic", pk.TopicName)
		return
	}
	out := pk.Copy(false)
	out.PacketID = uint16(id)
	if nc.State.Inflight.Set(out) {
		atomic.AddInt64(&h.srv.Info.Inflight, 1)
	}
	if nc.IsTakenOver() {
		// Taken over in turn, perhaps after its queue was copied: the
		// session's next connection gets it (twice at worst).
		h.reroute(nc.ID, out)
		return
	}
	_ = nc.WritePacket(out) // a failed write leaves it queued: the next connection gets it
}

// OnDisconnect forgets a connection whose session ends with it; a
// connection taken over hands its session on (as mochi itself checks),
// with what was caught for it.
func (h *handover) OnDisconnect(cl *mqtt.Client, _ error, expire bool) {
	h.established(cl)
	if expire && !cl.IsTakenOver() {
		h.forget(cl, true)
		h.ended(cl) // relist.go
	}
}

// OnClientExpired forgets a session that expired, whichever connection
// was last current (one whose CONNACK failed never became so).
func (h *handover) OnClientExpired(cl *mqtt.Client) { h.forget(cl, false) }

func (h *handover) forget(cl *mqtt.Client, onlyCurrent bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !onlyCurrent || h.current[cl.ID] == cl {
		delete(h.current, cl.ID)
		delete(h.pending, cl.ID)
	}
}
