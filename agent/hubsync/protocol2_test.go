package hubsync

import (
	"testing"

	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/clustertest"
	"github.com/sortie-edge/sortie/uplink"
)

// TestBatchesChainFromWhatWasSent pins the gateway's side of protocol 2:
// each batch says the seq it continues from (the last of the batch
// before, or the acknowledged point after a resend) and what the hub
// has acknowledged, and the status announces the protocol.
func TestBatchesChainFromWhatWasSent(t *testing.T) {
	b := brokertest.Start(t)
	h := newHub(t, b.URL())
	w := newWorld(t)
	w.steps(2, 9)
	opts := testOptions(b.URL(), w)
	opts.BatchSize, opts.Window = 3, 2
	u, _ := start(t, opts)
	h.waitFor("two batches", func() bool { return len(h.links) >= 2 })
	h.ack(3)
	waitStats(t, u, "3 acked", func(s Stats) bool { return s.Acked == 3 })
	h.waitFor("three batches", func() bool { return len(h.links) >= 3 })
	h.mu.Lock()
	got := append([][3]int64(nil), h.links[:3]...)
	proto := h.statuses[0].Protocol
	h.mu.Unlock()
	want := [][3]int64{{0, 0, 3}, {3, 0, 6}, {6, 3, 9}}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("batch %d: after, acked, last = %v, want %v", i, got[i], want[i])
		}
	}
	if proto != uplink.Protocol {
		t.Errorf("status protocol = %d, want %d", proto, uplink.Protocol)
	}
}

// TestAckAboutAnotherOutboxIgnored: batches name the store's outbox;
// an ack naming another (meant for the store this one replaced) deletes
// nothing, nor does one naming "" (from a hub that names outboxes, about
// a replaced gateway that named none), whenever it comes; an ack that
// names nothing at all (a hub before outbox names) is taken.
func TestAckAboutAnotherOutboxIgnored(t *testing.T) {
	b := brokertest.Start(t)
	h := newHub(t, b.URL())
	w := newWorld(t)
	w.steps(2, 6)
	u, _ := start(t, testOptions(b.URL(), w))
	h.waitFor("6 entries", h.has(6))
	own := w.db.OutboxID()
	h.mu.Lock()
	for i, o := range h.outboxes {
		if o != own || own == "" {
			t.Errorf("batch %d names outbox %q, want the store's %q", i, o, own)
		}
	}
	h.mu.Unlock()

	other, none := "0123456789abcdef", ""
	h.publish(h.topics.Ack(gw), uplink.Ack{Upto: 6, Outbox: &none})
	h.publish(h.topics.Ack(gw), uplink.Ack{Upto: 6, Outbox: &other})
	waitStats(t, u, "two foreign acks counted", func(s Stats) bool { return s.ForeignAcks == 2 })
	h.publish(h.topics.Ack(gw), uplink.Ack{Upto: 2}) // an older hub's
	s := waitStats(t, u, "2 acked", func(s Stats) bool { return s.Acked == 2 })
	if s.Backlog != 4 {
		t.Errorf("backlog %d after foreign acks and an ack of 2, want 4", s.Backlog)
	}
	h.publish(h.topics.Ack(gw), uplink.Ack{Upto: 6, Outbox: &own})
	waitStats(t, u, "all acked", func(s Stats) bool { return s.Backlog == 0 })
}

// TestRepeatedControlCarriedOutOnce: the hub sends a request again until
// it hears back; the gateway answers a repeat with the first result and
// does not act again (a retry or a trigger twice would be a second
// action).
func TestRepeatedControlCarriedOutOnce(t *testing.T) {
	h, rc, u := startControlled(t)
	c := uplink.Control{ID: "c-7", Action: uplink.ActionTrigger, Scene: "go_home", RequestID: "r7"}
	for range 3 {
		h.publish(h.topics.Control(gw), c)
	}
	h.waitFor("three answers", func() bool { return len(h.results) >= 3 })
	h.mu.Lock()
	for i, r := range h.results {
		if r.ID != "c-7" || !r.OK || r.MissionID != "m-r7" || r.State != driver.StatePending {
			t.Errorf("answer %d = %+v, want the first result again", i, r)
		}
	}
	h.mu.Unlock()
	rc.mu.Lock()
	n := len(rc.got)
	rc.mu.Unlock()
	if n != 1 {
		t.Fatalf("the handler ran %d times, want once", n)
	}
	s := waitStats(t, u, "counted", func(s Stats) bool { return s.Controls+s.ControlRepeats == 3 })
	if s.Controls != 1 || s.ControlRepeats != 2 {
		t.Errorf("stats: %d controls, %d repeats; want 1 and 2", s.Controls, s.ControlRepeats)
	}
}

// TestRepeatedControlAfterRestartNotCarriedOutAgain: a gateway that
// carried a request out and restarted before the hub heard back answers
// the hub's repeat from its store.
func TestRepeatedControlAfterRestartNotCarriedOutAgain(t *testing.T) {
	b := brokertest.Start(t)
	h := newHub(t, b.URL())
	rc := &recordingControl{}
	opts := testOptions(b.URL(), newWorld(t))
	opts.Control = rc
	c := uplink.Control{ID: "c-9", Action: uplink.ActionTrigger, Scene: "go_home", RequestID: "r9"}
	for run := range 2 {
		u, stop := start(t, opts)
		waitStats(t, u, "connected", func(s Stats) bool { return s.Connected })
		h.publish(h.topics.Control(gw), c)
		h.waitFor("an answer", func() bool { return len(h.results) > run })
		stop()
	}
	h.mu.Lock()
	for i, r := range h.results {
		if r.ID != "c-9" || !r.OK || r.MissionID != "m-r9" {
			t.Errorf("answer %d = %+v, want the first result", i, r)
		}
	}
	h.mu.Unlock()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.got) != 1 {
		t.Fatalf("the handler ran %d times across the restart, want once", len(rc.got))
	}
}

// memorylessSource hides the store's ControlMemory.
type memorylessSource struct{ Source }

// TestRepeatedControlRememberedInMemoryWithoutAStore: a Source that
// keeps no answers still gets repeats answered while Run runs.
func TestRepeatedControlRememberedInMemoryWithoutAStore(t *testing.T) {
	b := brokertest.Start(t)
	h := newHub(t, b.URL())
	rc := &recordingControl{}
	opts := testOptions(b.URL(), newWorld(t))
	opts.Source = memorylessSource{opts.Source}
	opts.Control = rc
	u, _ := start(t, opts)
	waitStats(t, u, "connected", func(s Stats) bool { return s.Connected })
	for range 2 {
		h.publish(h.topics.Control(gw), uplink.Control{ID: "c-3", Action: uplink.ActionTrigger, Scene: "go_home", RequestID: "r3"})
	}
	s := waitStats(t, u, "counted", func(s Stats) bool { return s.Controls+s.ControlRepeats == 2 })
	if s.Controls != 1 || s.ControlRepeats != 1 {
		t.Errorf("stats: %d controls, %d repeats; want 1 and 1", s.Controls, s.ControlRepeats)
	}
}

// TestAckAndControlTakenAtQoS0: a QoS 1 subscription is a JetStream
// consumer per gateway on a NATS cluster; acks and controls are repeated
// by their sender instead.
func TestAckAndControlTakenAtQoS0(t *testing.T) {
	b := brokertest.Start(t)
	w := newWorld(t)
	u, _ := start(t, testOptions(b.URL(), w))
	waitStats(t, u, "connected", func(s Stats) bool { return s.Connected })
	topics := uplink.Topics{}
	for _, topic := range []string{topics.Ack(gw), topics.Control(gw)} {
		subs := b.Server().Topics.Subscribers(topic)
		if len(subs.Subscriptions) != 1 {
			t.Fatalf("%s: %d subscribers, want the gateway", topic, len(subs.Subscriptions))
		}
		for id, s := range subs.Subscriptions {
			if s.Qos != 0 {
				t.Errorf("%s: %s subscribed at QoS %d, want 0", topic, id, s.Qos)
			}
		}
	}
}

// TestStatusNotRetainedWhenAsked: for a hub in the cluster mode the
// gateway publishes its status, and its will, not retained; the hub
// still hears both.
func TestStatusNotRetainedWhenAsked(t *testing.T) {
	b := brokertest.Start(t)
	h := newHub(t, b.URL())
	px := clustertest.StartProxy(t, b.Addr())
	opts := testOptions(px.URL(), newWorld(t))
	opts.NoRetain = true
	u, _ := start(t, opts)
	waitStats(t, u, "connected", func(s Stats) bool { return s.Connected })
	state := func(want string) func() bool {
		return func() bool { return len(h.statuses) > 0 && h.statuses[len(h.statuses)-1].State == want }
	}
	h.waitFor("online", state(uplink.StateOnline))
	px.SetDown(true)
	px.Cut() // no DISCONNECT: the broker publishes the will
	h.waitFor("offline (will)", state(uplink.StateOffline))
	if kept, ok := b.Retained(h.topics.Status(gw)); ok {
		t.Errorf("the broker keeps a retained status message (%q), want none", kept)
	}
}
