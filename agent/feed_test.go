package agent

import (
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/sortie-edge/sortie/broker"
	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/testkit"
)

type chanPublisher chan string

func (c chanPublisher) Publish(topic string, _ byte, _ bool, payload []byte) error {
	c <- topic + " " + string(payload)
	return nil
}

// TestFeedSkipsUnfollowedEvents: with the embedded broker, an event no
// client subscribes to is not published; one that is followed is. The
// broker is asked once per mission until a subscription is made.
func TestFeedSkipsUnfollowedEvents(t *testing.T) {
	pub := make(chanPublisher, 4)
	f := newFeed(slog.New(slog.NewTextHandler(io.Discard, nil)), pub, newAgentTopics("sortie", "home"), "home")
	var asked, added atomic.Int32
	var follow atomic.Value // the mission ID whose events someone follows
	follow.Store("m2")
	f.listened = func(topic string) bool {
		asked.Add(1)
		return strings.Contains(topic, "/missions/"+follow.Load().(string)+"/")
	}
	f.subsAdded = func() uint64 { return uint64(added.Load()) }
	testkit.Go(t, f.Run)

	seq := uint64(0)
	ev := func(id string, to driver.State) (driver.Event, *driver.Mission) {
		seq++
		return driver.Event{MissionID: id, Seq: seq, Input: driver.InBeginStep, To: to, Time: time.Now()},
			&driver.Mission{ID: id, Type: "go_home", Steps: make([]driver.Step, 3)}
	}
	published := func(want string) {
		t.Helper()
		select {
		case got := <-pub:
			var msg EventMessage
			topic, payload, _ := strings.Cut(got, " ")
			if err := json.Unmarshal([]byte(payload), &msg); err != nil || msg.MissionID != want || topic != "sortie/gateways/home/missions/"+want+"/events" {
				t.Errorf("published %q (%v), want %s's event on its events topic", got, err, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("a followed event of %s was not published", want)
		}
	}
	f.Observe(ev("m1", driver.StateStepRunning)) // nobody follows m1
	f.Observe(ev("m1", driver.StateStepSucceeded))
	f.Observe(ev("m2", driver.StateStepRunning))
	published("m2")
	if n := asked.Load(); n != 2 {
		t.Errorf("listened asked %d times for two missions, want 2", n)
	}
	// A subscription made since the "no" for m1: the broker is asked again.
	follow.Store("m1")
	added.Add(1)
	f.Observe(ev("m1", driver.StateStepRunning))
	published("m1")
	if n := asked.Load(); n != 3 {
		t.Errorf("listened asked %d times after a new subscription, want 3", n)
	}
	select {
	case got := <-pub:
		t.Errorf("unfollowed event published: %s", got)
	default:
	}
	// A mission's answer is forgotten when it ends.
	f.Observe(ev("m1", driver.StateSucceeded))
	published("m1")
	if _, kept := f.followed["m1"]; kept {
		t.Error("the answer for a finished mission is kept")
	}
}

type brokerPublisher struct{ b *broker.Broker }

func (p brokerPublisher) Publish(topic string, qos byte, retained bool, payload []byte) error {
	return p.b.Publish(topic, payload, retained, qos)
}

// TestFeedLateSubscriber: with a real broker, an app that subscribes to
// a mission's events after the feed found nobody following them gets the
// events from then on.
func TestFeedLateSubscriber(t *testing.T) {
	b := brokertest.Start(t)
	f := newFeed(slog.New(slog.NewTextHandler(io.Discard, nil)), brokerPublisher{b}, newAgentTopics("sortie", "home"), "home")
	f.listened, f.subsAdded = b.Subscribed, b.SubscriptionsAdded
	testkit.Go(t, f.Run)
	m := &driver.Mission{ID: "m1", Type: "go_home", Steps: make([]driver.Step, 2)}
	ev := func(seq uint64) driver.Event {
		return driver.Event{MissionID: "m1", Seq: seq, Input: driver.InBeginStep, To: driver.StateStepRunning, Time: time.Now()}
	}
	f.Observe(ev(1), m) // nobody follows yet

	app := paho.NewClient(paho.NewClientOptions().AddBroker(b.URL()).SetClientID("late-app").SetAutoReconnect(false))
	if tok := app.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	defer app.Disconnect(50)
	got := make(chan EventMessage, 4)
	if tok := app.Subscribe("sortie/gateways/home/missions/+/events", 0, func(_ paho.Client, msg paho.Message) {
		var e EventMessage
		if err := json.Unmarshal(msg.Payload(), &e); err != nil {
			t.Errorf("event is not JSON: %s", msg.Payload())
		}
		got <- e
	}); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	f.Observe(ev(2), m)
	e := testkit.Receive(t, got, 5*time.Second, "the late subscriber got no event")
	if e.Seq != 2 {
		t.Errorf("got event %d, want 2 (1 was published to nobody)", e.Seq)
	}
}
