package mqttc_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/broker"
	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/internal/mqttc"
	"github.com/sortie-edge/sortie/internal/testkit"
)

// wait bounds every wait for something the test caused.
const wait = 10 * time.Second

// logBuf is a log that tests read while the client writes it.
type logBuf struct{ testkit.SyncBuffer }

func (l *logBuf) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// lines returns the log lines with msg.
func (l *logBuf) lines(msg string) []string {
	var out []string
	for line := range strings.Lines(l.String()) {
		if strings.Contains(line, `msg="`+msg+`"`) {
			out = append(out, line)
		}
	}
	return out
}

// newClient makes a client that the test closes, with short timings.
func newClient(t *testing.T, o mqttc.Options) *mqttc.Client {
	t.Helper()
	if o.MaxReconnectInterval == 0 {
		o.MaxReconnectInterval = 100 * time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	c, err := mqttc.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func connect(t *testing.T, c *mqttc.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	if err := c.Connect(ctx); err != nil {
		t.Fatalf("connect: %v", err)
	}
}

// inbox collects what a subscription receives.
type inbox chan string

func (in inbox) handle(topic string, payload []byte) { in <- topic + " " + string(payload) }

// expect waits for want as the next message.
func (in inbox) expect(t *testing.T, want string) {
	t.Helper()
	select {
	case got := <-in:
		if got != want {
			t.Fatalf("received %q, want %q", got, want)
		}
	case <-time.After(wait):
		t.Fatalf("%q never received", want)
	}
}

// TestSubscriptionSurvivesBrokerRestart: a broker that restarts with no
// memory of the client gets its subscription again; the loss and the
// return are logged once each, with the broker's address.
func TestSubscriptionSurvivesBrokerRestart(t *testing.T) {
	b := brokertest.Start(t)
	addr, url := b.Addr(), b.URL()
	ups, losses := make(chan struct{}, 4), make(chan error, 4)
	var logs logBuf
	in := make(inbox, 16)
	c := newClient(t, mqttc.Options{
		Broker: url, ClientID: "restart", Ordered: true, Logger: logs.logger(),
		OnConnect:        func() { ups <- struct{}{} },
		OnConnectionLost: func(err error) { losses <- err },
	})
	if _, err := c.Subscribe("t/#", in.handle); err != nil {
		t.Fatal(err)
	}
	connect(t, c)
	testkit.Receive(t, ups, wait, "first connection")
	if err := b.Publish("t/1", []byte("before"), false, 1); err != nil {
		t.Fatal(err)
	}
	in.expect(t, "t/1 before")

	_ = b.Close() // closed again, harmlessly, by the cleanup
	if err := testkit.Receive(t, losses, wait, "loss"); err == nil {
		t.Error("a loss reported without its reason")
	}
	if c.Connected() {
		t.Error("connected after the loss was reported")
	}
	b2, err := broker.Start(broker.Options{Addr: addr})
	if err != nil {
		t.Fatalf("restart broker on %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = b2.Close() })
	testkit.Receive(t, ups, wait, "reconnection")
	if err := b2.Publish("t/1", []byte("after"), false, 1); err != nil {
		t.Fatal(err)
	}
	in.expect(t, "t/1 after")
	if err := c.Publish("t/2", []byte("own"), false, 1); err != nil {
		t.Fatalf("publish after the restart: %v", err)
	}
	in.expect(t, "t/2 own")

	for _, msg := range []string{"broker connection lost", "broker connection restored"} {
		lines := logs.lines(msg)
		if len(lines) != 1 || !strings.Contains(lines[0], "broker="+url) {
			t.Errorf("%q logged %d times (want once, with broker=%s):\n%s", msg, len(lines), url, logs.String())
		}
	}
}

// TestFailedAttemptsLoggedOnce: while the broker is away every attempt
// fails, but the log says so once per FailureLogInterval; the loss and
// the return still show once each.
func TestFailedAttemptsLoggedOnce(t *testing.T) {
	b := brokertest.Start(t)
	addr := b.Addr()
	ups, losses := make(chan struct{}, 4), make(chan error, 4)
	var logs logBuf
	c := newClient(t, mqttc.Options{
		Broker: b.URL(), ClientID: "flaky", Logger: logs.logger(),
		OnConnect:        func() { ups <- struct{}{} },
		OnConnectionLost: func(err error) { losses <- err },
	})
	connect(t, c)
	testkit.Receive(t, ups, wait, "first connection")
	_ = b.Close()
	if err := testkit.Receive(t, losses, wait, "loss"); err == nil {
		t.Error("a loss reported without its reason")
	}

	// A listener that hangs up on every connection: three attempts fail.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on %s: %v", addr, err)
	}
	const refusals = 3
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		for range refusals {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			_ = nc.Close() // hanging up is the point
		}
	}()
	<-accepted
	_ = ln.Close()
	b2, err := broker.Start(broker.Options{Addr: addr})
	if err != nil {
		t.Fatalf("restart broker on %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = b2.Close() })
	testkit.Receive(t, ups, wait, "reconnection")

	if n := len(logs.lines("cannot connect to the broker; retrying")); n != 1 {
		t.Errorf("failed attempts logged %d times, want once:\n%s", n, logs.String())
	}
	for _, msg := range []string{"broker connection lost", "broker connection restored"} {
		if n := len(logs.lines(msg)); n != 1 {
			t.Errorf("%q logged %d times, want once:\n%s", msg, n, logs.String())
		}
	}
}

// TestPublishTimesOutAgainstDeadBroker: a broker that stops answering
// costs a publish its timeout, not a hang; one that is gone costs at
// most the same.
func TestPublishTimesOutAgainstDeadBroker(t *testing.T) {
	const timeout = 300 * time.Millisecond
	t.Run("silent", func(t *testing.T) {
		b := brokertest.Start(t)
		p := startProxy(t, b.Addr())
		c := newClient(t, mqttc.Options{Broker: "tcp://" + p.addr, ClientID: "silent", Timeout: timeout})
		connect(t, c)
		if err := c.Publish("t", []byte("1"), false, 1); err != nil {
			t.Fatalf("publish while the broker answers: %v", err)
		}
		p.freeze()
		start := time.Now()
		err := c.Publish("t", []byte("2"), false, 1)
		if !errors.Is(err, mqttc.ErrTimeout) {
			t.Fatalf("publish to a silent broker: %v, want ErrTimeout", err)
		}
		if d := time.Since(start); d > timeout+time.Second {
			t.Errorf("publish gave up after %v, want about %v", d, timeout)
		}
		tok := c.PublishAsync("t", []byte("3"), false, 1)
		if err := mqttc.Wait(t.Context(), tok, timeout); !errors.Is(err, mqttc.ErrTimeout) {
			t.Errorf("Wait on a silent broker: %v, want ErrTimeout", err)
		}
	})
	t.Run("gone", func(t *testing.T) {
		b := brokertest.Start(t)
		c := newClient(t, mqttc.Options{Broker: b.URL(), ClientID: "gone", Timeout: timeout})
		connect(t, c)
		_ = b.Close()
		start := time.Now()
		if err := c.Publish("t", []byte("1"), false, 1); err == nil {
			t.Fatal("publish to a closed broker succeeded")
		}
		if d := time.Since(start); d > timeout+time.Second {
			t.Errorf("publish gave up after %v, want at most about %v", d, timeout)
		}
	})
}

// TestCloseLeavesNoGoroutines: after Close nothing the client started is
// left running, on its side or on the broker's.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	b := brokertest.Start(t)
	before := runtime.NumGoroutine()

	in := make(inbox, 4)
	c, err := mqttc.New(mqttc.Options{Broker: b.URL(), ClientID: "closer", Ordered: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Subscribe("t", in.handle); err != nil {
		t.Fatal(err)
	}
	connect(t, c)
	if err := c.Publish("t", []byte("x"), false, 1); err != nil {
		t.Fatal(err)
	}
	in.expect(t, "t x")
	c.Close()
	c.Close() // again: a no-op

	deadline := time.Now().Add(wait)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
			t.Fatalf("%d goroutines after Close, %d before", runtime.NumGoroutine(), before)
		}
		time.Sleep(5 * time.Millisecond) // polling a count: there is no event to wait for
	}
	if err := c.Publish("t", []byte("y"), false, 1); !errors.Is(err, mqttc.ErrClosed) {
		t.Errorf("publish after Close: %v, want ErrClosed", err)
	}
	if _, err := c.Subscribe("u", in.handle); !errors.Is(err, mqttc.ErrClosed) {
		t.Errorf("subscribe after Close: %v, want ErrClosed", err)
	}
}

// TestCloseBoundedWithSilentBroker: Close gives the DISCONNECT a quiesce
// time, not more, when the broker has stopped answering.
func TestCloseBoundedWithSilentBroker(t *testing.T) {
	b := brokertest.Start(t)
	p := startProxy(t, b.Addr())
	c := newClient(t, mqttc.Options{Broker: "tcp://" + p.addr, ClientID: "silent-close"})
	connect(t, c)
	p.freeze()
	start := time.Now()
	c.Close()
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Close took %v with a silent broker", d)
	}
}

// TestConnectBoundedByContext: with no broker, Connect retries until its
// context ends and then says why the last attempt failed.
func TestConnectBoundedByContext(t *testing.T) {
	addr := testkit.FreeAddr(t) // a port with nothing behind it
	var logs logBuf
	c := newClient(t, mqttc.Options{Broker: "tcp://" + addr, Logger: logs.logger()})
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	err := c.Connect(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("Connect = %v, want the deadline and the last attempt's refusal", err)
	}
	if n := len(logs.lines("cannot connect to the broker; retrying")); n != 1 {
		t.Errorf("failed attempts logged %d times, want once:\n%s", n, logs.String())
	}
}

// TestOnceAbortPublishesWill: a one-connection client dropped without a
// DISCONNECT reports the loss at once, and the broker publishes its
// will; a failed attempt is Connect's answer without waiting for ctx.
func TestOnceAbortPublishesWill(t *testing.T) {
	b := brokertest.Start(t)
	wills := make(inbox, 1)
	cancel, err := b.Subscribe("will/dev", wills.handle)
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	losses := make(chan error, 1)
	var logs logBuf
	c := newClient(t, mqttc.Options{
		Broker: b.URL(), ClientID: "dev", Once: true, Abortable: true, Logger: logs.logger(),
		Will:             &mqttc.Will{Topic: "will/dev", Payload: []byte("offline"), QoS: 1, Retained: true},
		OnConnectionLost: func(err error) { losses <- err },
	})
	connect(t, c)
	c.Abort()
	if err := testkit.Receive(t, losses, wait, "loss after Abort"); err == nil {
		t.Error("a loss reported without its reason")
	}
	wills.expect(t, "will/dev offline")
	if got := logs.String(); got != "" {
		t.Errorf("a one-connection client logged its connection's life:\n%s", got)
	}

	_ = b.Close()
	dead := newClient(t, mqttc.Options{Broker: b.URL(), ClientID: "dev-2", Once: true})
	ctx, stop := context.WithTimeout(t.Context(), wait)
	defer stop()
	if err := dead.Connect(ctx); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Connect with Once to a closed broker = %v, want the attempt's error", err)
	}
}

// TestCancelStopsDelivery: a cancelled subscription's messages are not
// handled; the others go on.
func TestCancelStopsDelivery(t *testing.T) {
	b := brokertest.Start(t)
	in := make(inbox, 4)
	c := newClient(t, mqttc.Options{Broker: b.URL(), ClientID: "canceller", Ordered: true})
	connect(t, c)
	cancelA, err := c.Subscribe("a", in.handle)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Subscribe("marker", in.handle); err != nil {
		t.Fatal(err)
	}
	cancelA()
	for _, topic := range []string{"a", "marker"} {
		if err := b.Publish(topic, []byte("x"), false, 1); err != nil {
			t.Fatal(err)
		}
	}
	// In order: had "a" been handled, it would come first.
	in.expect(t, "marker x")
}

// proxy forwards TCP between a client and a broker until frozen, when it
// stops passing anything on but keeps the connections open: a broker
// that no longer answers.
type proxy struct {
	addr   string
	ln     net.Listener
	frozen chan struct{}
	freeze func()
	stop   chan struct{}
	close  func()
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{addr: ln.Addr().String(), ln: ln, frozen: make(chan struct{}), stop: make(chan struct{})}
	p.freeze = sync.OnceFunc(func() { close(p.frozen) })
	p.close = sync.OnceFunc(func() {
		close(p.stop)
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	t.Cleanup(p.close)
	p.wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			p.wg.Go(func() { p.pipe(out, in) })
			p.wg.Go(func() { p.pipe(in, out) })
		}
	})
	return p
}

// pipe copies from src to dst until either fails or the proxy freezes.
func (p *proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 4096)
	for {
		n, err := src.Read(buf)
		select {
		case <-p.frozen:
			<-p.stop // swallow what came, and hold the connection open
			return
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// TestRefusedSubscriptionIsAnError: paho reports a SUBACK refusal as a
// success; Subscribe says it was refused, and the filter is not kept.
func TestRefusedSubscriptionIsAnError(t *testing.T) {
	b := brokertest.StartACL(t, "u", "pw", func(topic string, _ bool) bool { return !strings.HasPrefix(topic, "secret") })
	in := make(inbox, 4)
	c := newClient(t, mqttc.Options{Broker: b.URL(), ClientID: "u", Username: "u", Password: "pw", Ordered: true})
	connect(t, c)
	if _, err := c.Subscribe("secret/#", in.handle); !errors.Is(err, mqttc.ErrRefused) {
		t.Fatalf("refused subscription: %v, want ErrRefused", err)
	}
	if _, err := c.Subscribe("open", in.handle); err != nil {
		t.Fatalf("allowed subscription: %v", err)
	}
}

// TestOptionalSubscriptionRefusedDoesNotHoldTheConnection: a broker's
// ACL refuses an optional subscription, at connection and when it is
// made later; the Client is up all the same, and its required
// subscriptions get their messages.
func TestOptionalSubscriptionRefusedDoesNotHoldTheConnection(t *testing.T) {
	b := brokertest.StartACL(t, "u", "pw", func(topic string, _ bool) bool { return !strings.HasPrefix(topic, "homeassistant") })
	in := make(inbox, 4)
	var logs logBuf
	c := newClient(t, mqttc.Options{Broker: b.URL(), ClientID: "u", Username: "u", Password: "pw", Logger: logs.logger()})
	if _, err := c.SubscribeOptional("homeassistant/+/+/config", 0, in.handle); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Subscribe("triggers", in.handle); err != nil {
		t.Fatal(err)
	}
	connect(t, c)
	if _, err := c.SubscribeOptional("homeassistant/+/+/+/config", 0, in.handle); err != nil {
		t.Fatalf("optional subscription refused once up: %v, want it logged only", err)
	}
	if err := b.Publish("triggers", []byte("go"), false, 1); err != nil {
		t.Fatal(err)
	}
	in.expect(t, "triggers go")
	if !strings.Contains(logs.String(), "optional subscription refused") {
		t.Errorf("the refusal was not logged:\n%s", logs.String())
	}
}

// TestRefusalAtConnectionIsRetriedUntilItPasses: a subscription the
// broker refuses when the Client connects holds Connect, is retried,
// shows in Problem and is logged once; once the broker grants it the
// Client is up and gets its messages.
func TestRefusalAtConnectionIsRetriedUntilItPasses(t *testing.T) {
	var allowed atomic.Bool
	b := brokertest.StartACL(t, "u", "pw", func(string, bool) bool { return allowed.Load() })
	var logs logBuf
	in := make(inbox, 4)
	c := newClient(t, mqttc.Options{Broker: b.URL(), ClientID: "u", Username: "u", Password: "pw", Logger: logs.logger()})
	if _, err := c.Subscribe("triggers", in.handle); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	if err := c.Connect(ctx); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, mqttc.ErrRefused) {
		t.Fatalf("Connect with the subscription refused: %v; want it to wait, naming the refusal", err)
	}
	if err := c.Problem(); !errors.Is(err, mqttc.ErrRefused) || !strings.Contains(err.Error(), "triggers") {
		t.Errorf("Problem() = %v, want the refusal of triggers", err)
	}
	allowed.Store(true)
	connect(t, c)
	if err := c.Problem(); err != nil {
		t.Errorf("Problem() = %v once up", err)
	}
	if err := b.Publish("triggers", []byte("go"), false, 1); err != nil {
		t.Fatal(err)
	}
	in.expect(t, "triggers go")
	if n := len(logs.lines("subscribe failed; retrying until it succeeds")); n != 1 {
		t.Errorf("the refusal logged %d times, want once:\n%s", n, logs.String())
	}
}

// TestSecondHandlerOfAFilterAddsNotReplaces: two parts of one program
// subscribing the same filter both get its messages, the second its
// retained ones too, and cancelling one leaves the other reading it
// (before, the second silently replaced the first).
func TestSecondHandlerOfAFilterAddsNotReplaces(t *testing.T) {
	b := brokertest.Start(t)
	if err := b.Publish("r/1", []byte("kept"), true, 1); err != nil {
		t.Fatal(err)
	}
	first, second := make(inbox, 8), make(inbox, 8)
	c := newClient(t, mqttc.Options{Broker: b.URL(), ClientID: "two-readers", Ordered: true})
	connect(t, c)
	cancelFirst, err := c.Subscribe("r/#", first.handle)
	if err != nil {
		t.Fatal(err)
	}
	first.expect(t, "r/1 kept")
	if _, err := c.SubscribeQoS("r/#", 0, second.handle); err != nil {
		t.Fatal(err)
	}
	second.expect(t, "r/1 kept")
	first.expect(t, "r/1 kept") // the filter asked again: a replay, as after a reconnection

	if err := b.Publish("r/2", []byte("both"), false, 1); err != nil {
		t.Fatal(err)
	}
	first.expect(t, "r/2 both")
	second.expect(t, "r/2 both")

	cancelFirst()
	cancelFirst() // twice is harmless
	for _, p := range []string{"after", "marker"} {
		if err := b.Publish("r/2", []byte(p), false, 1); err != nil {
			t.Fatal(err)
		}
	}
	second.expect(t, "r/2 after")
	second.expect(t, "r/2 marker")
	select {
	case got := <-first:
		t.Errorf("a cancelled handler still received %q", got)
	default:
	}
}
