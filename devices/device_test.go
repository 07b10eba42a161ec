package devices_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/sortie-edge/sortie/broker"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/devices/wire"
	"github.com/sortie-edge/sortie/internal/testkit"
)

// reply is what a fake device does with one received command. n counts
// how often the command's ID has been received (from 1).
type reply struct {
	Drop  bool          // apply (if ok) but send no ack: a lost ack
	Code  string        // answer with this error code instead of applying
	Hold  chan struct{} // wait for it to close before answering
	Twice bool          // send the ack twice
	Stuck bool          // ack ok but leave the state unchanged
	// NoPrior leaves out the ack's optional prior state, as simple
	// firmware does.
	NoPrior bool
}

// fakeDevice is a real paho client that behaves like a device: it applies
// each command ID once, re-acks repeats with the first result, publishes
// retained state and availability, and sets an "offline" last will. Its
// handler only hands messages to a loop, which does the publishing.
type fakeDevice struct {
	t      testing.TB
	id     string
	topics wire.Topics
	paho   mqtt.Client
	script func(cmd wire.Command, n int) reply

	in       chan wire.Command
	received chan wire.Command // every command, for the test to await
	done     chan struct{}
	wg       sync.WaitGroup

	mu      sync.Mutex
	seen    map[string]int
	results map[string]wire.Ack // first final result per ID
	effects map[string]int      // applications per ID
	state   map[string]any
	online  bool
	closing bool
	conns   atomic.Int32
	ready   chan struct{} // closed once subscribed the first time
}

// effectsOf maps actions without params to the state they set.
var effectsOf = map[string]map[string]any{
	"turn_on":  {"power": "on"},
	"turn_off": {"power": "off"},
	"lock":     {"locked": true},
	"unlock":   {"locked": false},
	"open":     {"position": 100},
	"close":    {"position": 0},
}

func startDevice(t testing.TB, b *broker.Broker, id string, state map[string]any, script func(wire.Command, int) reply) *fakeDevice {
	t.Helper()
	d := &fakeDevice{
		t: t, id: id, script: script,
		in:       make(chan wire.Command, 256),
		received: make(chan wire.Command, 256),
		done:     make(chan struct{}),
		seen:     map[string]int{},
		results:  map[string]wire.Ack{},
		effects:  map[string]int{},
		state:    maps.Clone(state),
		online:   true,
		ready:    make(chan struct{}),
	}
	if d.script == nil {
		d.script = func(wire.Command, int) reply { return reply{} }
	}
	o := mqtt.NewClientOptions().AddBroker(b.URL()).SetClientID("dev-"+id).
		SetOrderMatters(false).SetAutoReconnect(true).SetCleanSession(true).
		SetMaxReconnectInterval(200*time.Millisecond).SetConnectTimeout(time.Second).
		SetWill(d.topics.Availability(id), wire.Offline, 1, true).
		SetOnConnectHandler(func(c mqtt.Client) {
			// Runs in its own goroutine, so waiting is allowed here; it is
			// tracked so that close waits for it.
			if !d.track() {
				return
			}
			defer d.wg.Done()
			tok := c.Subscribe(d.topics.Command(id), 1, func(_ mqtt.Client, m mqtt.Message) {
				cmd, err := wire.DecodeCommand(m.Payload())
				if err != nil {
					t.Errorf("device %s: bad command: %v", id, err)
					return
				}
				select {
				case d.in <- cmd:
				case <-d.done:
				}
			})
			if !d.wait(tok) {
				return // the broker went away again; the next connect retries
			}
			d.mu.Lock()
			st, online := maps.Clone(d.state), d.online
			d.mu.Unlock()
			if online {
				d.publish(d.topics.Availability(id), true, wire.Online)
			}
			if st != nil {
				d.publishState(st)
			}
			if d.conns.Add(1) == 1 {
				close(d.ready)
			}
		})
	d.paho = mqtt.NewClient(o)
	if tok := d.paho.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("device %s: connect: %v", id, tok.Error())
	}
	d.wg.Add(1)
	go d.loop()
	t.Cleanup(d.close)
	closeBrokerFirst(t, b)
	select {
	case <-d.ready:
	case <-time.After(5 * time.Second):
		t.Fatalf("device %s: not subscribed", id)
	}
	return d
}

func (d *fakeDevice) close() {
	d.mu.Lock()
	if d.closing {
		d.mu.Unlock()
		return
	}
	d.closing = true
	d.mu.Unlock()
	close(d.done)
	d.paho.Disconnect(0)
	d.wg.Wait()
}

func (d *fakeDevice) publish(topic string, retained bool, payload any) {
	var b []byte
	switch p := payload.(type) {
	case string:
		b = []byte(p)
	default:
		var err error
		if b, err = json.Marshal(p); err != nil {
			d.t.Errorf("device %s: marshal: %v", d.id, err)
			return
		}
	}
	// A failure means the broker went away; tests that restart it expect
	// that and rely on retries.
	d.wait(d.paho.Publish(topic, 1, retained, b))
}

// wait waits for a token until the device closes; it reports success.
func (d *fakeDevice) wait(tok mqtt.Token) bool {
	select {
	case <-tok.Done():
		return tok.Error() == nil
	case <-d.done:
		return false
	}
}

// track registers a paho-started goroutine with wg unless the device is
// closing.
func (d *fakeDevice) track() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closing {
		return false
	}
	d.wg.Add(1)
	return true
}

func (d *fakeDevice) publishState(st map[string]any) {
	d.publish(d.topics.State(d.id), true, wire.StateReport{State: st, Time: time.Now()})
}

// setOnline publishes the retained availability as the device would.
func (d *fakeDevice) setOnline(online bool) {
	d.mu.Lock()
	d.online = online
	d.mu.Unlock()
	p := wire.Offline
	if online {
		p = wire.Online
	}
	d.publish(d.topics.Availability(d.id), true, p)
}

func (d *fakeDevice) loop() {
	defer d.wg.Done()
	for {
		select {
		case <-d.done:
			return
		case cmd := <-d.in:
			d.handle(cmd)
		}
	}
}

func (d *fakeDevice) handle(cmd wire.Command) {
	d.mu.Lock()
	d.seen[cmd.ID]++
	n := d.seen[cmd.ID]
	d.mu.Unlock()
	select {
	case d.received <- cmd:
	default: // nobody is watching; counts are in seen
	}
	r := d.script(cmd, n)
	if r.Hold != nil {
		select {
		case <-r.Hold:
		case <-d.done:
			return
		}
	}
	d.mu.Lock()
	ack, repeat := d.results[cmd.ID]
	var newState map[string]any
	if !repeat {
		switch {
		case r.Code != "":
			ack = wire.Ack{ID: cmd.ID, Error: &wire.AckError{Code: r.Code, Message: "scripted"}}
			if !wire.RetryableCode(r.Code) {
				d.results[cmd.ID] = ack
			}
		default:
			prior := maps.Clone(d.state)
			if !r.Stuck {
				if d.state == nil {
					d.state = map[string]any{}
				}
				maps.Copy(d.state, effectsOf[cmd.Action])
				for k, v := range cmd.Params {
					d.state[k] = v
				}
				newState = maps.Clone(d.state)
			}
			d.effects[cmd.ID]++
			ack = wire.Ack{ID: cmd.ID, OK: true, State: maps.Clone(d.state)}
			if !r.NoPrior {
				ack.Prior = prior
			}
			d.results[cmd.ID] = ack
		}
	}
	d.mu.Unlock()
	if newState != nil {
		d.publishState(newState)
	}
	if r.Drop {
		return
	}
	d.publish(d.topics.Ack(d.id), false, ack)
	if r.Twice {
		d.publish(d.topics.Ack(d.id), false, ack)
	}
}

// effectCount is how often the device applied the command ID.
func (d *fakeDevice) effectCount(id string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.effects[id]
}

// receivedCount is how often the device received the command ID.
func (d *fakeDevice) receivedCount(id string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.seen[id]
}

// next waits for the device to receive a command.
func (d *fakeDevice) next(t testing.TB) wire.Command {
	t.Helper()
	select {
	case c := <-d.received:
		return c
	case <-time.After(5 * time.Second):
		t.Fatalf("device %s received no command", d.id)
		return wire.Command{}
	}
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

var clientSeq atomic.Int64

// dial connects a Client for a test with short timeouts.
// inProcess makes dial use the broker in process (Options.Local) instead
// of a connection; TestInProcess sets it. No test here runs in parallel.
var inProcess bool

func dial(t testing.TB, b *broker.Broker, mod func(*devices.Options)) *devices.Client {
	t.Helper()
	o := devices.Options{
		Broker:     b.URL(),
		ClientID:   fmt.Sprintf("agent-%d", clientSeq.Add(1)),
		AckTimeout: 300 * time.Millisecond,
		Logger:     discard(),
	}
	if inProcess {
		o.Local = b
	}
	if mod != nil {
		mod(&o)
	}
	w := newWaker(o.AckTimeout)
	own := o.OnChange
	o.OnChange = func(key string) {
		if own != nil {
			own(key)
		}
		w.wake(key)
	}
	c, err := devices.Dial(t.Context(), o)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	wakersMu.Lock()
	wakers[c] = w
	wakersMu.Unlock()
	t.Cleanup(func() {
		_ = c.Close()
		wakersMu.Lock()
		delete(wakers, c)
		wakersMu.Unlock()
	})
	closeBrokerFirst(t, b)
	return c
}

// waitGone waits until the broker has forgotten a client that
// disconnected during the test, so that the broker's own Close cannot
// race with that departure (see closeBrokerFirst). mochi offers no event
// for it (OnDisconnect runs before the client is deleted), so this polls.
func waitGone(t testing.TB, b *broker.Broker, clientID string) {
	t.Helper()
	testkit.Eventually(t, 5*time.Second, "the broker forgetting client "+clientID, func() bool {
		_, ok := b.Server().Clients.Get(clientID)
		return !ok
	})
}

// closeBrokerFirst makes the test's cleanup close the broker before the
// clients registered so far. mochi v2.7.9 can deadlock in Server.Close
// when a client disconnects at the same moment (Clients.GetByListener
// takes its read lock twice, and a Delete from the departing client queues
// for the write lock in between); idle clients of a closing broker never
// trigger that.
func closeBrokerFirst(t testing.TB, b *broker.Broker) {
	t.Cleanup(func() { _ = b.Close() })
}

// waitUntil waits for cond to hold, re-checking at each change of the
// device as reported by the client; never by sleeping.
func waitUntil(t testing.TB, c *devices.Client, id string, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		ch := c.Changed(id)
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("timed out waiting for %s of %s", what, id)
		}
	}
}
