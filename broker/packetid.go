package broker

// packetIDs keeps a client's packet identifiers apart from the broker's.
//
// MQTT gives each side of a connection its own identifiers: the client
// numbers its SUBSCRIBE, UNSUBSCRIBE and QoS 1 and 2 PUBLISH packets,
// the broker numbers the QoS 1 and 2 messages it delivers, and "the
// Client and Server assign Packet Identifiers independently of each
// other" (MQTT 3.1.1 section 2.3.1; MQTT 5 section 2.2.1 says the same).
// mochi v2.7.9 keeps both sides' flows in one table per client
// (Client.State.Inflight) and reads a client's identifier as in use when
// the broker has a delivery of that number outstanding:
//
//   - a SUBSCRIBE or UNSUBSCRIBE of that number is refused, "packet
//     identifier in use" (0x91), which MQTT 3.1.1 does not even have;
//   - a QoS 1 PUBLISH of that number overwrites and then deletes the
//     delivery, which is then never sent again: at-least-once broken.
//
// A persistent session makes this likely: the deliveries it queued
// while its client was away are numbered from 1, and a client that comes
// back after a crash, its own counters lost, numbers its first
// SUBSCRIBE 1 too. The agent's trigger link did exactly this, and a
// restart that met such a refusal gave up (issue 28).
//
// The hook answers such a packet under a stand-in identifier that is
// free in the table, and gives the acknowledgement the client's own
// identifier back as it is written. mochi reads a client's packets one
// at a time on one goroutine, and writes the acknowledgement of
// SUBSCRIBE, UNSUBSCRIBE and QoS 1 PUBLISH on that goroutine before it
// reads the next, so each client has at most one stand-in at a time.
// A client's QoS 2 PUBLISH is left to mochi (its PUBREL would have to
// be renumbered too): the agent, its devices and the hub's gateways
// publish at QoS 0 and 1 only.
//
// It also keeps a SUBACK to an MQTT 3.1.1 client to the return codes
// 3.1.1 defines (0x00 to 0x02, and 0x80 for a failure; MQTT-3.9.3-2):
// mochi passes an MQTT 5 reason code through in one case.

import (
	"sync"
	"sync/atomic"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

type packetIDs struct {
	mqtt.HookBase
	mu sync.Mutex
	// standIns holds, per client, the packet being answered under a
	// stand-in identifier; n counts them, read on every packet written.
	standIns map[*mqtt.Client]standIn
	n        atomic.Int32
}

// standIn is one packet answered under a stand-in identifier.
type standIn struct {
	ack  byte   // the type of its acknowledgement
	id   uint16 // the stand-in
	orig uint16 // the client's
}

func newPacketIDs() *packetIDs { return &packetIDs{standIns: map[*mqtt.Client]standIn{}} }

func (h *packetIDs) ID() string { return "sortie-packet-ids" }

func (h *packetIDs) Provides(b byte) bool {
	return b == mqtt.OnPacketRead || b == mqtt.OnPacketEncode || b == mqtt.OnDisconnect
}

// OnPacketRead gives a packet whose identifier the broker's own flows
// hold a stand-in, before mochi looks it up.
func (h *packetIDs) OnPacketRead(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if h.n.Load() > 0 {
		h.forget(cl) // the previous packet's acknowledgement is written by now
	}
	var ack byte
	switch {
	case pk.FixedHeader.Type == packets.Subscribe:
		ack = packets.Suback
	case pk.FixedHeader.Type == packets.Unsubscribe:
		ack = packets.Unsuback
	case pk.FixedHeader.Type == packets.Publish && pk.FixedHeader.Qos == 1:
		ack = packets.Puback
	default:
		return pk, nil
	}
	held, ok := cl.State.Inflight.Get(pk.PacketID)
	if !ok || held.FixedHeader.Type == packets.Pubrec {
		return pk, nil // free, or the client's own QoS 2 flow: truly in use
	}
	// The broker numbers its deliveries upwards from 1: a stand-in from
	// the top is the least likely to be taken before mochi looks.
	for id := uint16(0xFFFF); id > 0; id-- {
		if _, taken := cl.State.Inflight.Get(id); !taken {
			h.mu.Lock()
			h.standIns[cl] = standIn{ack: ack, id: id, orig: pk.PacketID}
			h.mu.Unlock()
			h.n.Add(1)
			pk.PacketID = id
			return pk, nil
		}
	}
	return pk, nil // every identifier in use: mochi refuses it, rightly
}

// OnPacketEncode gives an acknowledgement sent under a stand-in the
// client's identifier back, and keeps an MQTT 3.1.1 SUBACK to 3.1.1's
// return codes.
func (h *packetIDs) OnPacketEncode(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	t := pk.FixedHeader.Type
	if t == packets.Suback && pk.ProtocolVersion < 5 {
		codes := make([]byte, len(pk.ReasonCodes))
		for i, c := range pk.ReasonCodes {
			if c > packets.CodeGrantedQos2.Code {
				c = packets.ErrUnspecifiedError.Code
			}
			codes[i] = c
		}
		pk.ReasonCodes = codes
	}
	if h.n.Load() == 0 || (t != packets.Suback && t != packets.Unsuback && t != packets.Puback) {
		return pk
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if s, ok := h.standIns[cl]; ok && s.ack == t && s.id == pk.PacketID {
		pk.PacketID = s.orig
		delete(h.standIns, cl)
		h.n.Add(-1)
	}
	return pk
}

// OnDisconnect forgets a stand-in whose acknowledgement was never
// written.
func (h *packetIDs) OnDisconnect(cl *mqtt.Client, _ error, _ bool) { h.forget(cl) }

func (h *packetIDs) forget(cl *mqtt.Client) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.standIns[cl]; ok {
		delete(h.standIns, cl)
		h.n.Add(-1)
	}
}
