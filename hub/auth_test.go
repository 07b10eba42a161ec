package hub

import (
	"errors"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/sortie-edge/sortie/uplink"
)

func TestHashPassword(t *testing.T) {
	h, err := HashPassword("s3cret")
	if err != nil || ParseHash(h) != nil {
		t.Fatalf("HashPassword: %q, %v", h, err)
	}
	if _, err := HashPassword(""); !errors.Is(err, ErrInvalid) {
		t.Fatalf("empty password: %v", err)
	}
	for _, bad := range []string{"", "plain", "pbkdf2-sha256$x$a$b", "md5$1$YQ$YQ"} {
		if err := ParseHash(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseHash(%q) = %v, want ErrInvalid", bad, err)
		}
	}
	if _, err := NewAuth(AuthOptions{HubUser: "hub", HubPassword: "x", Gateways: map[string]string{"gw": "plain"}}); err == nil {
		t.Error("NewAuth took a plain password")
	}
	if _, err := NewAuth(AuthOptions{HubUser: "hub", HubPassword: "x", Gateways: map[string]string{"hub": h}}); err == nil {
		t.Error("NewAuth took a gateway named like the hub")
	}
	if _, err := NewAuth(AuthOptions{HubUser: "hub"}); err == nil {
		t.Error("NewAuth took a hub without password")
	}
}

func TestBrokerRefusesBadLogins(t *testing.T) {
	b := testBroker(t, "a", "b")
	cases := []struct {
		name, user string
		o          gatewayOpts
	}{
		{"wrong password", "a", gatewayOpts{password: "pw-b"}},
		{"unknown gateway", "c", gatewayOpts{password: "pw-c"}},
		{"anonymous", "", gatewayOpts{anonymous: true}},
		{"empty user name", "", gatewayOpts{password: "pw-a"}},
		{"hub's client id", "a", gatewayOpts{clientID: hubClientID}},
		{"another gateway's default client id", "a", gatewayOpts{clientID: uplink.DefaultClientID("b")}},
		{"another gateway's name as client id", "a", gatewayOpts{clientID: "b.1"}},
		{"will on another gateway's status", "a", gatewayOpts{will: uplink.Topics{}.Status("b")}},
		{"hub password for a gateway", "a", gatewayOpts{password: hubPassword}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g, err := dialGateway(b.URL(), tc.user, tc.o)
			if err == nil {
				g.c.Disconnect(0)
				t.Fatal("connected")
			}
			if !strings.Contains(err.Error(), "not Authorized") && !strings.Contains(err.Error(), "bad user name or password") {
				t.Fatalf("err = %v, want a refusal", err)
			}
		})
	}
	// The right password works, twice (the second from the cache), and
	// with the gateway's own default client ID.
	for _, id := range []string{"", "", uplink.DefaultClientID("a")} {
		g, err := dialGateway(b.URL(), "a", gatewayOpts{clientID: id})
		if err != nil {
			t.Fatalf("good login refused: %v", err)
		}
		g.c.Disconnect(0)
	}
	// A client ID in use by one gateway cannot be taken by another.
	held, err := dialGateway(b.URL(), "b", gatewayOpts{clientID: "shared-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer held.c.Disconnect(0)
	if g, err := dialGateway(b.URL(), "a", gatewayOpts{clientID: "shared-1"}); err == nil {
		g.c.Disconnect(0)
		t.Fatal("gateway a took gateway b's client ID")
	}
}

// TestACL proves with the real broker and clients that a gateway can
// publish only on its own uplink topics and read only its own ack and
// control topics.
func TestACL(t *testing.T) {
	b := testBroker(t, "a", "b")
	obs := newObserver(t, b.URL())
	tp := uplink.Topics{}
	marker := 0
	// published returns what the observer saw before a fresh marker from
	// a new, well-behaved connection of gateway a. The broker handled
	// every earlier publish before that connection existed.
	published := func(t *testing.T) []paho.Message {
		t.Helper()
		marker++
		m := "marker-" + string(rune('0'+marker))
		g := newGateway(t, b.URL(), "a")
		g.publish(t, tp.Heartbeat("a"), false, map[string]string{"gateway": "a", "version": m})
		defer g.c.Disconnect(0)
		return obs.until(t, tp.Heartbeat("a"), m)
	}
	published(t) // drain the observer's start

	forbidden := []struct{ name, topic string }{
		{"another gateway's events", tp.Events("b")},
		{"another gateway's status", tp.Status("b")},
		{"its own control topic", tp.Control("a")},
		{"its own ack topic", tp.Ack("a")},
		{"another gateway's control", tp.Control("b")},
		{"outside the hub tree", "sortie/home/devices/lamp/set"},
	}
	for _, tc := range forbidden {
		t.Run("publish "+tc.name, func(t *testing.T) {
			g, err := dialGateway(b.URL(), "a", gatewayOpts{})
			if err != nil {
				t.Fatal(err)
			}
			defer g.c.Disconnect(0)
			tok := g.c.Publish(tc.topic, 1, false, []byte(`{"forbidden":true}`))
			_ = tok.WaitTimeout(time.Second) // no ack comes: the broker drops the connection instead
			select {
			case err := <-g.lost:
				t.Logf("connection lost, as it should be: %v", err)
			case <-time.After(wait):
				t.Fatal("a QoS 1 publish to a forbidden topic did not cost the connection")
			}
			for _, m := range published(t) {
				if strings.Contains(string(m.Payload()), "forbidden") {
					t.Fatalf("forbidden message delivered on %s", m.Topic())
				}
			}
		})
	}

	t.Run("QoS 0 publish is dropped", func(t *testing.T) {
		g := newGateway(t, b.URL(), "a")
		tok := g.c.Publish(tp.Events("b"), 0, false, []byte(`{"forbidden":true}`))
		if !tok.WaitTimeout(wait) {
			t.Fatal("publish not sent")
		}
		g.publish(t, tp.Heartbeat("a"), false, map[string]string{"version": "after-qos0"})
		for _, m := range obs.until(t, tp.Heartbeat("a"), "after-qos0") {
			if strings.Contains(string(m.Payload()), "forbidden") {
				t.Fatalf("forbidden message delivered on %s", m.Topic())
			}
		}
	})

	t.Run("allowed topics", func(t *testing.T) {
		g := newGateway(t, b.URL(), "a")
		for _, topic := range []string{tp.Status("a"), tp.Heartbeat("a"), tp.Events("a"), tp.ControlResult("a")} {
			g.publish(t, topic, false, map[string]string{"ok": topic})
			for _, m := range obs.until(t, topic, topic) {
				// The earlier subtests' connections were cut by the broker;
				// their last wills (status "offline") may still arrive.
				if m.Topic() == tp.Status("a") && strings.Contains(string(m.Payload()), `"offline"`) {
					continue
				}
				t.Fatalf("unexpected message before %s: %s %s", topic, m.Topic(), m.Payload())
			}
		}
	})

	t.Run("subscriptions", func(t *testing.T) {
		g := newGateway(t, b.URL(), "a")
		for _, tc := range []struct {
			filter string
			ok     bool
		}{
			{tp.Ack("a"), true},
			{tp.Control("a"), true},
			{tp.Control("b"), false},
			{tp.Ack("b"), false},
			{tp.Wildcard("control"), false},
			{tp.Events("b"), false},
			{"sortie/#", false},
			{"#", false},
		} {
			tok := g.c.Subscribe(tc.filter, 1, func(paho.Client, paho.Message) {})
			if !tok.WaitTimeout(wait) || tok.Error() != nil {
				t.Fatalf("subscribe %s: %v", tc.filter, tok.Error())
			}
			code := tok.(*paho.SubscribeToken).Result()[tc.filter]
			if got := code < 0x80; got != tc.ok {
				t.Errorf("subscribe %s: granted %#x, want allowed=%v", tc.filter, code, tc.ok)
			}
		}
	})

	t.Run("hub reaches gateway a only", func(t *testing.T) {
		ga := newGateway(t, b.URL(), "a")
		gb := newGateway(t, b.URL(), "b")
		ctl := uplink.Control{ID: "c1", Action: uplink.ActionCancel, MissionID: "m"}
		// The observer is the hub identity: it may publish controls.
		for _, gw := range []string{"a", "b"} {
			c := ctl
			c.MissionID = "m-" + gw
			if tok := obs.c.Publish(tp.Control(gw), 1, false, mustJSON(t, c)); !tok.WaitTimeout(wait) || tok.Error() != nil {
				t.Fatal(tok.Error())
			}
		}
		if c := ga.waitControl(t); c.MissionID != "m-a" {
			t.Fatalf("a got %+v", c)
		}
		if c := gb.waitControl(t); c.MissionID != "m-b" {
			t.Fatalf("b got %+v", c)
		}
	})
}
