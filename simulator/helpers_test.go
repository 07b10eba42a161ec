package simulator

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/sortie-edge/sortie/broker"
	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/devices/wire"
)

// wait bounds every await in the tests; they normally finish in
// milliseconds, the bound only turns a bug into a failure, not a hang.
const wait = 10 * time.Second

// testLogger discards logs unless SIM_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("SIM_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// agent is a real paho client playing the Sortie agent: it publishes
// commands and collects acks, state reports and availability.
type agent struct {
	t      testing.TB
	c      paho.Client
	topics wire.Topics

	mu    sync.Mutex
	inbox map[[2]string]chan []byte // by kind and device
	last  map[string]string         // last payload by retained topic
}

// repeat reports whether payload is the same as the last one on a
// retained topic. A subscriber can get a retained message twice, live and
// from the store, when it subscribes while the message is being
// published; MQTT allows it and mochi does it. A repeat says nothing
// new (state reports carry a timestamp, so real changes always differ).
func (a *agent) repeat(topic string, payload []byte) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.last[topic] == string(payload) {
		return true
	}
	a.last[topic] = string(payload)
	return false
}

// ch is the channel of one kind of message from one device.
func (a *agent) ch(kind, device string) chan []byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	k := [2]string{kind, device}
	if a.inbox[k] == nil {
		a.inbox[k] = make(chan []byte, 1024)
	}
	return a.inbox[k]
}

var clientSeq atomic.Int64

func newAgent(t testing.TB, b *broker.Broker) *agent {
	t.Helper()
	a := &agent{
		t:      t,
		topics: wire.Topics{Prefix: wire.DefaultPrefix},
		inbox:  make(map[[2]string]chan []byte),
		last:   make(map[string]string),
	}
	opts := paho.NewClientOptions().AddBroker(b.URL()).
		SetClientID(fmt.Sprintf("agent-%d", clientSeq.Add(1))).
		SetAutoReconnect(false).SetOrderMatters(true)
	a.c = paho.NewClient(opts)
	if err := waitToken(a.c.Connect(), "agent connect"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.c.Disconnect(100) })
	// One SUBSCRIBE for all filters: mochi refuses a SUBSCRIBE whose
	// packet ID collides with a retained message it is still delivering
	// for an earlier one.
	filters := map[string]byte{}
	for _, kind := range []string{"ack", "state", "availability"} {
		filters[a.topics.Wildcard(kind)] = 1
	}
	tok := a.c.SubscribeMultiple(filters, func(_ paho.Client, m paho.Message) {
		id, kind, _ := a.topics.DeviceOf(m.Topic())
		if kind != "ack" && a.repeat(m.Topic(), m.Payload()) {
			return
		}
		select {
		case a.ch(kind, id) <- m.Payload():
		default:
			t.Errorf("agent: %s channel of %s full", kind, id)
		}
	})
	if err := subscribed(tok, "agent subscribe"); err != nil {
		t.Fatal(err)
	}
	return a
}

// sendRaw publishes a raw payload to a device's command topic.
func (a *agent) sendRaw(device, payload string) {
	a.t.Helper()
	if err := waitToken(a.c.Publish(a.topics.Command(device), 1, false, payload), "agent publish"); err != nil {
		a.t.Fatal(err)
	}
}

// send publishes a command; params is a JSON object literal so tests can
// send exactly the numbers they mean ("" for none).
func (a *agent) send(device, id, action, params string) {
	a.t.Helper()
	a.sendRaw(device, rawCmd(id, action, params))
}

func rawCmd(id, action, params string) string {
	s := fmt.Sprintf(`{"id":%q,"action":%q,"attempt":1`, id, action)
	if params != "" {
		s += `,"params":` + params
	}
	return s + "}"
}

// nextAck returns the next ack from device.
func (a *agent) nextAck(device string) wire.Ack {
	a.t.Helper()
	m := a.next("ack", device)
	ack, err := wire.DecodeAck(m)
	if err != nil {
		a.t.Fatalf("ack from %s: %v: %s", device, err, m)
	}
	return ack
}

// call sends a command and returns its ack, which must be the next one.
func (a *agent) call(device, id, action, params string) wire.Ack {
	a.t.Helper()
	a.send(device, id, action, params)
	ack := a.nextAck(device)
	if ack.ID != id {
		a.t.Fatalf("ack for %q, want %q", ack.ID, id)
	}
	return ack
}

// awaitState returns the first state report of device that satisfies ok.
func (a *agent) awaitState(device string, ok func(map[string]any) bool) map[string]any {
	a.t.Helper()
	for {
		m := a.next("state", device)
		rep, err := wire.DecodeState(m)
		if err != nil {
			a.t.Fatalf("state of %s: %v", device, err)
		}
		if ok(rep.State) {
			return rep.State
		}
	}
}

// awaitAvail waits for device to publish want ("online"/"offline").
func (a *agent) awaitAvail(device, want string) {
	a.t.Helper()
	for {
		if string(a.next("availability", device)) == want {
			return
		}
	}
}

func (a *agent) next(kind, device string) []byte {
	a.t.Helper()
	select {
	case m := <-a.ch(kind, device):
		return m
	case <-time.After(wait):
		a.t.Fatalf("no %s from %s within %v", kind, device, wait)
		return nil
	}
}

// startHome starts a home of the given devices on b, seed 1.
func startHome(t testing.TB, b *broker.Broker, devs ...DeviceConfig) *Home {
	t.Helper()
	h, err := NewHome(HomeConfig{Broker: b.URL(), Seed: 1, Devices: devs, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := h.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return h
}

// rig is a broker, an agent and a started home.
func rig(t testing.TB, devs ...DeviceConfig) (*Home, *agent) {
	t.Helper()
	b := brokertest.Start(t)
	h := startHome(t, b, devs...)
	// The agent subscribes to an idle home and gets one availability and
	// state per device, which it consumes so that the tests see only what
	// their commands cause.
	a := newAgent(t, b)
	for _, d := range devs {
		a.awaitAvail(d.ID, wire.Online)
		a.awaitState(d.ID, func(map[string]any) bool { return true })
	}
	return h, a
}

func num(v any) any {
	if i, ok := v.(int); ok {
		return json.Number(fmt.Sprint(i))
	}
	return v
}

// sameState compares a decoded state with expectations written with Go
// ints; decoded JSON numbers are json.Number.
func sameState(got map[string]any, want map[string]any) bool {
	for k, w := range want {
		if fmt.Sprint(got[k]) != fmt.Sprint(num(w)) {
			return false
		}
	}
	return true
}

func wantState(t testing.TB, got, want map[string]any) {
	t.Helper()
	if !sameState(got, want) {
		t.Fatalf("state %v, want %v", got, want)
	}
}

func wantCode(t testing.TB, ack wire.Ack, code, inMsg string) {
	t.Helper()
	if ack.OK || ack.Error == nil {
		t.Fatalf("ack %+v: want error %s", ack, code)
	}
	if ack.Error.Code != code {
		t.Fatalf("code %q (%s), want %q", ack.Error.Code, ack.Error.Message, code)
	}
	if !strings.Contains(ack.Error.Message, inMsg) {
		t.Fatalf("message %q does not contain %q", ack.Error.Message, inMsg)
	}
}

func wantOK(t testing.TB, ack wire.Ack) {
	t.Helper()
	if !ack.OK {
		t.Fatalf("ack %+v: want ok (error %+v)", ack, ack.Error)
	}
}

// subscribed waits for a test client's subscribe token and checks the
// broker's return codes: paho reports a refused MQTT 3.1.1 subscription
// (return code 0x80) as a success.
func subscribed(t paho.Token, what string) error {
	if err := waitToken(t, what); err != nil {
		return err
	}
	st, ok := t.(*paho.SubscribeToken)
	if !ok {
		return nil
	}
	for filter, code := range st.Result() {
		if code > 2 {
			return fmt.Errorf("%s: broker refused %q (code %#x)", what, filter, code)
		}
	}
	return nil
}
