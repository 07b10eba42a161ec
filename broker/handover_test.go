package broker

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/sortie-edge/sortie/internal/testkit"
)

// publishInTakeover publishes once, from inside mochi's takeover of a
// session: while it clears the old connection's queue, which it has
// copied to the new connection, and before it lists the new one under
// the client ID (the window handover.go closes).
type publishInTakeover struct {
	mqtt.HookBase
	b    *Broker
	once sync.Once
	err  error
}

func (h *publishInTakeover) ID() string { return "test-publish-in-takeover" }

func (h *publishInTakeover) Provides(b byte) bool { return b == mqtt.OnQosDropped }

func (h *publishInTakeover) OnQosDropped(cl *mqtt.Client, _ packets.Packet) {
	if cl.IsTakenOver() {
		h.once.Do(func() { h.err = h.b.Publish("triggers", []byte("during"), false, 1) })
	}
}

// TestMessagePublishedDuringATakeoverReachesTheNewConnection: a QoS 1
// message published while a persistent session's new connection takes
// it over (a restarted agent's trigger link, while apps publish) is
// delivered on the new connection, like the messages queued before. mochi
// alone queued it on the old connection after copying that one's queue,
// and it was never delivered, though its publisher had its PUBACK.
func TestMessagePublishedDuringATakeoverReachesTheNewConnection(t *testing.T) {
	b := startTest(t)
	hook := &publishInTakeover{b: b}
	if err := b.srv.AddHook(hook, nil); err != nil {
		t.Fatal(err)
	}
	c := dialRaw(t, b, "agent")
	c.send(subscribe(1, "triggers"))
	c.expect(packets.Suback, 1)
	if err := b.Publish("triggers", []byte("before"), false, 1); err != nil {
		t.Fatal(err)
	}
	if d := c.read(); d.FixedHeader.Type != packets.Publish || string(d.Payload) != "before" {
		t.Fatalf("delivery: %+v", d)
	}
	_ = c.nc.Close() // killed before its PUBACK: the session owes "before"

	c = dialRaw(t, b, "agent")
	if hook.err != nil {
		t.Fatalf("publish during the takeover: %v", hook.err)
	}
	got := map[string]bool{}
	for len(got) < 2 {
		d := c.read() // fails the test after 5 s without a packet
		if d.FixedHeader.Type != packets.Publish {
			t.Fatalf("got %+v, want the session's deliveries", d)
		}
		got[string(d.Payload)] = true
		c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: d.PacketID})
	}
	if !got["before"] || !got["during"] {
		t.Errorf("the new connection got %v, want before and during", got)
	}
}

// TestNoTopicAliasesTowardsClients: an MQTT 5 client that allows topic
// aliases gets every delivery with its topic name, so a delivery handed
// from a taken-over connection to its successor never carries an alias
// only the old connection knew.
func TestNoTopicAliasesTowardsClients(t *testing.T) {
	b := startTest(t)
	c := dialRawWith(t, b, 5, packets.ConnectParams{ClientIdentifier: "v5-alias"}, packets.Properties{TopicAliasMaximum: 10})
	c.send(subscribe(1, "triggers"))
	c.expect(packets.Suback, 1)
	for range 2 {
		if err := b.Publish("triggers", []byte("go"), false, 0); err != nil {
			t.Fatal(err)
		}
		if d := c.read(); d.TopicName != "triggers" || d.Properties.TopicAlias != 0 {
			t.Fatalf("delivery with topic %q, alias %d; want the name, no alias", d.TopicName, d.Properties.TopicAlias)
		}
	}
}

// holdTeardown holds a clean session's connection in mochi's teardown,
// after its "taken over?" check and before it unlists its client ID
// (in OnUnsubscribed, which the teardown calls between the two), until
// release is closed.
type holdTeardown struct {
	mqtt.HookBase
	id      string
	held    chan struct{}
	release chan struct{}
	once    sync.Once
	freed   sync.Once
}

func (h *holdTeardown) ID() string { return "test-hold-teardown" }

func (h *holdTeardown) Provides(b byte) bool {
	return b == mqtt.OnUnsubscribed || b == mqtt.OnSessionEstablished
}

func (h *holdTeardown) OnUnsubscribed(cl *mqtt.Client, _ packets.Packet) {
	if cl.ID == h.id {
		h.once.Do(func() { close(h.held); <-h.release })
	}
}

// OnSessionEstablished lets the held teardown go once a new connection
// of the ID is established (the order mochi alone gets wrong).
func (h *holdTeardown) OnSessionEstablished(cl *mqtt.Client, _ packets.Packet) {
	select {
	case <-h.held: // a connection of the ID is held in its teardown: this is the next one
		if cl.ID == h.id {
			h.let()
		}
	default:
	}
}

func (h *holdTeardown) let() { h.freed.Do(func() { close(h.release) }) }

// TestReconnectingAtOnceWithTheSameIDStaysListed: a clean session's
// connection closes and a new one of the same client ID arrives while
// mochi ends the old one, after its "taken over?" check and before it
// unlists the ID. The new connection gets what is published to its
// subscription. mochi alone unlisted the new connection (deleting the
// ID after the new one had listed itself), which stayed up and deaf: an
// agent's hub link restarted at once never got a control request.
func TestReconnectingAtOnceWithTheSameIDStaysListed(t *testing.T) {
	b := startTest(t)
	hold := &holdTeardown{id: "gw", held: make(chan struct{}), release: make(chan struct{})}
	if err := b.srv.AddHook(hold, nil); err != nil {
		t.Fatal(err)
	}
	ho := b.retained.handover
	ho.mu.Lock()
	ho.onWait = func(string) { hold.let() } // the new connection waits for the old one: let it end
	ho.mu.Unlock()
	defer hold.let()

	old := dialRawWith(t, b, 4, packets.ConnectParams{ClientIdentifier: "gw", Clean: true})
	old.send(subscribe(1, "ctl"))
	old.expect(packets.Suback, 1)
	_ = old.nc.Close()
	<-hold.held

	c := dialRawWith(t, b, 4, packets.ConnectParams{ClientIdentifier: "gw", Clean: true})
	c.send(subscribe(1, "ctl"))
	c.expect(packets.Suback, 1)
	testkit.Eventually(t, 5*time.Second, "the old connection gone", func() bool { return atomic.LoadInt64(&b.srv.Info.ClientsConnected) == 1 })
	if err := b.Publish("ctl", []byte("go"), false, 0); err != nil {
		t.Fatal(err)
	}
	if d := c.read(); d.FixedHeader.Type != packets.Publish || string(d.Payload) != "go" {
		t.Fatalf("the new connection got %+v, want the message", d)
	}
	if listed, ok := b.srv.Clients.Get("gw"); !ok || listed.Closed() {
		t.Errorf("client ID gw listed: %v, want the new connection", ok)
	}
}
