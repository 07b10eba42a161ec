package broker

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
)

func TestBrokerRoundTrip(t *testing.T) {
	b := startTest(t)
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
	b := startTest(t)
	if _, err := Start(Options{Addr: b.Addr()}); err == nil {
		t.Fatal("second broker on the same port: want error")
	}
}

func TestBrokerSubscribed(t *testing.T) {
	b := startTest(t)
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
		before := b.SubscriptionsAdded()
		if tok := c.Subscribe(filter, 0, nil); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Fatalf("subscribe %s: %v", filter, tok.Error())
		}
		// A "no" kept from before the subscription must be seen as stale.
		if b.SubscriptionsAdded() == before {
			t.Errorf("SubscriptionsAdded did not change with a subscription to %s", filter)
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
	before := b.SubscriptionsAdded()
	cancel, err := b.Subscribe("sortie/gateways/home/missions/#", func(string, []byte) {})
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	if b.SubscriptionsAdded() == before || !b.Subscribed(topic) {
		t.Error("an inline subscription is not counted or not seen")
	}
}

func TestMatchTopic(t *testing.T) {
	for _, c := range []struct {
		filter, topic string
		want          bool
	}{
		{"a/b", "a/b", true}, {"a/b", "a/c", false}, {"a/b", "a/b/c", false}, {"a/b/c", "a/b", false},
		{"a/+", "a/b", true}, {"a/+", "a/b/c", false}, {"a/+", "a", false}, {"a/+", "a/", true},
		{"+/+", "a/b", true}, {"+", "", true}, {"sortie/devices/+/ack", "sortie/devices/lamp/ack", true},
		{"sortie/devices/+/ack", "sortie/devices/lamp/state", false}, {"sortie/devices/+/ack", "sortie/devices/ack", false},
		{"a/#", "a", true}, {"a/#", "a/b/c", true}, {"a/#", "ab", false}, {"#", "a/b", true},
		{"#", "$SYS/x", false}, {"+/x", "$SYS/x", false}, {"$SYS/#", "$SYS/x", true},
	} {
		if got := matchTopic(c.filter, c.topic); got != c.want {
			t.Errorf("matchTopic(%q, %q) = %v, want %v", c.filter, c.topic, got, c.want)
		}
	}
}

// A tap has a message before the broker acknowledges it to its
// publisher, sees no retained message from before, and nothing after
// its cancel.
func TestBrokerTap(t *testing.T) {
	b := startTest(t)
	if err := b.Publish("dev/lamp/ack", []byte("old"), true, 1); err != nil {
		t.Fatal(err)
	}
	got, release := make(chan string, 4), make(chan struct{})
	cancel, err := b.Tap("dev/+/ack", func(topic string, payload []byte) {
		got <- topic + " " + string(payload)
		<-release
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"dev/#/ack", "$share/g/dev/+/ack"} {
		if _, err := b.Tap(f, func(string, []byte) {}); err == nil {
			t.Errorf("filter %q was tapped", f)
		}
	}
	if _, err := b.Tap("dev/+/ack", nil); err == nil {
		t.Error("a nil handler was taken")
	}
	c := paho.NewClient(paho.NewClientOptions().AddBroker(b.URL()).SetClientID("t-tap").SetAutoReconnect(false))
	if tok := c.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	defer c.Disconnect(100)
	c.Publish("dev/lamp/state", 1, false, "not tapped")
	tok := c.Publish("dev/lamp/ack", 1, false, "new")
	select {
	case s := <-got:
		if s != "dev/lamp/ack new" {
			t.Fatalf("tapped %q, want the new ack (and no retained one)", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the publish never reached the tap")
	}
	select {
	case <-tok.Done():
		t.Fatal("the broker acknowledged the publish before its tap returned")
	default:
	}
	close(release)
	if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}
	cancel()
	if tok := c.Publish("dev/lamp/ack", 1, false, "after cancel"); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}
	select {
	case s := <-got:
		t.Errorf("tapped %q after cancel", s)
	default:
	}
}

// startTest starts a broker on a free loopback port for a test; the
// package's own tests cannot import brokertest, which imports it.
func startTest(tb testing.TB) *Broker {
	tb.Helper()
	b, err := Start(Options{Addr: "127.0.0.1:0"})
	if err != nil {
		tb.Fatalf("start broker: %v", err)
	}
	tb.Cleanup(func() { _ = b.Close() }) // Close's error is the broker's shutdown, not the test's subject
	return b
}

// TestCloseLogsNoClientWarnings: closing a broker with clients connected
// logs no warning for each client's connection it breaks (mochi warns,
// with an empty message, for every read cut short), while a warning
// before Close still gets through.
func TestCloseLogsNoClientWarnings(t *testing.T) {
	var buf strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(&lockedWriter{w: &buf, mu: &mu}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	b, err := Start(Options{Addr: "127.0.0.1:0", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		c := paho.NewClient(paho.NewClientOptions().AddBroker(b.URL()).SetClientID(fmt.Sprintf("c%d", i)).SetAutoReconnect(false))
		if tok := c.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Fatalf("connect: %v", tok.Error())
		}
	}
	b.Server().Log.Warn("before close") // stands in for a warning that matters
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got := buf.String()
	mu.Unlock()
	if !strings.Contains(got, "before close") {
		t.Errorf("the warning before Close was dropped:\n%s", got)
	}
	if n := strings.Count(got, "level=WARN"); n != 1 {
		t.Errorf("%d warnings logged, want only the one before Close:\n%s", n, got)
	}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestCloseSendsNoDisconnectToAnMQTT311Client: MQTT 3.1.1 has no
// DISCONNECT from a server, so at Close a 3.1.1 client's connection is
// closed without one (mosquitto_sub reported "A network protocol error
// occurred"); an MQTT 5 client gets one, with its reason.
func TestCloseSendsNoDisconnectToAnMQTT311Client(t *testing.T) {
	for _, c := range []struct {
		version byte
		want    bool // a DISCONNECT before the end
	}{{4, false}, {5, true}} {
		b, err := Start(Options{Addr: "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		conn, err := net.Dial("tcp", b.Addr())
		if err != nil {
			t.Fatal(err)
		}
		// CONNECT: protocol name "MQTT", level, clean session, keep-alive 60,
		// client ID "c" (and, in 5, an empty property list).
		body := []byte{0, 4, 'M', 'Q', 'T', 'T', c.version, 2, 0, 60}
		if c.version == 5 {
			body = append(body, 0)
		}
		body = append(body, 0, 1, 'c')
		if _, err := conn.Write(append([]byte{0x10, byte(len(body))}, body...)); err != nil {
			t.Fatal(err)
		}
		ack := make([]byte, 2)
		if _, err := io.ReadFull(conn, ack); err != nil || ack[0] != 0x20 {
			t.Fatalf("v%d: CONNACK %x, %v", c.version, ack, err)
		}
		rest := make([]byte, ack[1])
		if _, err := io.ReadFull(conn, rest); err != nil {
			t.Fatal(err)
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		after, err := io.ReadAll(conn)
		_ = conn.Close() // read to its end
		if err != nil {
			t.Fatalf("v%d: reading to the end: %v", c.version, err)
		}
		got := len(after) > 0 && after[0] == 0xE0
		if got != c.want {
			t.Errorf("MQTT v%d client: DISCONNECT sent = %v, want %v (bytes %x)", c.version, got, c.want, after)
		}
	}
}
