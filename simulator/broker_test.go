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
