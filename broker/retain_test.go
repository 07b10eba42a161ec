package broker

import (
	"fmt"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/sortie-edge/sortie/internal/testkit"
)

func publishPk(topic, payload string, qos byte, id uint16, retain bool) packets.Packet {
	return packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: qos, Retain: retain}, PacketID: id, TopicName: topic, Payload: []byte(payload)}
}

// subscribeRaw connects as clientID (MQTT 3.1.1), subscribes to filter
// at QoS 1 and returns the client with what the subscription replayed.
func subscribeRaw(t *testing.T, b *Broker, clientID, filter string) (*rawClient, []packets.Packet) {
	t.Helper()
	c := dialRaw(t, b, clientID)
	c.send(subscribe(1, filter))
	c.expect(packets.Suback, 1)
	return c, c.ping()
}

// ping sends a PINGREQ and reads up to its PINGRESP, returning what came
// before it: mochi answers a client's packets in order, so whatever a
// SUBSCRIBE caused has been written by then.
func (c *rawClient) ping() []packets.Packet {
	c.t.Helper()
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pingreq}})
	var got []packets.Packet
	for {
		pk := c.read()
		if pk.FixedHeader.Type == packets.Pingresp {
			return got
		}
		got = append(got, pk)
	}
}

// TestRetainedMessagesReplayAfterTheSubackWithTheirFlag: a new
// subscription gets the retained messages its filter matches right after
// its SUBACK, flagged retained, at the lower of the message's and the
// subscription's QoS; a message forwarded as it is published is not
// flagged; an empty retained payload clears the topic.
func TestRetainedMessagesReplayAfterTheSubackWithTheirFlag(t *testing.T) {
	b := startTest(t)
	pub := dialRaw(t, b, "pub")
	pub.send(publishPk("home/lamp/state", "on", 1, 1, true))
	pub.expect(packets.Puback, 1)
	pub.send(publishPk("home/door/state", "closed", 0, 0, true))
	pub.send(publishPk("home/door/battery", "80", 0, 0, true))
	pub.ping()

	c := dialRaw(t, b, "app")
	c.send(subscribe(1, "home/+/state"))
	c.expect(packets.Suback, 1)
	got := map[string]packets.Packet{}
	for _, pk := range c.ping() {
		if pk.FixedHeader.Type != packets.Publish {
			t.Fatalf("after the SUBACK: %+v", pk)
		}
		got[pk.TopicName] = pk
	}
	if len(got) != 2 {
		t.Fatalf("replayed %d messages, want the 2 on home/+/state: %v", len(got), got)
	}
	lamp, door := got["home/lamp/state"], got["home/door/state"]
	if !lamp.FixedHeader.Retain || string(lamp.Payload) != "on" || lamp.FixedHeader.Qos != 1 || lamp.PacketID == 0 {
		t.Errorf("lamp replay %+v: want retained, QoS 1, numbered, payload on", lamp.FixedHeader)
	}
	if !door.FixedHeader.Retain || string(door.Payload) != "closed" || door.FixedHeader.Qos != 0 {
		t.Errorf("door replay %+v: want retained, QoS 0, payload closed", door.FixedHeader)
	}
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: lamp.PacketID})

	pub.send(publishPk("home/door/state", "open", 0, 0, true))
	if live := c.read(); live.FixedHeader.Retain || string(live.Payload) != "open" {
		t.Errorf("forwarded as published: %+v %q, want unflagged, open", live.FixedHeader, live.Payload)
	}
	if p, ok := b.Retained("home/door/state"); !ok || string(p) != "open" {
		t.Errorf("retained after the update: %q %v, want open", p, ok)
	}
	pub.send(publishPk("home/door/state", "", 0, 0, true))
	c.read() // forwarded, empty
	if p, ok := b.Retained("home/door/state"); ok {
		t.Errorf("an empty retained payload left %q retained", p)
	}

	// A QoS 0 subscription gets the QoS 1 message at QoS 0.
	c2 := dialRaw(t, b, "app2")
	c2.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe}, PacketID: 1, Filters: packets.Subscriptions{{Filter: "home/#"}}})
	c2.expect(packets.Suback, 1)
	rest := c2.ping()
	topics := map[string]byte{}
	for _, pk := range rest {
		topics[pk.TopicName] = pk.FixedHeader.Qos
	}
	if len(rest) != 2 || topics["home/lamp/state"] != 0 || topics["home/door/battery"] != 0 {
		t.Errorf("home/# at QoS 0 replayed %v, want home/lamp/state and home/door/battery at QoS 0", topics)
	}
}

// TestRetainedWillReplaysToLaterSubscribers: a client that dies with a
// retained will leaves it retained, as a device's "offline" must be.
func TestRetainedWillReplaysToLaterSubscribers(t *testing.T) {
	b := startTest(t)
	watch, _ := subscribeRaw(t, b, "watch", "home/+/availability") // its replay over, what comes next is forwarded

	dev := dialRawWith(t, b, 4, packets.ConnectParams{
		ClientIdentifier: "lamp", WillFlag: true, WillRetain: true, WillQos: 1,
		WillTopic: "home/lamp/availability", WillPayload: []byte("offline"),
	})
	_ = dev.nc.Close() // no DISCONNECT: the broker sends the will
	if will := watch.read(); string(will.Payload) != "offline" || will.FixedHeader.Retain {
		t.Fatalf("will forwarded: %+v %q, want offline, unflagged", will.FixedHeader, will.Payload)
	}
	if _, got := subscribeRaw(t, b, "late", "home/#"); len(got) != 1 || string(got[0].Payload) != "offline" || !got[0].FixedHeader.Retain {
		t.Fatalf("a later subscriber got %+v, want the will retained", got)
	}
}

// TestRetainHandlingOfMQTT5Subscriptions: retain handling 2 replays
// nothing, 1 only when the session did not have the filter, 0 always.
func TestRetainHandlingOfMQTT5Subscriptions(t *testing.T) {
	b := startTest(t)
	if err := b.Publish("home/lamp/state", []byte("on"), true, 0); err != nil {
		t.Fatal(err)
	}
	c := dialRawWith(t, b, 5, packets.ConnectParams{ClientIdentifier: "v5"})
	sub := func(id uint16, handling byte) int {
		c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe}, PacketID: id,
			Filters: packets.Subscriptions{{Filter: "home/#", RetainHandling: handling}}})
		c.expect(packets.Suback, id)
		return len(c.ping())
	}
	for i, tc := range []struct {
		handling byte
		want     int
	}{{2, 0}, {1, 0}, {0, 1}, {0, 1}} {
		if got := sub(uint16(i+1), tc.handling); got != tc.want {
			t.Errorf("subscription %d (retain handling %d, filter held): %d replayed, want %d", i+1, tc.handling, got, tc.want)
		}
	}
	fresh := dialRawWith(t, b, 5, packets.ConnectParams{ClientIdentifier: "v5-fresh"})
	fresh.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe}, PacketID: 1,
		Filters: packets.Subscriptions{{Filter: "home/#", RetainHandling: 1}}})
	fresh.expect(packets.Suback, 1)
	if got := fresh.ping(); len(got) != 1 {
		t.Errorf("retain handling 1 on a new filter: %d replayed, want 1", len(got))
	}
}

// TestRetainedReplayIsCheckedForAccess: a user whose filter is allowed
// gets only the retained messages on topics it may read.
func TestRetainedReplayIsCheckedForAccess(t *testing.T) {
	b := startWithAuth(t, AuthOptions{Users: lampBook(t), Allow: func(user, topic string, write bool) bool {
		return topic == "home/#" || topic == "home/"+user || topic == "home/marker"
	}})
	for _, topic := range []string{"home/lamp", "home/safe"} {
		if err := b.Publish(topic, []byte("x"), true, 0); err != nil {
			t.Fatal(err)
		}
	}
	got := make(chan string, 8)
	cl := paho.NewClient(paho.NewClientOptions().AddBroker(b.URL()).SetClientID("lamp").
		SetUsername("lamp").SetPassword("lamp-password").SetAutoReconnect(false).SetProtocolVersion(4))
	if tok := cl.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	defer cl.Disconnect(0)
	if tok := cl.Subscribe("home/#", 0, func(_ paho.Client, m paho.Message) { got <- m.Topic() }); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	// The broker answers the client's packets in order: the marker comes
	// after whatever the subscription replayed.
	if tok := cl.Publish("home/marker", 0, false, "m"); !tok.WaitTimeout(5 * time.Second) {
		t.Fatal("publish marker timed out")
	}
	var topics []string
	for topic := range got {
		if topic == "home/marker" {
			break
		}
		topics = append(topics, topic)
	}
	if len(topics) != 1 || topics[0] != "home/lamp" {
		t.Errorf("replayed %v, want only home/lamp (home/safe is not the user's to read)", topics)
	}
}

// TestInProcessSubscribersGetTheRetainedReplay: Subscribe and
// SubscribeRetained replay what is retained before they return, the
// latter flagging the replay and not the messages forwarded later.
func TestInProcessSubscribersGetTheRetainedReplay(t *testing.T) {
	b := startTest(t)
	if err := b.Publish("dev/a/state", []byte("1"), true, 1); err != nil {
		t.Fatal(err)
	}
	type msg struct {
		payload  string
		retained bool
	}
	var mu sync.Mutex
	var got []msg
	cancel, err := b.SubscribeRetained("dev/+/state", func(_ string, p []byte, retained bool) {
		mu.Lock()
		got = append(got, msg{string(p), retained})
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	var plain []string
	cancel2, err := b.Subscribe("dev/#", func(_ string, p []byte) { plain = append(plain, string(p)) })
	if err != nil {
		t.Fatal(err)
	}
	defer cancel2()
	if len(plain) != 1 || plain[0] != "1" {
		t.Errorf("Subscribe replayed %v, want [1]", plain)
	}
	if err := b.Publish("dev/a/state", []byte("2"), true, 1); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []msg{{"1", true}, {"2", false}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("SubscribeRetained got %v, want %v", got, want)
	}
}

// TestRetainedPublishesRaceWildcardSubscriptions: devices publish
// retained states on new topics while apps subscribe with wildcards, and
// a subscription made after the storm gets every topic once. (Under
// mochi's own store this was the data race; the race detector rarely
// sees it here, since mochi's shared atomic counters order most of the
// two sides' accesses: TestMochisTopicTreeKeepsNoRetainedPath is the
// deterministic check.)
func TestRetainedPublishesRaceWildcardSubscriptions(t *testing.T) {
	b := startTest(t)
	const pubs, perPub, subs = 4, 100, 4
	connect := func(id string) paho.Client {
		cl := paho.NewClient(paho.NewClientOptions().AddBroker(b.URL()).SetClientID(id).SetAutoReconnect(false))
		if tok := cl.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Fatalf("connect %s: %v", id, tok.Error())
		}
		t.Cleanup(func() { cl.Disconnect(0) })
		return cl
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for s := range subs {
		cl := connect(fmt.Sprintf("app-%d", s))
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				filter := []string{"storm/#", "storm/+/+", "+/+/state"}[i%3]
				if tok := cl.Subscribe(filter, 1, func(paho.Client, paho.Message) {}); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
					t.Errorf("subscribe: %v", tok.Error())
					return
				}
				cl.Unsubscribe(filter).WaitTimeout(5 * time.Second)
			}
		})
	}
	var pw sync.WaitGroup
	for p := range pubs {
		cl := connect(fmt.Sprintf("dev-%d", p))
		pw.Go(func() {
			// At QoS 0, not waiting for each: the broker takes a
			// client's packets in order, so the last one's PUBACK
			// says all are in.
			for i := range perPub {
				qos := byte(0)
				if i == perPub-1 {
					qos = 1
				}
				if tok := cl.Publish(fmt.Sprintf("storm/%d-%d/state", p, i), qos, true, "on"); qos == 1 && (!tok.WaitTimeout(5*time.Second) || tok.Error() != nil) {
					t.Errorf("publish: %v", tok.Error())
					return
				}
			}
		})
	}
	pw.Wait()
	close(stop)
	wg.Wait()

	seen := map[string]int{}
	var mu sync.Mutex
	last := connect("last")
	if tok := last.Subscribe("storm/#", 1, func(_ paho.Client, m paho.Message) {
		if m.Retained() {
			mu.Lock()
			seen[m.Topic()]++
			mu.Unlock()
		}
	}); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	done := make(chan struct{})
	if tok := last.Subscribe("marker", 0, func(paho.Client, paho.Message) { close(done) }); !tok.WaitTimeout(5 * time.Second) {
		t.Fatal("subscribe marker timed out")
	}
	last.Publish("marker", 0, false, "m")
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("no marker")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != pubs*perPub {
		t.Errorf("replayed %d topics, want %d", len(seen), pubs*perPub)
	}
	for topic, n := range seen {
		if n != 1 {
			t.Errorf("%s replayed %d times, want once", topic, n)
		}
	}
}

// TestMochisTopicTreeKeepsNoRetainedPath: no retained publish, inline
// publish or will writes a retained path into mochi's topic tree, the
// field its wildcard scan reads unlocked; its scan finds nothing off
// $SYS, and the replay comes from the retainer.
func TestMochisTopicTreeKeepsNoRetainedPath(t *testing.T) {
	b := startTest(t)
	if err := b.Publish("home/hall/state", []byte("on"), true, 1); err != nil {
		t.Fatal(err)
	}
	pub := dialRaw(t, b, "pub")
	pub.send(publishPk("home/lamp/state", "on", 1, 1, true))
	pub.expect(packets.Puback, 1)
	dev := dialRawWith(t, b, 4, packets.ConnectParams{
		ClientIdentifier: "lamp", WillFlag: true, WillRetain: true,
		WillTopic: "home/lamp/availability", WillPayload: []byte("offline"),
	})
	_ = dev.nc.Close()
	testkit.Eventually(t, 5*time.Second, "the will retained", func() bool { _, ok := b.Retained("home/lamp/availability"); return ok })
	for _, filter := range []string{"#", "home/#", "home/+/state", "home/lamp/state"} {
		if kept := b.Server().Topics.Messages(filter); len(kept) != 0 {
			t.Errorf("mochi's tree holds %d retained messages for %s, want none", len(kept), filter)
		}
	}
	for _, topic := range []string{"home/hall/state", "home/lamp/state", "home/lamp/availability"} {
		if _, ok := b.Retained(topic); !ok {
			t.Errorf("%s not retained", topic)
		}
	}
}

// TestDelayedRetainedWillIsKeptOnceSentAndOnlyThen: an MQTT 5 client's
// retained will with a delay is retained when the broker sends it after
// the delay (and replayed: mochi stamped it with an expiry already past),
// and a later will without the retain flag from the same client ID is
// not retained because the earlier one was delayed.
func TestDelayedRetainedWillIsKeptOnceSentAndOnlyThen(t *testing.T) {
	b := startTest(t)
	watch, _ := subscribeRaw(t, b, "watch", "home/#") // its replay over, what comes next is forwarded
	session := packets.Properties{SessionExpiryInterval: 600, SessionExpiryIntervalFlag: true}
	dev := dialRawWith(t, b, 5, packets.ConnectParams{
		ClientIdentifier: "lamp", WillFlag: true, WillRetain: true,
		WillTopic: "home/lamp/availability", WillPayload: []byte("offline"),
		WillProperties: packets.Properties{WillDelayInterval: 1},
	}, session)
	_ = dev.nc.Close()
	if will := watch.read(); string(will.Payload) != "offline" {
		t.Fatalf("will forwarded: %q", will.Payload)
	}
	testkit.Eventually(t, 5*time.Second, "the delayed will retained", func() bool { _, ok := b.Retained("home/lamp/availability"); return ok })
	if _, got := subscribeRaw(t, b, "late", "home/#"); len(got) != 1 || string(got[0].Payload) != "offline" || !got[0].FixedHeader.Retain {
		t.Fatalf("a later subscriber got %+v, want the delayed will retained", got)
	}

	// A delayed retained will cancelled by a reconnection, then a will
	// without the flag: the second is forwarded, not retained.
	dev = dialRawWith(t, b, 5, packets.ConnectParams{
		ClientIdentifier: "fan", WillFlag: true, WillRetain: true,
		WillTopic: "home/fan/availability", WillPayload: []byte("offline"),
		WillProperties: packets.Properties{WillDelayInterval: 30},
	}, session)
	_ = dev.nc.Close()
	dev = dialRawWith(t, b, 5, packets.ConnectParams{
		ClientIdentifier: "fan", WillFlag: true,
		WillTopic: "home/fan/availability", WillPayload: []byte("bye"),
	}, session)
	_ = dev.nc.Close()
	for {
		if m := watch.read(); string(m.Payload) == "bye" {
			break
		}
	}
	if p, ok := b.Retained("home/fan/availability"); ok {
		t.Errorf("a will without the retain flag was retained: %q", p)
	}
}

// TestRetainedMessagesLastUntilClearedOrTheirOwnExpiry: a retained
// message without an MQTT 5 expiry is kept with none (mochi dropped
// every retained message a day old), and one with an expiry goes once
// it passes.
func TestRetainedMessagesLastUntilClearedOrTheirOwnExpiry(t *testing.T) {
	b := startTest(t)
	pub := dialRawWith(t, b, 5, packets.ConnectParams{ClientIdentifier: "pub"})
	pub.send(publishPk("home/lamp/state", "on", 0, 0, true))
	brief := publishPk("home/door/ring", "ding", 0, 0, true)
	brief.Properties.MessageExpiryInterval = 1
	pub.send(brief)
	pub.ping()
	b.retained.mu.RLock()
	kept := b.retained.msgs["home/lamp/state"].Expiry
	b.retained.mu.RUnlock()
	if kept != 0 {
		t.Errorf("a retained message without an expiry is kept until %d, want no expiry", kept)
	}
	if _, ok := b.Retained("home/door/ring"); !ok {
		t.Fatal("the message with an expiry was not retained")
	}
	testkit.Eventually(t, 5*time.Second, "the expired message gone", func() bool { _, ok := b.Retained("home/door/ring"); return !ok })
	if _, got := subscribeRaw(t, b, "app", "home/#"); len(got) != 1 || got[0].TopicName != "home/lamp/state" {
		t.Errorf("replayed %+v, want only home/lamp/state", got)
	}
}
