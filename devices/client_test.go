package devices_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/sortie-edge/sortie/broker"
	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/devices/wire"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/testkit"
)

func TestSendAck(t *testing.T) {
	b := brokertest.Start(t)
	dev := startDevice(t, b, "lamp", map[string]any{"power": "off"}, nil)
	c := dial(t, b, nil)

	ack, err := send(t.Context(), c, "lamp", wire.Command{ID: "m1-s1", Action: "turn_on", Params: map[string]any{"brightness": 40}})
	if err != nil {
		t.Fatalf("Send: %v", err)
	}
	if !ack.OK || ack.ID != "m1-s1" {
		t.Fatalf("ack = %+v, want ok for m1-s1", ack)
	}
	if got := ack.State["brightness"]; got != int64(40) {
		t.Errorf("ack state brightness = %#v, want int64(40)", got)
	}
	if got := dev.effectCount("m1-s1"); got != 1 {
		t.Errorf("effects = %d, want 1", got)
	}
	cmd := dev.next(t)
	if cmd.Expires.IsZero() || time.Until(cmd.Expires) > time.Second {
		t.Errorf("command expires %v, want within the ack timeout", cmd.Expires)
	}
	s := c.Stats()
	if s.Sent != 1 || s.Acked != 1 || s.Timeouts != 0 {
		t.Errorf("stats = %+v, want 1 sent, 1 acked", s)
	}
}

func TestRetryAfterLostAck(t *testing.T) {
	b := brokertest.Start(t)
	dev := startDevice(t, b, "lamp", nil, func(_ wire.Command, n int) reply {
		return reply{Drop: n == 1}
	})
	c := dial(t, b, func(o *devices.Options) { o.AckTimeout = 150 * time.Millisecond })
	cmd := wire.Command{ID: "m1-s1", Action: "turn_on"}

	_, err := send(t.Context(), c, "lamp", cmd)
	if !errors.Is(err, driver.ErrAckTimeout) {
		t.Fatalf("first Send: err = %v, want ErrAckTimeout", err)
	}
	if class, _ := driver.Classify(err); class != driver.Retryable {
		t.Errorf("class = %v, want retryable", class)
	}
	cmd.Attempt = 2
	ack, err := send(t.Context(), c, "lamp", cmd)
	if err != nil || !ack.OK {
		t.Fatalf("retry: ack %+v, err %v", ack, err)
	}
	if got := dev.effectCount("m1-s1"); got != 1 {
		t.Errorf("effect applied %d times, want once", got)
	}
	if got := dev.receivedCount("m1-s1"); got != 2 {
		t.Errorf("device received %d commands, want 2", got)
	}
	if s := c.Stats(); s.Timeouts != 1 || s.Acked != 1 || s.Sent != 2 {
		t.Errorf("stats = %+v, want 1 timeout, 1 acked, 2 sent", s)
	}
}

func TestRejections(t *testing.T) {
	for _, tc := range []struct {
		code      string
		retryable bool
	}{
		{wire.CodeInvalidParam, false},
		{wire.CodeJammed, false},
		{"something_new", false},
		{wire.CodeBusy, true},
		{wire.CodeExpired, true},
	} {
		t.Run(tc.code, func(t *testing.T) {
			b := brokertest.Start(t)
			id := "dev-" + tc.code
			dev := startDevice(t, b, id, nil, func(wire.Command, int) reply { return reply{Code: tc.code} })
			c := dial(t, b, nil)
			ack, err := send(t.Context(), c, id, wire.Command{ID: "c1", Action: "lock"})
			var rej *devices.RejectedError
			if !errors.As(err, &rej) {
				t.Fatalf("err = %v, want *RejectedError", err)
			}
			if rej.Code != tc.code || rej.Retryable() != tc.retryable || ack.OK {
				t.Errorf("rejection %+v (retryable %v), ack %+v; want code %s retryable %v", rej, rej.Retryable(), ack, tc.code, tc.retryable)
			}
			if got := dev.receivedCount("c1"); got != 1 {
				t.Errorf("published %d times, want 1", got)
			}
			if got := dev.effectCount("c1"); got != 0 {
				t.Errorf("rejected command applied %d times", got)
			}
		})
	}
}

func TestLateAckCompletesRetry(t *testing.T) {
	b := brokertest.Start(t)
	hold := make(chan struct{})
	dev := startDevice(t, b, "lock1", nil, func(_ wire.Command, n int) reply {
		return reply{Hold: hold}
	})
	stray := make(chan bool, 4)
	c := dial(t, b, func(o *devices.Options) {
		o.AckTimeout = 100 * time.Millisecond
		o.OnStrayAck = func(_ string, _ wire.Ack, dup bool) { stray <- dup }
	})
	cmd := wire.Command{ID: "late-1", Action: "lock"}
	if _, err := send(t.Context(), c, "lock1", cmd); !errors.Is(err, driver.ErrAckTimeout) {
		t.Fatalf("Send: err = %v, want ack timeout", err)
	}
	close(hold) // the device answers now, after the sender gave up
	if dup := <-stray; dup {
		t.Fatal("late ack reported as duplicate")
	}
	ack, err := send(t.Context(), c, "lock1", cmd)
	if err != nil || !ack.OK {
		t.Fatalf("retry: ack %+v, err %v", ack, err)
	}
	if got := dev.receivedCount("late-1"); got != 1 {
		t.Errorf("device received %d commands, want 1: the retry should complete from the late ack", got)
	}
	if got := dev.effectCount("late-1"); got != 1 {
		t.Errorf("effects = %d, want 1", got)
	}
	if s := c.Stats(); s.LateAcks != 1 || s.Cached != 1 || s.Sent != 1 || s.Timeouts != 1 {
		t.Errorf("stats = %+v, want 1 late, 1 cached, 1 sent, 1 timeout", s)
	}
}

// A late ack wakes the step that gave up on it (its retry may go at
// once) only when the retry can use it: a late "busy" would only make the
// retry skip its backoff and send again.
func TestLateAckWakesOnlyAUsableRetry(t *testing.T) {
	b := brokertest.Start(t)
	hold := make(chan struct{})
	startDevice(t, b, "lamp", nil, func(cmd wire.Command, _ int) reply {
		if cmd.ID == "late-busy" {
			return reply{Hold: hold, Code: "busy"}
		}
		return reply{Hold: hold}
	})
	stray := make(chan bool, 4)
	var mu sync.Mutex
	var woken []string
	c := dial(t, b, func(o *devices.Options) {
		o.AckTimeout = 100 * time.Millisecond
		o.OnStrayAck = func(_ string, _ wire.Ack, dup bool) { stray <- dup }
		o.OnChange = func(key string) {
			mu.Lock()
			woken = append(woken, key)
			mu.Unlock()
		}
	})
	for _, id := range []string{"late-busy", "late-ok"} {
		if _, err := send(t.Context(), c, "lamp", wire.Command{ID: id, Action: "turn_on"}); !errors.Is(err, driver.ErrAckTimeout) {
			t.Fatalf("Send %s: err = %v, want ack timeout", id, err)
		}
	}
	close(hold) // both answer now, after the sender gave up
	<-stray
	<-stray
	mu.Lock()
	defer mu.Unlock()
	if !slices.Contains(woken, devices.AckKey("lamp", "late-ok")) || slices.Contains(woken, devices.AckKey("lamp", "late-busy")) {
		t.Errorf("woken %v; want the late ok ack's key, not the late busy one's", woken)
	}
}

func TestDuplicateAckIgnored(t *testing.T) {
	b := brokertest.Start(t)
	startDevice(t, b, "lamp", nil, func(wire.Command, int) reply { return reply{Twice: true} })
	stray := make(chan bool, 4)
	c := dial(t, b, func(o *devices.Options) {
		o.OnStrayAck = func(_ string, _ wire.Ack, dup bool) { stray <- dup }
	})
	if _, err := send(t.Context(), c, "lamp", wire.Command{ID: "d1", Action: "turn_on"}); err != nil {
		t.Fatalf("Send: %v", err)
	}
	if dup := <-stray; !dup {
		t.Fatal("second ack not reported as duplicate")
	}
	if s := c.Stats(); s.Duplicates != 1 || s.Acked != 1 || s.LateAcks != 0 {
		t.Errorf("stats = %+v, want 1 duplicate, 1 acked, no late", s)
	}
}

func TestAckFromOtherDeviceIgnored(t *testing.T) {
	b := brokertest.Start(t)
	// "thief" acks every command ID it sees on lamp's topic, as if it were
	// lamp's answer; it must not complete lamp's command.
	hold := make(chan struct{})
	defer close(hold)
	startDevice(t, b, "lamp", nil, func(wire.Command, int) reply { return reply{Hold: hold} })
	thief := startDevice(t, b, "thief", nil, nil)
	c := dial(t, b, func(o *devices.Options) { o.AckTimeout = 100 * time.Millisecond })
	thief.publish(c.Topics().Ack("thief"), false, wire.Ack{ID: "x1", OK: true})
	if _, err := send(t.Context(), c, "lamp", wire.Command{ID: "x1", Action: "turn_on"}); !errors.Is(err, driver.ErrAckTimeout) {
		t.Fatalf("err = %v, want ack timeout", err)
	}
}

func TestConcurrentSends(t *testing.T) {
	b := brokertest.Start(t)
	dev := startDevice(t, b, "lamp", nil, nil)
	c := dial(t, b, func(o *devices.Options) { o.AckTimeout = 5 * time.Second })
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Go(func() {
			_, err := send(t.Context(), c, "lamp", wire.Command{ID: fmt.Sprintf("c%d", i), Action: "set", Params: map[string]any{"brightness": i}})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	for i := range 64 {
		if got := dev.effectCount(fmt.Sprintf("c%d", i)); got != 1 {
			t.Errorf("c%d applied %d times", i, got)
		}
	}
}

func TestSameIDInFlight(t *testing.T) {
	b := brokertest.Start(t)
	hold := make(chan struct{})
	dev := startDevice(t, b, "lamp", nil, func(wire.Command, int) reply { return reply{Hold: hold} })
	c := dial(t, b, func(o *devices.Options) { o.AckTimeout = 5 * time.Second })
	done := make(chan error, 1)
	go func() {
		_, err := send(t.Context(), c, "lamp", wire.Command{ID: "same", Action: "turn_on"})
		done <- err
	}()
	dev.next(t)
	if _, err := send(t.Context(), c, "lamp", wire.Command{ID: "same", Action: "turn_on"}); !errors.Is(err, devices.ErrInFlight) {
		t.Errorf("second Send: err = %v, want ErrInFlight", err)
	}
	close(hold)
	if err := <-done; err != nil {
		t.Errorf("first Send: %v", err)
	}
}

func TestInvalidRejectedBeforePublish(t *testing.T) {
	b := brokertest.Start(t)
	dev := startDevice(t, b, "lamp", nil, nil)
	c := dial(t, b, nil)
	for _, tc := range []struct {
		name, device string
		cmd          wire.Command
		want         error
	}{
		{"wildcard device", "lamp/#", wire.Command{ID: "a", Action: "x"}, wire.ErrInvalidID},
		{"plus device", "+", wire.Command{ID: "a", Action: "x"}, wire.ErrInvalidID},
		{"empty device", "", wire.Command{ID: "a", Action: "x"}, wire.ErrInvalidID},
		{"space device", "la mp", wire.Command{ID: "a", Action: "x"}, wire.ErrInvalidID},
		{"empty id", "lamp", wire.Command{Action: "x"}, devices.ErrInvalidCommand},
		{"control id", "lamp", wire.Command{ID: "a\x00", Action: "x"}, devices.ErrInvalidCommand},
		{"no action", "lamp", wire.Command{ID: "a"}, devices.ErrInvalidCommand},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := send(t.Context(), c, tc.device, tc.cmd); !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
		})
	}
	if s := c.Stats(); s.Sent != 0 {
		t.Errorf("sent %d, want 0", s.Sent)
	}
	// Prove the device would have seen a publish: a valid one arrives first.
	if _, err := send(t.Context(), c, "lamp", wire.Command{ID: "ok", Action: "turn_on"}); err != nil {
		t.Fatal(err)
	}
	if got := dev.next(t).ID; got != "ok" {
		t.Errorf("first command the device saw = %q, want ok", got)
	}
}

func TestAvailabilityAndState(t *testing.T) {
	b := brokertest.Start(t)
	changes := make(chan string, 64)
	c := dial(t, b, func(o *devices.Options) {
		o.OnChange = func(id string) {
			if id == devices.ConnectedKey {
				return // the connection, not a device
			}
			select {
			case changes <- id:
			default:
			}
		}
	})
	if !c.Available("ghost") {
		t.Error("a device that never reported must count as available")
	}
	if _, ok := c.State("ghost"); ok {
		t.Error("State of unknown device reported ok")
	}
	dev := startDevice(t, b, "lamp", map[string]any{"power": "off", "brightness": 10}, nil)
	waitUntil(t, c, "lamp", "state", func() bool { _, ok := c.State("lamp"); return ok })
	st, _ := c.State("lamp")
	if st["power"] != "off" || st["brightness"] != int64(10) {
		t.Errorf("state = %v", st)
	}
	st["power"] = "mutated"
	if st2, _ := c.State("lamp"); st2["power"] != "off" {
		t.Error("State returned an alias of the cache")
	}
	dev.setOnline(false)
	waitUntil(t, c, "lamp", "offline", func() bool { return !c.Available("lamp") })
	if id := <-changes; id != "lamp" {
		t.Errorf("OnChange(%q), want lamp", id)
	}
	// The last will marks a device that vanishes without a word: its
	// network connection breaks without a DISCONNECT. A bare client stands
	// in for the device, since the fake one would reconnect at once.
	conns := make(chan net.Conn, 1)
	o := mqtt.NewClientOptions().AddBroker(b.URL()).SetClientID("bare-door").SetAutoReconnect(false).
		SetWill(c.Topics().Availability("door"), wire.Offline, 1, true).
		SetCustomOpenConnectionFn(func(u *url.URL, _ mqtt.ClientOptions) (net.Conn, error) {
			conn, err := net.Dial("tcp", u.Host)
			if err == nil {
				conns <- conn
			}
			return conn, err
		})
	bare := mqtt.NewClient(o)
	if tok := bare.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	defer bare.Disconnect(0)
	if tok := bare.Publish(c.Topics().Availability("door"), 1, true, wire.Online); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}
	waitUntil(t, c, "door", "online", func() bool { return c.Available("door") })
	_ = (<-conns).Close()
	waitUntil(t, c, "door", "last will", func() bool { return !c.Available("door") })
	waitGone(t, b, "bare-door")
}

func TestBrokerRestart(t *testing.T) {
	b := brokertest.Start(t)
	addr := b.Addr()
	dev := startDevice(t, b, "lamp", map[string]any{"power": "off"}, func(_ wire.Command, n int) reply {
		return reply{Drop: n == 1} // the first answer is lost with the broker
	})
	c := dial(t, b, func(o *devices.Options) {
		// A connection accepted while the old broker shuts down can hang
		// unanswered; the connect timeout is what recovers from it.
		o.AckTimeout = 200 * time.Millisecond
		o.MaxReconnectInterval = 200 * time.Millisecond
		o.ConnectTimeout = time.Second
	})
	cmd := wire.Command{ID: "r1", Action: "turn_on"}
	if _, err := send(t.Context(), c, "lamp", cmd); !errors.Is(err, driver.ErrAckTimeout) {
		t.Fatalf("first Send: %v, want ack timeout", err)
	}
	dev.next(t)
	// Let the device's state report land first: paho v1.5.1 races (under
	// -race) when a reconnect resumes a publish that is still being
	// written.
	waitUntil(t, c, "lamp", "state on", func() bool { st, _ := c.State("lamp"); return st["power"] == "on" })
	_ = b.Close()
	b2, err := broker.Start(broker.Options{Addr: addr})
	if err != nil {
		t.Fatalf("restart broker on %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = b2.Close() })

	// Retry the way the driver does, until the client is back.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var ack wire.Ack
	for attempt := 2; ; attempt++ {
		cmd.Attempt = attempt
		ack, err = send(ctx, c, "lamp", cmd)
		if err == nil {
			break
		}
		if class, _ := driver.Classify(err); class != driver.Retryable || ctx.Err() != nil {
			t.Fatalf("attempt %d: %v (class %v); stats %+v, device connections %d, received %d", attempt, err, class, c.Stats(), dev.conns.Load(), dev.receivedCount("r1"))
		}
	}
	if !ack.OK {
		t.Fatalf("ack %+v", ack)
	}
	if got := dev.effectCount("r1"); got != 1 {
		t.Errorf("effect applied %d times, want once", got)
	}
	if s := c.Stats(); s.Reconnects < 1 {
		t.Errorf("stats = %+v, want a reconnect", s)
	}
	// The new broker has the state the device republished on connecting.
	if st, ok := c.State("lamp"); !ok || st["power"] != "on" {
		t.Errorf("state after restart = %v", st)
	}
}

func TestClose(t *testing.T) {
	b := brokertest.Start(t)
	c := dial(t, b, func(o *devices.Options) { o.ClientID = "closer" })
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	waitGone(t, b, "closer")
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := send(t.Context(), c, "lamp", wire.Command{ID: "a", Action: "x"}); !errors.Is(err, devices.ErrClosed) {
		t.Errorf("Send after Close: %v, want ErrClosed", err)
	}
}

func TestDialFails(t *testing.T) {
	b := brokertest.Start(t)
	url := b.URL()
	_ = b.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if _, err := devices.Dial(ctx, devices.Options{Broker: url, Logger: discard()}); err == nil {
		t.Fatal("Dial to a closed broker succeeded")
	}
	if _, err := devices.Dial(ctx, devices.Options{}); err == nil {
		t.Fatal("Dial without a broker URL succeeded")
	}
}

// TestPostedAckWaitsForCollectWhateverTheCache: the ack of a posted
// command is kept until Collect takes it, however many acks come in
// between. Found by BenchmarkSlowDevices: steps woken by their acks
// waited for a free worker while thousands of other acks went through
// the bounded cache, and found theirs evicted: an ack timeout and a
// retry for a command the device had applied and acked.
func TestPostedAckWaitsForCollectWhateverTheCache(t *testing.T) {
	b := brokertest.Start(t)
	acked := make(chan string, 64)
	c := dial(t, b, func(o *devices.Options) {
		o.AckCache = 2
		o.OnChange = func(key string) {
			if strings.HasPrefix(key, "ack/") {
				acked <- key
			}
		}
	})
	startDevice(t, b, "lamp", map[string]any{"power": "off"}, nil)
	waitUntil(t, c, "lamp", "first state", func() bool { _, ok := c.State("lamp"); return ok })
	const n = 8
	for i := range n {
		cmd := wire.Command{ID: fmt.Sprintf("c%d", i), Action: "turn_on"}
		if _, done, err := c.Post("lamp", cmd, time.Now().Add(time.Minute), nil); done || err != nil {
			t.Fatalf("post %s: done %v, %v", cmd.ID, done, err)
		}
	}
	for range n {
		testkit.Receive(t, acked, 10*time.Second, "not every posted command was acked")
	}
	for i := range n {
		ack, ok, err := c.Collect("lamp", fmt.Sprintf("c%d", i), false)
		if !ok || err != nil || !ack.OK {
			t.Errorf("collect c%d after %d later acks (cache of 2): %+v %v %v", i, n-1-i, ack, ok, err)
		}
	}
}
