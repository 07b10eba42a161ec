package mqttc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
)

// Defaults for Options fields left zero, and the fixed timings.
const (
	DefaultConnectTimeout       = 5 * time.Second
	DefaultTimeout              = 10 * time.Second
	DefaultKeepAlive            = 30 * time.Second
	DefaultMaxReconnectInterval = 10 * time.Second
	// FailureLogInterval spaces the logs of failed connection attempts.
	FailureLogInterval = 30 * time.Second
	// quiesce is how long Close lets the DISCONNECT and what is queued
	// before it go out.
	quiesce = 250 * time.Millisecond
	// firstBackoff is the first wait between connection attempts, and
	// subBackoff and maxSubBackoff those between subscription attempts.
	firstBackoff  = 500 * time.Millisecond
	subBackoff    = 100 * time.Millisecond
	maxSubBackoff = 5 * time.Second
)

// Sentinel errors of the package.
var (
	// ErrClosed means the Client has been closed.
	ErrClosed = errors.New("mqtt client closed")
	// ErrNotConnected means there was no connection to the broker, or it
	// did not come back in time.
	ErrNotConnected = errors.New("not connected to the broker")
	// ErrTimeout means the broker did not answer in time.
	ErrTimeout = errors.New("no answer from the broker in time")
	// ErrRefused means the broker refused a subscription (SUBACK 0x80),
	// which paho reports as a success.
	ErrRefused = errors.New("subscription refused by the broker")
	// ErrOptions wraps every invalid-options error of New.
	ErrOptions = errors.New("invalid mqtt client options")
)

// Will is a message the broker publishes for the client when its
// connection ends without a DISCONNECT.
type Will struct {
	Topic    string
	Payload  []byte
	QoS      byte
	Retained bool
}

// Options configures a Client. Broker is required.
type Options struct {
	// Broker is the broker's URL: tcp://, ssl://, tls://, mqtts://,
	// ws:// or wss://.
	Broker string
	// ClientID identifies the connection on the broker. Two connections
	// with the same ID kick each other off.
	ClientID string
	// Username and Password authenticate to the broker when Username is
	// set.
	Username, Password string
	// TLS configures ssl://, tls://, mqtts:// and wss:// brokers.
	TLS *tls.Config
	// Will, when set, is the connection's last will.
	Will *Will
	// KeepAlive is the ping interval; a ping unanswered for a third of
	// it (at most 10s) ends the connection. Zero means DefaultKeepAlive.
	KeepAlive time.Duration
	// ConnectTimeout bounds each connection attempt. Zero means
	// DefaultConnectTimeout.
	ConnectTimeout time.Duration
	// Timeout bounds Publish and Subscribe, each subscription made at
	// connection and each write to the network. Zero means
	// DefaultTimeout.
	Timeout time.Duration
	// MaxReconnectInterval caps the backoff between connection attempts.
	// Zero means DefaultMaxReconnectInterval.
	MaxReconnectInterval time.Duration
	// Ordered delivers messages one at a time, in the order the broker
	// sent them, on one goroutine: for callers whose state depends on the
	// order (a device's availability, a gateway's batches). A handler
	// that blocks then holds up every message after it.
	Ordered bool
	// Once makes one connection attempt and no reconnection: when that
	// connection ends the Client is done, and the caller makes a new one
	// (the simulator's devices do, as a rebooted device would). Connect
	// then returns the attempt's error, and the Client logs none of its
	// connection's life: the caller sees all of it.
	Once bool
	// Persistent keeps the session on the broker across connections
	// (MQTT clean session off): the broker keeps the subscriptions and
	// queues the QoS 1 messages for them while the client is away, and
	// delivers them when it is back, even before the Client has made its
	// subscriptions again, so the routes are in place before it
	// connects. It needs a stable ClientID. A subscription cancelled
	// while disconnected stays in the session (its messages are then
	// acked and dropped), as does one that Close leaves.
	Persistent bool
	// Abortable makes Abort work: the Client then dials tcp:// and tls
	// brokers itself (no websockets, no proxy from the environment).
	Abortable bool
	// OnConnect, if set, runs after every connection once the
	// subscriptions are in place, on the Client's goroutine: it may
	// publish and wait, but the Client notices nothing (not even a loss)
	// until it returns, and it must not call Close.
	OnConnect func()
	// OnConnectionLost, if set, runs on the Client's goroutine when a
	// connection that was up ends, but not at Close. It must not block,
	// nor call Close.
	OnConnectionLost func(err error)
	// Logger receives the connection's logs; nil discards them.
	Logger *slog.Logger
}

func (o *Options) withDefaults() error {
	if o.Broker == "" {
		return fmt.Errorf("%w: no broker URL", ErrOptions)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.KeepAlive, DefaultKeepAlive)
	def(&o.ConnectTimeout, DefaultConnectTimeout)
	def(&o.Timeout, DefaultTimeout)
	def(&o.MaxReconnectInterval, DefaultMaxReconnectInterval)
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return nil
}

// Client is a connection to an MQTT broker that comes back by itself.
// It implements the same Publish and Subscribe as the embedded broker's
// in-process link.
type Client struct {
	opts Options
	log  *slog.Logger

	startOnce sync.Once
	closeOnce sync.Once
	wg        sync.WaitGroup
	ctx       context.Context // ends at Close
	cancel    context.CancelFunc

	closed atomic.Bool // set first thing in Close
	// gate lets Close wait for the handlers already running; stopped,
	// set under it, turns away the ones that start after.
	gate    sync.RWMutex
	stopped bool

	cur  atomic.Pointer[conn] // the connection while it is up and subscribed
	last atomic.Pointer[conn] // the connection being made, or cur

	mu      sync.Mutex
	started bool
	subs    map[string]*topic
	up      chan struct{} // closed while cur is set; replaced at each loss
	first   chan struct{} // closed once Connect has its answer
	firstOK bool          // the first connection was made (Once: or its error is in lastErr)
	lastErr error         // why the Client is not up: the last failed attempt's, or the loss's
	// loggedSubErr is the last subscription failure logged, so that one
	// refused again and again is logged once; "" once all are made.
	loggedSubErr string
}

// topic is what the broker knows of a filter: one subscription, at the
// highest QoS any of its handlers asked for, with every handler that
// subscribed it (several parts of one program may read one filter: the
// device layer's adapters and its announcement watcher do).
type topic struct {
	filter string
	// subs is replaced, never changed in place, under Client.mu, so that
	// routing a message takes no lock.
	subs atomic.Pointer[[]*sub]
}

func (t *topic) list() []*sub {
	if p := t.subs.Load(); p != nil {
		return *p
	}
	return nil
}

// qos is the QoS the broker is asked for: the highest of the handlers'.
func (t *topic) qos() byte {
	var q byte
	for _, s := range t.list() {
		q = max(q, s.qos)
	}
	return q
}

// optional reports whether the broker's refusal of the filter may be
// lived with: only when every handler said so.
func (t *topic) optional() bool {
	for _, s := range t.list() {
		if !s.optional {
			return false
		}
	}
	return true
}

// sub is one subscription: a filter and its handler.
type sub struct {
	filter string
	qos    byte
	handle func(topic string, payload []byte)
	// handleMsg, when set, is called instead of handle, with the
	// message's retain flag (see SubscribeRetained).
	handleMsg func(topic string, payload []byte, retained bool)
	// optional subscriptions do not hold a connection back when the
	// broker refuses them (see SubscribeOptional).
	optional  bool
	cancelled atomic.Bool
}

// New checks opts and returns a Client; nothing connects until Start or
// Connect.
func New(opts Options) (*Client, error) {
	if err := opts.withDefaults(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Client{
		opts:   opts,
		log:    opts.Logger,
		ctx:    ctx,
		cancel: cancel,
		subs:   make(map[string]*topic),
		up:     make(chan struct{}),
		first:  make(chan struct{}),
	}, nil
}

// Start starts connecting in the background, and reconnecting whenever
// the connection ends, until Close. Later calls do nothing.
func (c *Client) Start() {
	c.startOnce.Do(func() {
		c.mu.Lock()
		c.started = true
		c.mu.Unlock()
		c.wg.Go(c.run)
	})
}

// Connect starts the Client and waits until it is connected, its
// subscriptions are made and OnConnect has returned, or ctx ends. The
// Client keeps trying after ctx ends (except with Options.Once); close
// it if that is not wanted.
func (c *Client) Connect(ctx context.Context) error {
	c.Start()
	select {
	case <-c.first:
		c.mu.Lock()
		ok, err := c.firstOK, c.lastErr
		c.mu.Unlock()
		if ok {
			return nil
		}
		return fmt.Errorf("connect to %s: %w", c.opts.Broker, err)
	case <-c.ctx.Done():
		return ErrClosed
	case <-ctx.Done():
		c.mu.Lock()
		last := c.lastErr
		c.mu.Unlock()
		if last != nil {
			return fmt.Errorf("connect to %s: %w: %w", c.opts.Broker, context.Cause(ctx), last)
		}
		return fmt.Errorf("connect to %s: %w", c.opts.Broker, context.Cause(ctx))
	}
}

// Connected reports whether the connection is up and subscribed.
func (c *Client) Connected() bool { return c.cur.Load() != nil && !c.closed.Load() }

// Problem says why the Client is not connected and subscribed: nil when
// it is, else the last failed connection attempt's or subscription's
// error, the loss's, ErrClosed, or ErrNotConnected before any attempt
// has ended.
func (c *Client) Problem() error {
	switch {
	case c.closed.Load():
		return ErrClosed
	case c.cur.Load() != nil:
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lastErr != nil {
		return c.lastErr
	}
	return ErrNotConnected
}

// Subscribe calls handle with each message on a topic matching filter,
// now and on every later connection, until cancel. Before Start it only
// records the subscription, which the first connection makes; after, it
// returns once the broker has granted it, at most Options.Timeout later
// (a connection coming back within it counts). A filter subscribed
// again keeps its first handler and adds the new one: each is called,
// and cancel removes only its own (the broker is asked again, so that
// the new handler gets the filter's retained messages, which the ones
// already there then see a second time, as after a reconnection).
// handle must not block; a call already running may finish after cancel
// returns.
func (c *Client) Subscribe(filter string, handle func(topic string, payload []byte)) (cancel func(), err error) {
	return c.SubscribeQoS(filter, 1, handle)
}

// SubscribeQoS is Subscribe at QoS qos (0 or 1). A QoS 0 subscription
// costs a broker nothing per message (NATS makes every QoS 1 MQTT
// subscription a JetStream consumer), for messages the sender repeats
// until it hears back anyway.
func (c *Client) SubscribeQoS(filter string, qos byte, handle func(topic string, payload []byte)) (cancel func(), err error) {
	return c.add(&sub{filter: filter, qos: min(qos, 1), handle: handle})
}

// SubscribeOptional is SubscribeQoS for what the caller can do without:
// a broker's refusal of it (an ACL that does not grant the filter) is
// logged and does not hold the connection back, as a refused
// subscription otherwise does; it is asked for again at the next
// connection.
func (c *Client) SubscribeOptional(filter string, qos byte, handle func(topic string, payload []byte)) (cancel func(), err error) {
	return c.add(&sub{filter: filter, qos: min(qos, 1), handle: handle, optional: true})
}

// add records s and, once started, makes it on the broker (see
// SubscribeQoS).
func (c *Client) add(s *sub) (cancel func(), err error) {
	filter := s.filter
	if c.closed.Load() {
		return nil, ErrClosed
	}
	c.mu.Lock()
	t := c.subs[filter]
	if t == nil {
		t = &topic{filter: filter}
		c.subs[filter] = t
	}
	subs := append(slices.Clone(t.list()), s)
	t.subs.Store(&subs)
	cn, up, started := c.cur.Load(), c.up, c.started
	c.mu.Unlock()
	cancel = func() { c.unsubscribe(s) }
	if !started {
		return cancel, nil
	}
	if cn == nil {
		// The Client's goroutine makes every recorded subscription before
		// it declares the next connection up.
		t := time.NewTimer(c.opts.Timeout)
		defer t.Stop()
		select {
		case <-up:
			return cancel, nil
		case <-c.ctx.Done():
			c.forget(s)
			return nil, ErrClosed
		case <-t.C:
			c.forget(s)
			return nil, fmt.Errorf("subscribe %s: %w", filter, ErrNotConnected)
		}
	}
	if err := c.subscribe(cn, []*topic{t}); err != nil {
		if s.optional && errors.Is(err, ErrRefused) {
			c.log.Warn("optional subscription refused; going on without it", "broker", c.opts.Broker, "err", err)
			return cancel, nil
		}
		c.forget(s)
		return nil, fmt.Errorf("subscribe %s: %w", filter, err)
	}
	return cancel, nil
}

// forget drops s from the subscriptions, and its handler is not called
// again even if the broker still sends its messages. last reports that
// it was its filter's last handler.
func (c *Client) forget(s *sub) (last bool) {
	already := s.cancelled.Swap(true)
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.subs[s.filter]
	if already || t == nil {
		return false
	}
	// A new slice (readers hold the old one), written out rather than
	// by slices.Clone and DeleteFunc: generic instantiations cost the
	// agent's binary, which has a budget.
	old := t.list()
	subs := make([]*sub, 0, len(old))
	for _, o := range old {
		if o != s {
			subs = append(subs, o)
		}
	}
	if len(subs) > 0 {
		t.subs.Store(&subs)
		return false
	}
	delete(c.subs, s.filter)
	return true
}

func (c *Client) unsubscribe(s *sub) {
	if !c.forget(s) {
		return // cancelled already, or another handler still reads the filter
	}
	cn := c.cur.Load()
	if cn == nil || c.closed.Load() {
		return // the next connection will not make it
	}
	if err := Wait(c.ctx, cn.pc.Unsubscribe(s.filter), c.opts.Timeout); err != nil {
		c.log.Warn("unsubscribe", "filter", s.filter, "err", err)
	}
	// A handler that subscribed the filter again meanwhile had its
	// SUBSCRIBE perhaps taken before this UNSUBSCRIBE: ask again.
	c.mu.Lock()
	t := c.subs[s.filter]
	c.mu.Unlock()
	if t != nil && c.cur.Load() == cn {
		if err := c.subscribe(cn, []*topic{t}); err != nil {
			c.log.Warn("subscribe again after an unsubscribe", "filter", s.filter, "err", err)
		}
	}
}

// subscribe makes ts on cn in one SUBSCRIBE and checks the broker's
// answer for each filter.
func (c *Client) subscribe(cn *conn, ts []*topic) error {
	filters := make(map[string]byte, len(ts))
	for _, t := range ts {
		filters[t.filter] = t.qos()
		cn.pc.AddRoute(t.filter, c.route(t))
	}
	tok := cn.pc.SubscribeMultiple(filters, nil)
	if err := Wait(c.ctx, tok, c.opts.Timeout); err != nil {
		return err
	}
	if st, ok := tok.(*paho.SubscribeToken); ok {
		for filter, code := range st.Result() {
			if code >= 0x80 {
				return fmt.Errorf("%w: %s (code %#x)", ErrRefused, filter, code)
			}
		}
	}
	return nil
}

// route is paho's handler for t: it calls each of its handlers, and
// keeps Close's promise that no handler runs after it returns.
func (c *Client) route(t *topic) paho.MessageHandler {
	return func(_ paho.Client, m paho.Message) {
		c.gate.RLock()
		defer c.gate.RUnlock()
		if c.stopped {
			return
		}
		for _, s := range t.list() {
			switch {
			case s.cancelled.Load():
			case s.handleMsg != nil:
				s.handleMsg(m.Topic(), m.Payload(), m.Retained())
			default:
				s.handle(m.Topic(), m.Payload())
			}
		}
	}
}

// Publish sends a message and waits until the broker has taken it (for
// QoS 1 and 2), at most Options.Timeout in all: a connection that is
// down may come back within it. It implements the in-process link's
// Publish.
func (c *Client) Publish(topic string, payload []byte, retained bool, qos byte) error {
	t := time.NewTimer(c.opts.Timeout)
	defer t.Stop()
	cn := c.cur.Load()
	for cn == nil {
		if c.closed.Load() {
			return ErrClosed
		}
		c.mu.Lock()
		up := c.up
		c.mu.Unlock()
		select {
		case <-up:
		case <-c.ctx.Done():
			return ErrClosed
		case <-t.C:
			return fmt.Errorf("publish %s: %w", topic, ErrNotConnected)
		}
		cn = c.cur.Load()
	}
	tok := cn.pc.Publish(topic, qos, retained, payload)
	select {
	case <-tok.Done():
	case <-t.C:
		return fmt.Errorf("publish %s: %w", topic, ErrTimeout)
	}
	if err := tok.Error(); err != nil {
		return fmt.Errorf("publish %s: %w", topic, err)
	}
	return nil
}

// PublishAsync sends a message without waiting: the Token says when the
// broker has taken it. While the connection is down the Token has
// already failed with ErrNotConnected.
func (c *Client) PublishAsync(topic string, payload []byte, retained bool, qos byte) Token {
	if c.closed.Load() {
		return failed(ErrClosed)
	}
	cn := c.cur.Load()
	if cn == nil {
		return failed(ErrNotConnected)
	}
	return cn.pc.Publish(topic, qos, retained, payload)
}

// Abort drops the network connection without a DISCONNECT, as a power
// cut would: the broker publishes the will, and the Client sees the
// connection lost. It needs Options.Abortable.
func (c *Client) Abort() {
	if cn := c.last.Load(); cn != nil {
		cn.cut()
	}
}

// Close disconnects, waiting at most a quiesce time for what is queued
// to go out, and returns once the Client's goroutine and the handlers
// running have finished: no handler runs after it, so no handler may
// call it. A connection attempt in progress is abandoned (paho ends it
// within ConnectTimeout). It is safe to call more than once.
func (c *Client) Close() {
	c.closeOnce.Do(func() {
		c.startOnce.Do(func() {}) // no Start after Close
		c.closed.Store(true)
		c.cancel()
		c.wg.Wait()
		c.gate.Lock()
		c.stopped = true
		c.gate.Unlock()
	})
}
