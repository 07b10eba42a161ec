package broker

// retainer keeps the broker's retained messages and replays them to new
// subscriptions, in place of mochi's own retained store.
//
// mochi v2.7.9 keeps retained messages in its topic tree: a retained
// publish writes the topic node's retainPath under the node's lock
// (TopicsIndex.RetainMessage), and a new subscription's wildcard scan
// (scanMessages) reads it under no lock at all. The race detector
// catches it whenever a device's retained state or will meets a new
// wildcard subscription (about one run in thirty of the agent's failed
// start test), and a torn read of a new topic's path could crash the
// broker. No hook brackets mochi's scan, so it cannot be serialised
// from outside; it can be kept from reading anything written. The
// retainer takes every retained message before mochi would store it
// (the last OnPublish hook, OnWill for a will), keeps it in a map of its
// own, and clears the flag on mochi's copy, so mochi's tree never gets
// a retained path off $SYS and its scans find nothing. The retainer
// replays the messages itself:
//
//   - to a client, right after the SUBACK, as mochi does (OnPacketSent),
//     with the filter's granted QoS, retain handling (MQTT 5), no-local
//     and subscription identifier, after the access check, counted in
//     the session's in-flight window like any delivery;
//   - to an in-process subscriber (Broker.Subscribe), before Subscribe
//     returns.
//
// A message is stored before mochi forwards it (as mochi's order is), so
// a subscription made meanwhile gets it twice at worst, never not at
// all. What changes on the wire: a forwarded message never carries the
// retain flag, which MQTT 3.1.1 requires and MQTT 5 requires unless the
// subscription asked for Retain As Published (not honoured here; no
// client of Sortie's asks for it). mochi's own $SYS topics still go
// through its tree, read only by $SYS filters.
//
// The same hook hands each publish to the broker's taps first
// (Broker.Tap) and counts subscriptions (Broker.SubscriptionsAdded):
// each hook type costs the agent's binary a copy of mochi's hook
// interface.

import (
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

type retainer struct {
	mqtt.HookBase
	b   *Broker
	srv *mqtt.Server
	// acl is the broker's access hook: a replayed message is checked as
	// mochi checks a forwarded one.
	acl mqtt.Hook
	// handover sees each replay queued, as mochi's own deliveries, so
	// that one queued on a connection taken over meanwhile goes on to
	// the session's next connection (handover.go).
	handover *handover
	log      *slog.Logger

	mu    sync.RWMutex
	msgs  map[string]packets.Packet // by topic
	swept int64                     // unix seconds of the last sweep of expired ones

	// pending are, per client, the subscriptions of the SUBSCRIBE being
	// answered: mochi reads a client's packets one at a time and writes
	// the SUBACK before it reads the next, so there is one at most.
	pendMu  sync.Mutex
	pending map[*mqtt.Client][]replay
	// delayed marks the client IDs whose will is retained and delayed
	// (MQTT 5): it is stored once mochi sends it, not when the client
	// goes, since the client may come back within the delay.
	delayed map[string]bool
}

// replay is one filter of a SUBSCRIBE, to replay once it is granted.
type replay struct {
	sub     packets.Subscription
	existed bool // the session had the filter already (retain handling 1)
}

func newRetainer(b *Broker, acl mqtt.Hook, log *slog.Logger) *retainer {
	return &retainer{
		b: b, srv: b.srv, acl: acl, log: log,
		msgs:    map[string]packets.Packet{},
		pending: map[*mqtt.Client][]replay{},
		delayed: map[string]bool{},
	}
}

func (r *retainer) ID() string { return "sortie-retain" }

func (r *retainer) Provides(b byte) bool {
	switch b {
	case mqtt.OnPublish, mqtt.OnWill, mqtt.OnWillSent, mqtt.OnClientExpired, mqtt.OnSubscribe, mqtt.OnSubscribed, mqtt.OnPacketSent, mqtt.OnDisconnect:
		return true
	}
	return false
}

// OnPublish hands the message to the broker's taps (Broker.Tap), then
// stores a retained message and hands mochi a copy without the flag. It
// must be the last publish hook: once it returns, mochi forwards the
// message.
func (r *retainer) OnPublish(_ *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if ts := r.b.taps.Load(); ts != nil {
		for _, t := range *ts {
			if matchTopic(t.filter, pk.TopicName) {
				t.handle(pk.TopicName, pk.Payload)
			}
		}
	}
	if !pk.FixedHeader.Retain || pk.Ignore {
		return pk, nil
	}
	r.store(pk)
	pk.FixedHeader.Retain = false
	return pk, nil
}

// OnWill stores a retained will as mochi sends it; a delayed one waits
// for OnWillSent.
func (r *retainer) OnWill(cl *mqtt.Client, will mqtt.Will) (mqtt.Will, error) {
	delayed := will.Retain && will.WillDelayInterval > 0
	r.pendMu.Lock()
	if delayed {
		r.delayed[cl.ID] = true
	} else {
		delete(r.delayed, cl.ID) // this will replaces any delayed one
	}
	r.pendMu.Unlock()
	if !will.Retain {
		return will, nil
	}
	if !delayed {
		r.store(willPacket(cl, will))
	}
	will.Retain = false
	return will, nil
}

// OnWillSent stores a delayed retained will once it is sent: mochi calls
// it for every will, and marks a delayed one's packet with its delay.
func (r *retainer) OnWillSent(cl *mqtt.Client, pk packets.Packet) {
	r.pendMu.Lock()
	was := r.delayed[cl.ID]
	delete(r.delayed, cl.ID)
	r.pendMu.Unlock()
	if was && pk.Connect.WillProperties.WillDelayInterval > 0 {
		pk.FixedHeader.Retain = true
		r.store(pk)
	}
}

// OnClientExpired forgets a delayed will's mark: mochi sends no will of
// a session gone.
func (r *retainer) OnClientExpired(cl *mqtt.Client) {
	r.pendMu.Lock()
	delete(r.delayed, cl.ID)
	r.pendMu.Unlock()
}

// willPacket is the message mochi publishes for a will (Server.sendLWT).
func willPacket(cl *mqtt.Client, will mqtt.Will) packets.Packet {
	return packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Retain: true, Qos: will.Qos},
		TopicName:   will.TopicName,
		Payload:     will.Payload,
		Properties:  packets.Properties{User: will.User},
		Origin:      cl.ID,
		Created:     time.Now().Unix(),
	}
}

// store keeps pk as its topic's retained message, or clears the topic
// for an empty payload [MQTT-3.3.1-10, 3.3.1-11].
//
// A retained message lasts until it is replaced or cleared, or, for one
// an MQTT 5 client gave a message expiry, until that expiry
// [MQTT-3.3.2-5]. mochi stamps every publish with its maximum expiry (a
// day) and dropped every retained message a day old: a device's
// "online", published once at connect, went from the broker after a
// day. Expired ones are swept at most once a minute, as messages come.
func (r *retainer) store(pk packets.Packet) {
	kept := pk.Copy(false)
	if pk.ProtocolVersion != 5 || pk.Properties.MessageExpiryInterval == 0 {
		kept.Expiry = 0
	}
	now := time.Now().Unix()
	r.mu.Lock()
	if len(pk.Payload) == 0 {
		delete(r.msgs, pk.TopicName)
	} else {
		r.msgs[pk.TopicName] = kept
	}
	if now-r.swept >= 60 {
		r.swept = now
		for topic, m := range r.msgs {
			if !live(m, now) {
				delete(r.msgs, topic)
			}
		}
	}
	n := len(r.msgs)
	r.mu.Unlock()
	atomic.StoreInt64(&r.srv.Info.Retained, int64(n))
}

// matching are the live retained messages on topics filter matches.
func (r *retainer) matching(filter string, now int64) []packets.Packet {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if !strings.ContainsAny(filter, "+#") {
		if pk, ok := r.msgs[filter]; ok && live(pk, now) {
			return []packets.Packet{pk}
		}
		return nil
	}
	var out []packets.Packet
	for topic, pk := range r.msgs {
		if live(pk, now) && matchTopic(filter, topic) {
			out = append(out, pk)
		}
	}
	return out
}

// live: a message past its MQTT 5 expiry is not replayed [MQTT-3.3.2-5].
func live(pk packets.Packet, now int64) bool { return pk.Expiry <= 0 || pk.Expiry > now }

// OnSubscribe notes which of the filters the session had already; mochi
// adds them to its index next.
func (r *retainer) OnSubscribe(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	if cl.Net.Inline {
		return pk
	}
	subs := make([]replay, len(pk.Filters))
	for i, sub := range pk.Filters {
		_, existed := cl.State.Subscriptions.Get(sub.Filter)
		subs[i] = replay{sub: sub, existed: existed}
	}
	r.pendMu.Lock()
	r.pending[cl] = subs
	r.pendMu.Unlock()
	return pk
}

// OnSubscribed counts the subscription (Broker.SubscriptionsAdded: mochi
// has put it in its index) and keeps the filters granted, to replay
// once the SUBACK is written.
func (r *retainer) OnSubscribed(cl *mqtt.Client, _ packets.Packet, codes []byte) {
	r.b.subsAdded.Add(1)
	if cl.Net.Inline {
		return
	}
	r.pendMu.Lock()
	defer r.pendMu.Unlock()
	subs := r.pending[cl]
	kept := subs[:0]
	for i, s := range subs {
		if i >= len(codes) || codes[i] >= packets.ErrUnspecifiedError.Code {
			continue
		}
		if mqtt.IsSharedFilter(s.sub.Filter) { // no retained messages for a shared subscription [MQTT-4.8.2]
			continue
		}
		if s.sub.RetainHandling == 2 || s.sub.RetainHandling == 1 && s.existed { // [MQTT-3.3.1-10, 3.3.1-11]
			continue
		}
		s.sub.Qos = codes[i] // the QoS granted
		kept = append(kept, s)
	}
	if len(kept) == 0 {
		delete(r.pending, cl)
		return
	}
	r.pending[cl] = kept
}

// OnPacketSent replays the retained messages of a SUBSCRIBE once its
// SUBACK is written, on the client's own goroutine, as mochi would.
func (r *retainer) OnPacketSent(cl *mqtt.Client, pk packets.Packet, _ []byte) {
	if pk.FixedHeader.Type != packets.Suback {
		return
	}
	r.pendMu.Lock()
	subs, ok := r.pending[cl]
	delete(r.pending, cl)
	r.pendMu.Unlock()
	if !ok {
		return
	}
	now := time.Now().Unix()
	for _, s := range subs {
		for _, m := range r.matching(s.sub.Filter, now) {
			r.send(cl, s.sub, m)
		}
	}
}

// OnDisconnect drops what a connection left pending (a SUBACK never
// written).
func (r *retainer) OnDisconnect(cl *mqtt.Client, _ error, _ bool) {
	r.pendMu.Lock()
	delete(r.pending, cl)
	r.pendMu.Unlock()
}

// send delivers one retained message to cl under sub, as mochi's
// Server.publishToClient does for a replay: the access check, the lower
// QoS, a packet identifier and an in-flight entry for QoS 1 and 2, and
// held back while the client's receive window is full (MQTT 5).
func (r *retainer) send(cl *mqtt.Client, sub packets.Subscription, pk packets.Packet) {
	if sub.NoLocal && pk.Origin == cl.ID {
		return // [MQTT-3.8.3-3]
	}
	if !r.acl.OnACLCheck(cl, pk.TopicName, false) {
		return
	}
	out := pk.Copy(false)
	out.FixedHeader.Retain = true // a replay carries the flag [MQTT-3.3.1-8]
	if sub.Identifier > 0 {
		out.Properties.SubscriptionIdentifier = []int{sub.Identifier} // [MQTT-3.3.4-3]
	}
	out.FixedHeader.Qos = min(out.FixedHeader.Qos, sub.Qos, r.srv.Options.Capabilities.MaximumQos)
	if out.FixedHeader.Qos > 0 {
		if cl.State.Inflight.Len() >= int(r.srv.Options.Capabilities.MaximumInflight) {
			atomic.AddInt64(&r.srv.Info.InflightDropped, 1)
			r.log.Warn("retained message not replayed: client's in-flight store full", "client", cl.ID, "topic", pk.TopicName)
			return
		}
		id, err := cl.NextPacketID()
		if err != nil {
			atomic.AddInt64(&r.srv.Info.InflightDropped, 1)
			r.log.Warn("retained message not replayed: no packet identifier free", "client", cl.ID, "topic", pk.TopicName)
			return
		}
		out.PacketID = uint16(id)
		window := int(cl.Properties.Props.ReceiveMaximum)
		full := window > 0 && cl.State.Inflight.Len() >= window
		if cl.State.Inflight.Set(out) {
			atomic.AddInt64(&r.srv.Info.Inflight, 1)
			if r.handover != nil {
				r.handover.OnQosPublish(cl, out, out.Created, 0)
			}
			cl.State.Inflight.DecreaseSendQuota()
		}
		if full {
			// mochi sends it when an acknowledgement frees the window.
			out.Expiry = -1
			cl.State.Inflight.Set(out)
			return
		}
	}
	_ = cl.WritePacket(out) // a QoS 1 or 2 message left in flight is sent again on reconnection
}

// replayTo calls handle with each retained message filter matches, for
// an in-process subscriber.
func (r *retainer) replayTo(filter string, handle func(pk packets.Packet)) {
	for _, pk := range r.matching(filter, time.Now().Unix()) {
		handle(pk)
	}
}
