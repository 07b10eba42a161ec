package devices

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sortie-edge/sortie/devices/wire"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/fifo"
	"github.com/sortie-edge/sortie/internal/mqttc"
)

// Defaults for Options fields left zero.
const (
	DefaultAckTimeout     = 2 * time.Second
	DefaultConnectTimeout = 5 * time.Second
	DefaultAckCache       = 256
	DefaultMaxDevices     = 4096
)

// Sentinel errors of the client.
var (
	// ErrClosed means the client has been closed.
	ErrClosed = errors.New("devices client closed")
	// ErrNotConnected means the broker connection is down (or its
	// subscriptions are not yet in place) and did not come back before the
	// command's deadline. It is retryable.
	ErrNotConnected = errors.New("not connected to broker")
	// ErrInFlight means a command with the same ID is already waiting for
	// its ack on this client. It is retryable: the first send decides.
	ErrInFlight = errors.New("command already in flight")
	// ErrInvalidCommand means a command is malformed and was not sent.
	ErrInvalidCommand = errors.New("invalid command")
)

// RejectedError is returned by Collect when the device answered with a
// negative ack. Retryable reports whether the code may succeed later.
type RejectedError struct {
	Device  string
	ID      string
	Code    string
	Message string
	// Label names the device for people ("Front door lock (hall)"); the
	// step handlers set it from the registry, and without it the error
	// names the device by its ID.
	Label string
}

// Error names the device, then gives its message (or its code when it
// sent none), then the command ID, last because an operator reads the
// first two and a developer greps for the third:
// "Front door lock (hall): lock mechanism jammed (command 01a2…-0-5)".
func (e *RejectedError) Error() string {
	who := e.Label
	if who == "" {
		who = "device " + e.Device
	}
	msg := e.Message
	if msg == "" {
		msg = e.Code
	}
	return fmt.Sprintf("%s: %s (command %s)", who, msg, e.ID)
}

// Retryable reports whether the device's error code may succeed on a
// later attempt (see RetryableCode).
func (e *RejectedError) Retryable() bool { return wire.RetryableCode(e.Code) }

// Local is an MQTT broker in this process, reached by function calls
// (see Options.Local).
type Local interface {
	// Publish hands a message to the broker, which sends it on to the
	// topic's subscribers at the QoS they subscribed with.
	Publish(topic string, payload []byte, retained bool, qos byte) error
	// Subscribe calls handle with each message published on a topic
	// matching filter from now on, and with the retained ones before it
	// returns. handle runs on the broker's receive path for the
	// publishing client, so it must not block, and it may run for several
	// publishers at once (each one's messages in order). As with a
	// subscription over a connection, a message published while the
	// retained ones are replayed may reach handle before an older
	// retained copy. cancel ends the subscription; a call already running
	// may still finish after it.
	Subscribe(filter string, handle func(topic string, payload []byte)) (cancel func(), err error)
}

// LocalTap is a Local broker that can also hand over messages as it takes
// them in: before it acknowledges them to their publisher and before any
// subscriber gets them, and without replaying retained ones. A Client
// takes acks that way when it can: an ack is what a step waits for, and
// the broker's PUBACK write to the device and its subscriber lookup would
// otherwise come first. Acks are not retained, so a tap misses none.
type LocalTap interface {
	Local
	// Tap calls handle, under the same rules as Subscribe's, with each
	// message published on a topic matching filter from now on.
	Tap(filter string, handle func(topic string, payload []byte)) (cancel func(), err error)
}

// Options configures a Client. Broker or Local is required.
type Options struct {
	// Broker is the broker's URL, e.g. "tcp://127.0.0.1:1883" or
	// "ssl://hub.local:8883".
	Broker string
	// Local, when set, is a broker in this process that the client uses
	// instead of a connection to Broker: a command then costs no socket,
	// no client library and no PUBACK on the agent's side, and the client
	// is connected for as long as it is open. The connection options
	// below do not apply.
	Local Local
	// ClientID identifies the connection; empty picks "sortie-agent".
	// Two clients with the same ID kick each other off the broker.
	ClientID string
	// Username and Password authenticate to the broker when set.
	Username string
	Password string
	// TLS configures TLS for ssl:// and tls:// brokers.
	TLS *tls.Config
	// Prefix is the topic prefix; empty means DefaultPrefix.
	Prefix string
	// AckTimeout is how long a command step waits for its ack when the
	// step names no ack_timeout. Zero means DefaultAckTimeout.
	AckTimeout time.Duration
	// ConnectTimeout bounds Dial (the first connection, retried within
	// it, and its subscriptions) and each reconnection attempt. Zero
	// means DefaultConnectTimeout.
	ConnectTimeout time.Duration
	// MaxReconnectInterval caps the reconnect backoff; zero means 10s.
	MaxReconnectInterval time.Duration
	// AckCache is how many final acks are remembered by command ID, so
	// that a late ack completes the retry of its command at once and a
	// duplicate is recognised. Zero means DefaultAckCache.
	AckCache int
	// MaxDevices bounds how many devices' availability and state are
	// tracked; reports from further device IDs are dropped (and logged),
	// so a misbehaving publisher cannot grow memory without bound.
	MaxDevices int
	// Logger receives connection and protocol logs; nil discards them.
	Logger *slog.Logger
	// OnChange, if set, is called with a device's ID after its
	// availability or reported state changes, with AckKey(device, id)
	// when the ack of a command sent by Post arrives, and with
	// ConnectedKey when the connection is up again. It runs on the MQTT
	// receive path, so it must not block (nor call Close, which waits for
	// it); the agent points it at the driver's Wake.
	OnChange func(key string)
	// OnStrayAck, if set, is called for every well-formed ack that
	// completes no waiting command: a late ack (its command was given up
	// on), one for a command ID this client does not know (see
	// Stats.UnknownAcks), or a duplicate. It must not block.
	OnStrayAck func(deviceID string, ack wire.Ack, duplicate bool)
	// Registry, when set, names the devices that speak another
	// ecosystem's dialect (Device.Protocol): the client subscribes to
	// what their adapters read and sends their commands with PostState.
	Registry *Registry
	// OnAckTimeout, if set, is called with the device's ID each time a
	// command to it gives up waiting for its ack (counted in
	// Stats.Timeouts). It runs on the goroutine that gave up, and must
	// not block.
	OnAckTimeout func(deviceID string)
	// PriorLog, when set, keeps the state a device of another ecosystem
	// was in before a step's first command, for the step's undo after
	// the agent was killed while the step was in flight (see PriorLog).
	PriorLog *PriorLog
	// OnAnnouncement, if set, is called for each difference between what
	// the ecosystems announce and the registry, as it appears (see
	// Announced). It runs on the receive path and must not block.
	OnAnnouncement func(Announcement)
}

func (o *Options) withDefaults() {
	if o.ClientID == "" {
		o.ClientID = "sortie-agent"
	}
	if o.AckTimeout <= 0 {
		o.AckTimeout = DefaultAckTimeout
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = DefaultConnectTimeout
	}
	if o.MaxReconnectInterval <= 0 {
		o.MaxReconnectInterval = 10 * time.Second
	}
	if o.AckCache <= 0 {
		o.AckCache = DefaultAckCache
	}
	if o.MaxDevices <= 0 {
		o.MaxDevices = DefaultMaxDevices
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// Stats is a snapshot of a Client's counters since Dial.
type Stats struct {
	Sent       uint64 // commands published
	Acked      uint64 // Sends completed by an ack (positive or negative)
	Rejected   uint64 // of those, negative acks
	Cached     uint64 // Sends completed from a remembered ack without publishing
	Timeouts   uint64 // Sends that gave up waiting for an ack
	Duplicates uint64 // acks for a command already completed
	LateAcks   uint64 // acks that arrived after their command was given up on
	// UnknownAcks are well-formed acks for a command ID this client is
	// not waiting for, did not give up on and does not remember
	// (AckCache): never sent by this process (one sent before an agent
	// restart, an ID the device got wrong), or settled so long ago that
	// it was forgotten. They are kept like late acks: the retry of a
	// command sent before a restart completes from one.
	UnknownAcks uint64
	Malformed   uint64 // device messages that failed to decode, acks included
	// MalformedAcks are the acks among Malformed: not JSON, over
	// wire.MaxPayload, without an id, or negative without an error code.
	MalformedAcks uint64
	Reconnects    uint64 // connections after the first
}

type stats struct {
	sent, acked, rejected, cached, timeouts, duplicates, late, unknown, malformed, malformedAcks, reconnects atomic.Uint64
}

// deviceEntry is what the client knows of one device.
type deviceEntry struct {
	availKnown bool
	online     bool
	state      map[string]any // normalized; nil until reported
	// changed is closed (and replaced) on every change, so any number of
	// waiters can watch a device without a registration protocol.
	changed chan struct{}
}

// ackKey correlates acks per device, so one device cannot complete
// another's command by reusing its ID.
type ackKey struct{ device, id string }

// recentAck is a final ack remembered after its command was collected or
// given up on.
type recentAck struct {
	ack wire.Ack
	// reusable acks (ok, or a permanent failure) are what the device
	// recorded for the ID and would re-send; retryable failures were not
	// applied, so a retry must publish again.
	reusable bool
}

// Client sends commands to devices over one MQTT connection and tracks
// their availability and state. It is safe for concurrent use. Close it
// to disconnect; a closed Client cannot be reopened.
type Client struct {
	opts   Options
	topics wire.Topics
	log    *slog.Logger
	mc     *mqttc.Client // nil with a Local broker
	local  Local
	unsub  []func()
	// gate lets Close wait for in-process handlers already running;
	// stopped, set under it, turns away the ones that start after.
	// (mqttc keeps the same promise for its own handlers.)
	gate    sync.RWMutex
	stopped bool

	done chan struct{} // closed by Close

	mu        sync.Mutex
	closed    bool
	connected bool // connected and subscribed
	conns     int
	// posted are commands published by Post whose ack has not come,
	// with what to call once they are not in flight any more. An ack for
	// one is remembered in recent and announced through OnChange, for
	// Collect.
	posted map[ackKey]func()
	// collect holds the acks of posted commands until Collect takes
	// them: unlike recent, it is not bounded by eviction, so an ack is
	// never lost because the step it wakes had to wait for a worker. It
	// holds at most one ack per posted command.
	collect map[ackKey]wire.Ack
	recent  *fifo.Map[ackKey, recentAck] // the last AckCache final acks
	// gaveUp holds the commands published and then given up on, as many
	// as recent: an ack for one of them is late, one for an ID in
	// neither is unknown.
	gaveUp  *fifo.Map[ackKey, struct{}]
	devices map[string]*deviceEntry

	// eco is the registry that runs and the adapters of the ecosystems
	// its devices speak, swapped whole by SetRegistry (swap.go); retired
	// are the sets swapped out whose commands are still in flight. expect
	// holds the command in flight to each ecosystem device (ecoclient.go).
	eco     atomic.Pointer[ecoSet]
	retired []*ecoSet
	swapMu  sync.Mutex // one SetRegistry at a time
	bg      sync.WaitGroup
	// ann follows the ecosystems' announcements once started (annMu);
	// annSubs are its subscriptions.
	annMu         sync.Mutex
	ann           *announced
	annSubs       []func()
	expect        map[string]*expectation
	localRetained LocalRetained
	// heard is when each ecosystem device last said anything (not a
	// retained replay); probes counts the probes at connect, whose
	// timers Close stops.
	heard       map[string]time.Time
	probes      int
	probeTimers map[string]*time.Timer

	stats stats
}

// Dial connects to the broker, subscribes to the device ack, state and
// availability topics, and returns once both are done or ctx ends. The
// connection then reconnects on its own and resubscribes every time.
func Dial(ctx context.Context, opts Options) (*Client, error) {
	if opts.Broker == "" && opts.Local == nil {
		return nil, errors.New("dial: no broker URL")
	}
	opts.withDefaults()
	c := &Client{
		opts:    opts,
		topics:  wire.Topics{Prefix: opts.Prefix},
		log:     opts.Logger.With("component", "devices", "client_id", opts.ClientID),
		done:    make(chan struct{}),
		posted:  make(map[ackKey]func()),
		collect: make(map[ackKey]wire.Ack),
		recent:  fifo.New[ackKey, recentAck](opts.AckCache),
		gaveUp:  fifo.New[ackKey, struct{}](opts.AckCache),
		devices: make(map[string]*deviceEntry),
		expect:  make(map[string]*expectation),
		heard:   make(map[string]time.Time),

		probeTimers: make(map[string]*time.Timer),
	}
	set, err := newEcoSet(opts.Registry)
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	set.state.Store(setLive)
	c.eco.Store(set)
	if opts.Local != nil {
		c.localRetained, _ = opts.Local.(LocalRetained)
		return c, c.dialLocal()
	}
	mc, err := mqttc.New(mqttc.Options{
		Broker: opts.Broker, ClientID: opts.ClientID, Username: opts.Username, Password: opts.Password,
		TLS: opts.TLS, ConnectTimeout: opts.ConnectTimeout, Timeout: opts.ConnectTimeout,
		MaxReconnectInterval: opts.MaxReconnectInterval,
		// In order: availability and state must be applied in the order
		// the broker sent them, or a quick offline→online could end as
		// offline. The handler never blocks (see onMessage).
		Ordered:          true,
		OnConnect:        c.onConnect,
		OnConnectionLost: c.onConnectionLost,
		Logger:           c.log,
	})
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	c.mc = mc
	// Made by the first connection and again by every later one; the
	// broker then replays retained state and availability.
	for _, kind := range []string{"ack", "state", "availability"} {
		if _, err := mc.Subscribe(c.topics.Wildcard(kind), c.onMessage); err != nil {
			c.shutdown()
			return nil, fmt.Errorf("subscribe: %w", err)
		}
	}
	if err := c.subscribeEcosystems(set); err != nil {
		c.shutdown()
		return nil, err
	}
	if err := c.followAnnouncements(); err != nil {
		c.shutdown()
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, opts.ConnectTimeout)
	defer cancel()
	if err := mc.Connect(cctx); err != nil {
		c.shutdown()
		return nil, err
	}
	return c, nil
}

// dialLocal subscribes through the in-process broker. Its retained state
// and availability arrive before the subscription returns, as they do
// after a SUBACK.
func (c *Client) dialLocal() error {
	c.local = c.opts.Local
	handle := func(topic string, payload []byte) {
		c.gate.RLock()
		defer c.gate.RUnlock()
		if !c.stopped {
			c.onMessage(topic, payload)
		}
	}
	for _, kind := range []string{"ack", "state", "availability"} {
		listen := c.local.Subscribe
		if t, ok := c.local.(LocalTap); ok && kind == "ack" {
			listen = t.Tap
		}
		cancel, err := listen(c.topics.Wildcard(kind), handle)
		if err != nil {
			c.shutdown()
			return fmt.Errorf("subscribe in process: %w", err)
		}
		c.mu.Lock()
		c.unsub = append(c.unsub, cancel)
		c.mu.Unlock()
	}
	if err := c.subscribeEcosystems(c.eco.Load()); err != nil {
		c.shutdown()
		return err
	}
	if err := c.followAnnouncements(); err != nil {
		c.shutdown()
		return err
	}
	c.mu.Lock()
	c.conns, c.connected = 1, true
	c.mu.Unlock()
	c.log.Info("connected to the broker in process")
	c.probeOnConnect()
	return nil
}

// onConnect runs on mqttc's goroutine after every connection, first or
// re-, once the subscriptions are in place.
func (c *Client) onConnect() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.conns++
	if c.conns > 1 {
		c.stats.reconnects.Add(1)
	}
	c.connected = true
	c.mu.Unlock()
	c.probeOnConnect()
	if c.opts.OnChange != nil {
		c.opts.OnChange(ConnectedKey)
	}
}

// onConnectionLost holds Posts back until the next connection is
// subscribed: a command published now could not be acked to us.
func (c *Client) onConnectionLost(error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.connected = false
}

// Close disconnects and waits for the client's goroutines. Sends still
// waiting return ErrClosed. It is safe to call more than once.
func (c *Client) Close() error {
	c.shutdown()
	return nil
}

func (c *Client) shutdown() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	close(c.done)
	unsub := c.unsub
	c.unsub = nil
	for _, set := range append(c.retired, c.eco.Load()) {
		unsub = append(unsub, set.subs...)
		set.subs = nil
	}
	c.retired = nil
	for _, x := range c.expect {
		stopTimer(x)
	}
	for _, t := range c.probeTimers {
		t.Stop()
	}
	c.mu.Unlock()
	c.annMu.Lock()
	unsub = append(unsub, c.annSubs...)
	c.annSubs = nil
	c.annMu.Unlock()
	for _, cancel := range unsub {
		cancel()
	}
	// No hook runs after Close returns.
	c.gate.Lock()
	c.stopped = true
	c.gate.Unlock()
	if c.mc != nil {
		c.mc.Close()
	}
	c.bg.Wait()
}

// Stats returns a snapshot of the counters.
func (c *Client) Stats() Stats {
	s := &c.stats
	return Stats{
		Sent: s.sent.Load(), Acked: s.acked.Load(), Rejected: s.rejected.Load(),
		Cached: s.cached.Load(), Timeouts: s.timeouts.Load(), Duplicates: s.duplicates.Load(),
		LateAcks: s.late.Load(), UnknownAcks: s.unknown.Load(), Malformed: s.malformed.Load(),
		MalformedAcks: s.malformedAcks.Load(), Reconnects: s.reconnects.Load(),
	}
}

// Topics returns the topic layout the client uses.
func (c *Client) Topics() wire.Topics { return c.topics }

// validateCommandID applies the driver's ID rules: command IDs are
// idempotency keys built from mission and step IDs.
func validateCommandID(id string) error {
	if err := driver.ValidateID("command id", id); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidCommand, err)
	}
	return nil
}

func (c *Client) finish(device string, ack wire.Ack) (wire.Ack, error) {
	if ack.OK {
		return ack, nil
	}
	c.stats.rejected.Add(1)
	e := &RejectedError{Device: device, ID: ack.ID}
	if ack.Error != nil {
		e.Code, e.Message = ack.Error.Code, ack.Error.Message
	}
	return ack, e
}

// ConnectedKey is what OnChange is called with when the client's
// connection is up again: commands Post refused as not connected can go.
const ConnectedKey = "devices/connected"

// AckKey is what OnChange is called with when the ack of command id,
// sent to device by Post, arrives. Device IDs hold no "/", so it never
// equals a device ID.
func AckKey(device, id string) string { return "ack/" + device + "/" + id }

// Post publishes cmd to the device without waiting for its ack, for a
// caller that parks instead of blocking (see driver.Pending): when the
// ack comes it is kept by command ID, and OnChange is called with
// AckKey(deviceID, cmd.ID); Collect then returns it. If an ack for the ID
// is already known (the device applied it before; a late ack of an
// earlier attempt), Post returns it with done set and publishes nothing.
//
// giveUp is when the caller stops waiting; it becomes cmd.Expires unless
// the caller set an earlier one. While the connection is down Post
// returns ErrNotConnected (wait for ConnectedKey). A second Post of an ID
// still waiting for its ack returns ErrInFlight.
//
// onDone, when not nil, is called once when a published command is no
// longer in flight: its ack came, or Collect gave up on it. It is not
// called when Post returns without publishing (done, or an error). It
// runs on the receive path and must not block.
func (c *Client) Post(deviceID string, cmd wire.Command, giveUp time.Time, onDone func()) (ack wire.Ack, done bool, err error) {
	if err := c.checkCommand(deviceID, cmd); err != nil {
		return wire.Ack{}, false, err
	}
	if cmd.Expires.IsZero() || cmd.Expires.After(giveUp) {
		cmd.Expires = giveUp
	}
	payload, err := cmd.AppendJSON(make([]byte, 0, 256))
	if err != nil {
		return wire.Ack{}, false, fmt.Errorf("send: %w: %w", ErrInvalidCommand, err)
	}
	key := ackKey{deviceID, cmd.ID}
	c.mu.Lock()
	if ack, done, err := c.postableLocked(key); done || err != nil {
		return ack, done, err
	}
	if _, busy := c.posted[key]; busy {
		c.mu.Unlock()
		return wire.Ack{}, false, fmt.Errorf("send %s to %s: %w", cmd.ID, deviceID, ErrInFlight)
	}
	c.posted[key] = onDone
	// A retryable failure remembered for the ID was not applied: this
	// attempt's ack is the one to wait for, even if an earlier one was
	// given up on.
	c.recent.Delete(key)
	c.gaveUp.Delete(key)
	c.mu.Unlock()
	if perr := c.publish(c.topics.Command(deviceID), payload); perr != nil {
		c.mu.Lock()
		delete(c.posted, key)
		c.mu.Unlock()
		return wire.Ack{}, false, fmt.Errorf("send %s to %s: publish: %w: %w", cmd.ID, deviceID, ErrNotConnected, perr)
	}
	c.stats.sent.Add(1)
	return wire.Ack{}, false, nil
}

// postableLocked says whether a command may be posted under key: not
// when the client is closed or its connection down (an error), nor when
// the ack of the ID is known already (done, with that ack). Caller holds
// mu; postableLocked releases it when it returns done or an error.
func (c *Client) postableLocked(key ackKey) (wire.Ack, bool, error) {
	switch {
	case c.closed:
		c.mu.Unlock()
		return wire.Ack{}, false, ErrClosed
	case c.reusable(key):
		r, _ := c.recent.Get(key)
		c.mu.Unlock()
		c.stats.cached.Add(1)
		ack, err := c.finish(key.device, r.ack)
		return ack, true, err
	case c.local == nil && !c.connected:
		c.mu.Unlock()
		return wire.Ack{}, false, fmt.Errorf("send %s to %s: %w", key.id, key.device, ErrNotConnected)
	}
	return wire.Ack{}, false, nil
}

// publish sends a command at QoS 1, not retained, without waiting for
// the broker: the connection writes it from its own goroutine, and one
// lost with the connection shows as a missing ack.
func (c *Client) publish(topic string, payload []byte) error {
	if c.local != nil {
		return c.local.Publish(topic, payload, false, 1)
	}
	tok := c.mc.PublishAsync(topic, payload, false, 1)
	select {
	case <-tok.Done():
		return tok.Error()
	default:
		return nil
	}
}

// Collect returns the ack of command id sent to device by Post, once it
// has come: the ack and nil when the device applied the command, the ack
// and a *RejectedError when it refused. Without an ack yet it returns
// false, unless giveUp is set: then it stops waiting for the command
// (a later ack is counted late, and a retry may Post the ID again) and
// returns an error wrapping driver.ErrAckTimeout.
func (c *Client) Collect(device, id string, giveUp bool) (wire.Ack, bool, error) {
	key := ackKey{device, id}
	c.mu.Lock()
	if ack, ok := c.collect[key]; ok {
		delete(c.collect, key)
		c.mu.Unlock()
		ack, err := c.finish(device, ack)
		return ack, true, err
	}
	if r, ok := c.recent.Get(key); ok {
		if _, waiting := c.posted[key]; !waiting {
			c.mu.Unlock()
			ack, err := c.finish(device, r.ack)
			return ack, true, err
		}
	}
	if !giveUp {
		c.mu.Unlock()
		return wire.Ack{}, false, nil
	}
	done, waiting := c.posted[key]
	if waiting {
		delete(c.posted, key)
		c.gaveUp.Put(key, struct{}{})
		c.dropExpectation(key)
	}
	c.mu.Unlock()
	if waiting && done != nil {
		done()
	}
	c.timedOut(device)
	return wire.Ack{}, true, fmt.Errorf("command %s to %s: %w", id, device, driver.ErrAckTimeout)
}

// timedOut counts a command to device that gave up waiting for its ack.
func (c *Client) timedOut(device string) {
	c.stats.timeouts.Add(1)
	if c.opts.OnAckTimeout != nil {
		c.opts.OnAckTimeout(device)
	}
}

// checkCommand checks what Post takes from its caller.
func (c *Client) checkCommand(deviceID string, cmd wire.Command) error {
	if err := wire.ValidateDeviceID(deviceID); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	if err := validateCommandID(cmd.ID); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	if cmd.Action == "" {
		return fmt.Errorf("send: %w: no action", ErrInvalidCommand)
	}
	return nil
}

// onMessage applies one device message. It runs on the connection's
// receive path, in the order the broker sent (mqttc's Ordered, so a
// device's availability and state updates keep their order), or on the
// in-process broker's, so it must never block, and it does not: it
// decodes one bounded payload and does O(1) work under the mutex, and
// the hooks it calls must not block either.
func (c *Client) onMessage(topic string, payload []byte) {
	id, kind, ok := c.topics.DeviceOf(topic)
	if !ok || wire.ValidateDeviceID(id) != nil {
		c.stats.malformed.Add(1)
		c.log.Debug("message on unexpected topic", "topic", topic)
		return
	}
	switch kind {
	case "ack":
		c.handleAck(topic, id, payload)
	case "state":
		c.handleState(topic, id, payload)
	case "availability":
		c.handleAvailability(topic, id, payload)
	}
}

func (c *Client) handleAck(topic, device string, payload []byte) {
	ack, err := wire.DecodeAck(payload)
	if err != nil {
		c.stats.malformedAcks.Add(1)
		c.malformed("ack", topic, device, payload, err)
		return
	}
	// The decoded maps are this function's own: normalized in place.
	normalizeOwned(ack.State)
	normalizeOwned(ack.Prior)
	c.applyAck(topic, device, ack)
}

// applyAck settles the command an ack answers: a native device's, or
// one an ecosystem adapter's report stands for.
func (c *Client) applyAck(topic, device string, ack wire.Ack) {
	key := ackKey{device, ack.ID}
	c.mu.Lock()
	c.dropExpectation(key) // settled, whoever settled it
	c.mu.Unlock()
	reusable := ack.OK || (ack.Error != nil && !wire.RetryableCode(ack.Error.Code))
	c.mu.Lock()
	if done, ok := c.posted[key]; ok {
		delete(c.posted, key)
		c.collect[key] = ack
		c.remember(key, ack, reusable)
		c.mu.Unlock()
		c.stats.acked.Add(1)
		if done != nil {
			done()
		}
		if c.opts.OnChange != nil {
			c.opts.OnChange(AckKey(device, ack.ID))
			// Let the woken step have this core now. The receive path
			// otherwise goes on (a device's state report follows its
			// ack) and the step waits for it or for an idle core to
			// wake: ~20 µs a step.
			runtime.Gosched()
		}
		return
	}
	_, dup := c.recent.Get(key)
	late := false
	if !dup {
		late = c.gaveUp.Delete(key)
		c.remember(key, ack, reusable)
	}
	c.mu.Unlock()
	switch {
	case dup:
		c.stats.duplicates.Add(1)
		c.log.Debug("duplicate ack", "device", device, "id", ack.ID)
	case late:
		c.stats.late.Add(1)
		c.log.Debug("late ack recorded", "device", device, "id", ack.ID, "ok", ack.OK)
	default:
		// Kept all the same: after an agent restart, the retry of a
		// command the previous process sent completes from it.
		c.stats.unknown.Add(1)
		if c.log.Enabled(context.Background(), slog.LevelDebug) {
			c.log.LogAttrs(context.Background(), slog.LevelDebug, "ack for an unknown command",
				slog.String("device", device), slog.String("topic", topic),
				slog.String("id", clip(ack.ID)), slog.Bool("ok", ack.OK))
		}
	}
	// A step that gave up on it waits for its retry: the retry may go
	// now, and finds the ack remembered. Not for an ack a retry cannot
	// use (busy, expired): it would only skip the backoff.
	if !dup && reusable && c.opts.OnChange != nil {
		c.opts.OnChange(AckKey(device, ack.ID))
	}
	if c.opts.OnStrayAck != nil {
		c.opts.OnStrayAck(device, ack, dup)
	}
}

// remember stores a final ack in the bounded cache. Caller holds mu.
func (c *Client) remember(key ackKey, ack wire.Ack, reusable bool) {
	c.recent.Put(key, recentAck{ack: ack, reusable: reusable})
}

// reusable says whether the ack remembered for key settles a command
// sent again with its ID. Caller holds mu.
func (c *Client) reusable(key ackKey) bool {
	r, ok := c.recent.Get(key)
	return ok && r.reusable
}

// entry returns the device's entry, creating it if the bound allows.
// Caller holds mu.
func (c *Client) entry(device string) *deviceEntry {
	e := c.devices[device]
	if e == nil {
		if len(c.devices) >= c.opts.MaxDevices {
			return nil
		}
		e = &deviceEntry{changed: make(chan struct{})}
		c.devices[device] = e
	}
	return e
}

// changedLocked wakes the device's watchers. Caller holds mu.
func (e *deviceEntry) changedLocked() {
	close(e.changed)
	e.changed = make(chan struct{})
}

func (c *Client) handleState(topic, device string, payload []byte) {
	if len(payload) == 0 {
		return // a cleared retained message: nothing reported
	}
	rep, err := wire.DecodeState(payload)
	if err != nil {
		c.malformed("state", topic, device, payload, err)
		return
	}
	st := rep.State
	normalizeOwned(st) // decoded here: nobody else holds it
	c.update(device, "state", func(e *deviceEntry) bool {
		e.state = st
		return true
	})
}

func (c *Client) handleAvailability(topic, device string, payload []byte) {
	if len(payload) == 0 {
		return
	}
	online, err := wire.DecodeAvailability(payload)
	if err != nil {
		c.malformed("availability", topic, device, payload, err)
		return
	}
	if c.update(device, "availability", func(e *deviceEntry) bool {
		changed := !e.availKnown || e.online != online
		e.availKnown, e.online = true, online
		return changed
	}) {
		c.log.Info("device availability", "device", device, "online", online)
	}
}

// malformed counts a device message that does not decode and logs it at
// debug level, with at most logClip bytes of its payload.
func (c *Client) malformed(kind, topic, device string, payload []byte, err error) {
	c.stats.malformed.Add(1)
	if !c.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	c.log.LogAttrs(context.Background(), slog.LevelDebug, "malformed "+kind+" ignored",
		slog.String("device", device), slog.String("topic", topic), slog.Any("err", err),
		slog.Int("bytes", len(payload)), slog.String("payload", clip(payload)))
}

// logClip bounds what a log line quotes of a device's payload or ID: a
// device may send up to wire.MaxPayload.
const logClip = 200

// clip cuts s to logClip bytes, marking the cut; it copies no more.
func clip[T ~string | ~[]byte](s T) string {
	if len(s) <= logClip {
		return string(s)
	}
	return string(s[:logClip]) + "…"
}

// update applies f to the device's entry under the mutex and, if f
// reports a change, wakes the device's watchers and calls OnChange.
func (c *Client) update(device, what string, f func(e *deviceEntry) bool) (changed bool) {
	c.mu.Lock()
	e := c.entry(device)
	if e == nil {
		c.mu.Unlock()
		c.log.Warn("too many devices; "+what+" dropped", "device", device, "max", c.opts.MaxDevices)
		return false
	}
	if changed = f(e); changed {
		e.changedLocked()
	}
	c.mu.Unlock()
	if changed {
		c.notify(device)
	}
	return changed
}

func (c *Client) notify(device string) {
	if c.opts.OnChange != nil {
		c.opts.OnChange(device)
	}
}

// Available reports whether a device is online. A device that has never
// published its availability counts as available: devices without a last
// will would otherwise be unusable, and a command to a device that is
// really gone fails by ack timeout, which is retried.
func (c *Client) Available(deviceID string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.devices[deviceID]
	return e == nil || !e.availKnown || e.online
}

// State returns a copy of the device's last reported (retained) state,
// with numbers as int64 or float64, and ok false if it has reported none.
func (c *Client) State(deviceID string) (state map[string]any, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.devices[deviceID]
	if e == nil || e.state == nil {
		return nil, false
	}
	return cloneMap(e.state), true
}

// sharedState is State without the copy, for callers that keep the map
// without changing it: an entry's state is replaced at each report, never
// changed in place.
func (c *Client) sharedState(deviceID string) map[string]any {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.devices[deviceID]; e != nil {
		return e.state
	}
	return nil
}

// Changed returns a channel that is closed at the device's next change of
// availability or state. Take it before reading State or Available so no
// change is missed between the read and the wait.
func (c *Client) Changed(deviceID string) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entry(deviceID)
	if e == nil {
		// Over the bound this device is never tracked, so it never changes;
		// an open channel makes callers fall back to their timeouts.
		return make(chan struct{})
	}
	return e.changed
}
