package broker

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Options configures an embedded broker.
type Options struct {
	// Addr is the TCP address to listen on; "127.0.0.1:0" picks a free port.
	// Default "127.0.0.1:1883".
	Addr string
	// TLS, when set, makes the listener speak TLS.
	TLS *tls.Config
	// Auth decides who may connect, publish and subscribe. Nil allows
	// everyone, which suits a broker bound to loopback only.
	Auth *Auth
	// Logger receives the broker's logs; nil discards them.
	Logger *slog.Logger
}

// Broker is an embedded mochi MQTT broker.
type Broker struct {
	srv *mqtt.Server
	// closing is set once Close begins: mochi then logs each client's
	// broken read or write (and, for a write, the whole packet) at warn,
	// which is the closing itself, not news.
	closing *atomic.Bool
	ln      *listeners.TCP
	once    sync.Once
	// subID numbers inline subscriptions: mochi merges the handlers of
	// all filters matching a topic by ID, so IDs must not repeat.
	subID atomic.Int64
	// taps are Tap's handlers, read by the retainer's hook on every
	// publish and replaced whole under tapMu.
	taps  atomic.Pointer[[]tap]
	tapMu sync.Mutex
	tls   bool
	// subsAdded counts subscriptions made, each counted once it is in the
	// topic index (see SubscriptionsAdded).
	subsAdded atomic.Uint64
	retained  *retainer
}

type tap struct {
	id     int64
	filter string
	handle func(topic string, payload []byte)
}

// Start starts a broker and returns once it accepts connections.
func Start(opts Options) (*Broker, error) {
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:1883"
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	closing := new(atomic.Bool)
	log = slog.New(&quietOnClose{h: log.Handler(), closing: closing})
	srv := mqtt.New(&mqtt.Options{Logger: log, InlineClient: true})
	var hook mqtt.Hook = new(auth.AllowHook)
	if opts.Auth != nil {
		// Auth releases a client ID only once no client of that ID is
		// connected, so it needs to see the server's clients.
		opts.Auth.ids.bind(srv)
		hook = opts.Auth
	}
	if err := srv.AddHook(hook, nil); err != nil {
		return nil, fmt.Errorf("broker auth hook: %w", err)
	}
	// Client and broker number their packets independently (packetid.go).
	if err := srv.AddHook(newPacketIDs(), nil); err != nil {
		return nil, fmt.Errorf("broker packet id hook: %w", err)
	}
	// A message published while a session changes connection reaches
	// the new one (handover.go).
	ho := newHandover(srv, log)
	if err := srv.AddHook(ho, nil); err != nil {
		return nil, fmt.Errorf("broker handover hook: %w", err)
	}
	b := &Broker{srv: srv, closing: closing}
	// The last publish hook (after the auth hook: mochi checks access
	// before any publish hook): the taps, then the retained store, which
	// keeps retained messages out of mochi's topic tree (retain.go). One
	// hook for both: each hook type costs the agent's binary a copy of
	// mochi's whole hook interface.
	b.retained = newRetainer(b, hook, log)
	b.retained.handover = ho
	if err := srv.AddHook(b.retained, nil); err != nil {
		return nil, fmt.Errorf("broker retain hook: %w", err)
	}
	ln := listeners.NewTCP(listeners.Config{ID: "tcp", Address: opts.Addr, TLSConfig: opts.TLS})
	// AddListener binds in Init, so a taken port fails here, not later.
	if err := srv.AddListener(ln); err != nil {
		return nil, fmt.Errorf("broker listen on %s: %w", opts.Addr, err)
	}
	if err := srv.Serve(); err != nil {
		_ = srv.Close()
		return nil, fmt.Errorf("broker serve: %w", err)
	}
	b.ln, b.tls = ln, opts.TLS != nil
	return b, nil
}

// Addr is the bound host:port.
func (b *Broker) Addr() string { return b.ln.Address() }

// URL is the address as a paho broker URL: ssl:// when it speaks TLS.
func (b *Broker) URL() string {
	if b.tls {
		return "ssl://" + b.Addr()
	}
	return "tcp://" + b.Addr()
}

// Subscribed reports whether any client subscribes to topic (by a
// filter, shared or not, or inline). A "no" holds for as long as
// SubscriptionsAdded does not change, so a caller may keep it until then.
func (b *Broker) Subscribed(topic string) bool {
	s := b.srv.Topics.Subscribers(topic)
	return len(s.Subscriptions) > 0 || len(s.Shared) > 0 || len(s.InlineSubscriptions) > 0
}

// SubscriptionsAdded counts the subscriptions clients and inline
// subscribers have made. It grows only once a subscription is in place,
// so a Subscribed answer "no" taken before it last grew may be stale,
// and one taken since may not.
func (b *Broker) SubscriptionsAdded() uint64 { return b.subsAdded.Load() }

// Retained returns the payload of topic's retained message, if it has
// one.
func (b *Broker) Retained(topic string) ([]byte, bool) {
	b.retained.mu.RLock()
	defer b.retained.mu.RUnlock()
	pk, ok := b.retained.msgs[topic]
	if !ok || !live(pk, time.Now().Unix()) {
		return nil, false
	}
	return pk.Payload, true
}

// Publish publishes from inside the broker's process (devices.Local),
// with no client connection in between. Subscribers get the message at
// the lower of qos and their subscription's QoS.
func (b *Broker) Publish(topic string, payload []byte, retained bool, qos byte) error {
	return b.srv.Publish(topic, payload, retained, qos)
}

// Subscribe subscribes from inside the broker's process (devices.Local).
// handle runs on the publishing client's receive goroutine.
func (b *Broker) Subscribe(filter string, handle func(topic string, payload []byte)) (func(), error) {
	id := int(b.subID.Add(1))
	err := b.srv.Subscribe(filter, id, func(_ *mqtt.Client, _ packets.Subscription, pk packets.Packet) {
		handle(pk.TopicName, pk.Payload)
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe %s: %w", filter, err)
	}
	b.retained.replayTo(filter, func(pk packets.Packet) { handle(pk.TopicName, pk.Payload) })
	b.subsAdded.Add(1)
	return func() { _ = b.srv.Unsubscribe(filter, id) }, nil
}

// SubscribeRetained is Subscribe with the message's retain flag, as a
// client over MQTT 3.1.1 would see it: set on the retained messages
// replayed before it returns, clear on every message forwarded as it is
// published (a device adapter must not take a live message for a
// replay).
func (b *Broker) SubscribeRetained(filter string, handle func(topic string, payload []byte, retained bool)) (func(), error) {
	id := int(b.subID.Add(1))
	err := b.srv.Subscribe(filter, id, func(_ *mqtt.Client, _ packets.Subscription, pk packets.Packet) {
		// The retainer clears the flag of every message it keeps, so
		// a set flag is one of mochi's own $SYS messages.
		handle(pk.TopicName, pk.Payload, pk.FixedHeader.Retain)
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe %s: %w", filter, err)
	}
	b.retained.replayTo(filter, func(pk packets.Packet) { handle(pk.TopicName, pk.Payload, true) })
	b.subsAdded.Add(1)
	return func() { _ = b.srv.Unsubscribe(filter, id) }, nil
}

// Tap calls handle with each message published on a topic matching
// filter as the broker takes it in (devices.LocalTap): once the
// publisher's access is checked, but before the broker acknowledges it
// to the publisher and before any subscriber gets it. Retained messages
// are not replayed to it, nor are last wills (mochi sends those without
// its publish hooks). handle runs on the publishing client's receive
// goroutine and must not block.
//
// The tap is the last publish hook Start adds but the retainer's; a hook
// added later through Server().AddHook that drops messages would drop
// them for subscribers only, not for taps, and would keep them retained.
func (b *Broker) Tap(filter string, handle func(topic string, payload []byte)) (func(), error) {
	switch {
	case handle == nil:
		return nil, fmt.Errorf("tap %s: no handler", filter)
	case !mqtt.IsValidFilter(filter, false) || strings.HasPrefix(filter, "$share/"):
		return nil, fmt.Errorf("tap %s: invalid topic filter (shared subscriptions cannot be tapped)", filter)
	}
	id := b.subID.Add(1)
	b.setTaps(func(ts []tap) []tap { return append(ts, tap{id, filter, handle}) })
	return func() {
		b.setTaps(func(ts []tap) []tap {
			kept := ts[:0]
			for _, t := range ts {
				if t.id != id {
					kept = append(kept, t)
				}
			}
			return kept
		})
	}, nil
}

func (b *Broker) setTaps(change func([]tap) []tap) {
	b.tapMu.Lock()
	defer b.tapMu.Unlock()
	var ts []tap
	if p := b.taps.Load(); p != nil {
		ts = slices.Clone(*p)
	}
	ts = change(ts)
	b.taps.Store(&ts)
}

// matchTopic reports whether an MQTT topic filter matches a topic name:
// "+" is one level, a final "#" is any number of levels, its parent
// included, and neither matches a first level starting with "$".
func matchTopic(filter, topic string) bool {
	if strings.HasPrefix(topic, "$") && (strings.HasPrefix(filter, "+") || strings.HasPrefix(filter, "#")) {
		return false
	}
	for {
		f, frest, fmore := strings.Cut(filter, "/")
		if f == "#" {
			return true
		}
		t, trest, tmore := strings.Cut(topic, "/")
		if f != "+" && f != t {
			return false
		}
		if !fmore || !tmore {
			return fmore == tmore || frest == "#"
		}
		filter, topic = frest, trest
	}
}

// Server exposes the mochi server for inline publishing and inspection.
func (b *Broker) Server() *mqtt.Server { return b.srv }

// Close disconnects every client and stops listening. It is safe to call
// more than once.
func (b *Broker) Close() error {
	var err error
	b.once.Do(func() {
		b.closing.Store(true)
		// mochi v2.7.9's own listener shutdown (Clients.GetByListener)
		// takes the clients' read lock twice; a client disconnecting at
		// that moment queues for the write lock between the two, and
		// Close deadlocks. Closing the listeners first with a closer that
		// locks once means Server.Close finds them closed and skips its
		// own.
		b.srv.Listeners.CloseAll(b.disconnectClients)
		err = b.srv.Close()
	})
	return err
}

// disconnectClients disconnects the clients of one listener. An MQTT 5
// client is told why (a DISCONNECT with "server shutting down"); an MQTT
// 3.1.1 client's connection is just closed, since 3.1.1 has no DISCONNECT
// from a server, and mosquitto_sub, for one, reports one as a protocol
// error.
func (b *Broker) disconnectClients(listener string) {
	for _, cl := range b.srv.Clients.GetAll() {
		if cl.Net.Listener != listener || cl.Closed() {
			continue
		}
		if cl.Properties.ProtocolVersion < 5 {
			cl.Stop(packets.ErrServerShuttingDown)
			continue
		}
		_ = b.srv.DisconnectClient(cl, packets.ErrServerShuttingDown)
	}
}

// quietOnClose passes mochi's log records on, except its warnings once
// the broker is closing (see Broker.closing).
type quietOnClose struct {
	h       slog.Handler
	closing *atomic.Bool
}

func (q *quietOnClose) Enabled(ctx context.Context, l slog.Level) bool { return q.h.Enabled(ctx, l) }

func (q *quietOnClose) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelError && q.closing.Load() {
		return nil
	}
	return q.h.Handle(ctx, r)
}

func (q *quietOnClose) WithAttrs(as []slog.Attr) slog.Handler {
	return &quietOnClose{h: q.h.WithAttrs(as), closing: q.closing}
}

func (q *quietOnClose) WithGroup(name string) slog.Handler {
	return &quietOnClose{h: q.h.WithGroup(name), closing: q.closing}
}
