package simulator

import (
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
)

// BrokerOptions configures an embedded broker.
type BrokerOptions struct {
	// Addr is the TCP address to listen on; "127.0.0.1:0" picks a free port.
	// Default "127.0.0.1:1883".
	Addr string
	// TLS, when set, makes the listener speak TLS.
	TLS *tls.Config
	// Auth decides who may connect, publish and subscribe. Nil allows
	// everyone, which suits a broker bound to loopback.
	Auth mqtt.Hook
	// AuthConfig is passed to Auth's Init.
	AuthConfig any
	// Logger receives the broker's logs; nil discards them.
	Logger *slog.Logger
}

// Broker is an embedded mochi MQTT broker.
type Broker struct {
	srv  *mqtt.Server
	ln   *listeners.TCP
	once sync.Once
	// subID numbers inline subscriptions: mochi merges the handlers of
	// all filters matching a topic by ID, so IDs must not repeat.
	subID atomic.Int64
}

// StartBroker starts a broker and returns once it accepts connections.
func StartBroker(opts BrokerOptions) (*Broker, error) {
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:1883"
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	srv := mqtt.New(&mqtt.Options{Logger: log, InlineClient: true})
	hook := opts.Auth
	if hook == nil {
		hook = new(auth.AllowHook)
	}
	if err := srv.AddHook(hook, opts.AuthConfig); err != nil {
		return nil, fmt.Errorf("broker auth hook: %w", err)
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
	return &Broker{srv: srv, ln: ln}, nil
}

// Addr is the bound host:port.
func (b *Broker) Addr() string { return b.ln.Address() }

// URL is the address as a paho broker URL.
func (b *Broker) URL() string { return "tcp://" + b.Addr() }

// Subscribed reports whether any client subscribes to topic (by a
// filter, shared or not, or inline).
func (b *Broker) Subscribed(topic string) bool {
	s := b.srv.Topics.Subscribers(topic)
	return len(s.Subscriptions) > 0 || len(s.Shared) > 0 || len(s.InlineSubscriptions) > 0
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
	return func() { _ = b.srv.Unsubscribe(filter, id) }, nil
}

// Server exposes the mochi server for inline publishing and inspection.
func (b *Broker) Server() *mqtt.Server { return b.srv }

// Close disconnects every client and stops listening. It is safe to call
// more than once.
func (b *Broker) Close() error {
	var err error
	b.once.Do(func() {
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

// disconnectClients disconnects the clients of one listener.
func (b *Broker) disconnectClients(listener string) {
	for _, cl := range b.srv.Clients.GetAll() {
		if cl.Net.Listener == listener && !cl.Closed() {
			_ = b.srv.DisconnectClient(cl, packets.ErrServerShuttingDown)
		}
	}
}

// TestBroker starts a broker on 127.0.0.1:0 for a test and closes it in
// the test's cleanup.
func TestBroker(tb testing.TB) *Broker {
	tb.Helper()
	b, err := StartBroker(BrokerOptions{Addr: "127.0.0.1:0"})
	if err != nil {
		tb.Fatalf("start broker: %v", err)
	}
	tb.Cleanup(func() { _ = b.Close() })
	return b
}
