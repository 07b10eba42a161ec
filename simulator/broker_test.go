package simulator

import (
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
)

func TestBrokerRoundTrip(t *testing.T) {
	b := TestBroker(t)
	opts := paho.NewClientOptions().AddBroker(b.URL()).SetClientID("t1").SetAutoReconnect(false)
	c := paho.NewClient(opts)
	if tok := c.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	defer c.Disconnect(100)
	got := make(chan string, 1)
	if tok := c.Subscribe("x/y", 1, func(_ paho.Client, m paho.Message) { got <- string(m.Payload()) }); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	if tok := c.Publish("x/y", 1, false, "hello"); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}
	select {
	case s := <-got:
		if s != "hello" {
			t.Fatalf("got %q, want hello", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no message")
	}
}

func TestBrokerPortTaken(t *testing.T) {
	b := TestBroker(t)
	if _, err := StartBroker(BrokerOptions{Addr: b.Addr()}); err == nil {
		t.Fatal("second broker on the same port: want error")
	}
}

func TestBrokerSubscribed(t *testing.T) {
	b := TestBroker(t)
	topic := "sortie/gateways/home/missions/m1/events"
	if b.Subscribed(topic) {
		t.Fatal("subscribed with no client")
	}
	c := paho.NewClient(paho.NewClientOptions().AddBroker(b.URL()).SetClientID("t-sub").SetAutoReconnect(false))
	if tok := c.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	defer c.Disconnect(100)
	for _, filter := range []string{"sortie/gateways/+/missions/+/events", "$share/apps/sortie/#"} {
		if tok := c.Subscribe(filter, 0, nil); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Fatalf("subscribe %s: %v", filter, tok.Error())
		}
		if !b.Subscribed(topic) {
			t.Errorf("not subscribed through %s", filter)
		}
		if b.Subscribed("sortie/gateways/home/replies/r1") != (filter == "$share/apps/sortie/#") {
			t.Errorf("%s: wrong answer for a topic it does not match", filter)
		}
		if tok := c.Unsubscribe(filter); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Fatalf("unsubscribe: %v", tok.Error())
		}
		if b.Subscribed(topic) {
			t.Errorf("still subscribed after unsubscribing %s", filter)
		}
	}
}
