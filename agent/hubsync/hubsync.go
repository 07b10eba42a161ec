package hubsync

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/mqttc"
	"github.com/sortie-edge/sortie/store"
	"github.com/sortie-edge/sortie/uplink"
)

// Source is the outbox the uplink forwards and trims. *store.DB
// implements it (with store.Options.Outbox set).
type Source interface {
	// Outbox returns up to limit entries with seq greater than after, in
	// seq order.
	Outbox(ctx context.Context, after uint64, limit int) ([]store.OutboxEntry, error)
	// AckOutbox deletes the entries up to and including upto.
	AckOutbox(ctx context.Context, upto uint64) (int, error)
	// OutboxLen returns the number of entries not yet acknowledged.
	OutboxLen() int
}

// OutboxNamer names an outbox (uplink.Batch.Outbox). When the Source
// implements it (*store.DB does), batches carry the name and acks about
// another outbox are ignored: a gateway whose store was replaced under
// the same ID must not delete its entries on acks meant for the old one.
type OutboxNamer interface {
	OutboxID() string
}

// ControlMemory keeps control answers across restarts. When the Source
// implements it (*store.DB does), a request the hub sends again after
// the gateway restarted is answered from it rather than carried out a
// second time; otherwise answers are remembered in memory, for as long
// as Run runs.
type ControlMemory interface {
	RememberControl(ctx context.Context, id string, answer []byte) error
	RecallControl(ctx context.Context, id string) ([]byte, bool, error)
}

// HeartbeatSource supplies what only the agent knows for a heartbeat.
type HeartbeatSource interface {
	// Heartbeat returns the active mission count and the device inventory
	// (Active, Devices). The uplink fills in Gateway, Version (if empty),
	// Uptime, Backlog and Time. It must return promptly.
	Heartbeat(ctx context.Context) uplink.Heartbeat
}

// ControlHandler carries out the hub's control requests.
type ControlHandler interface {
	// Control performs c and says how it went. Requests are handled one
	// at a time, in arrival order; ctx ends after Options.ControlTimeout
	// or when the uplink stops. The result's ID is set to c.ID.
	Control(ctx context.Context, c uplink.Control) uplink.ControlResult
}

// Defaults for Options.
const (
	DefaultHeartbeatInterval = 30 * time.Second
	DefaultBatchSize         = 256
	DefaultWindow            = 4
	DefaultResendTimeout     = 30 * time.Second
	DefaultTimeout           = 10 * time.Second
	DefaultMaxReconnect      = 30 * time.Second
	DefaultControlTimeout    = 30 * time.Second
	controlQueue             = 64
)

// Sentinel errors of the package.
var (
	// ErrOptions wraps every invalid-options error of New.
	ErrOptions = errors.New("invalid uplink options")
	// ErrRunning means Run was called on an Uplink that already ran.
	ErrRunning = errors.New("uplink already ran")
)

// Control result codes set by the uplink itself.
const (
	CodeInvalid     = "invalid"     // the request could not be decoded
	CodeUnsupported = "unsupported" // no ControlHandler
	CodeInternal    = "internal"    // the handler panicked
)

// Options configures an Uplink. Broker, Gateway and Source are required.
type Options struct {
	// Broker is the hub broker's URL, e.g. "tls://hub.example:8883".
	Broker string
	// Brokers, optional, are more addresses of the same hub (the other
	// nodes of a NATS cluster): each connection attempt, and each
	// reconnection after a loss, takes the next address in turn, Broker
	// first.
	Brokers []string
	// Gateway is this gateway's ID; it names its topics.
	Gateway string
	// ClientID is the MQTT client ID; default "sortie-gw-" + Gateway. It
	// must be unique on the hub broker.
	ClientID string
	// Username and Password are this gateway's credentials on the hub
	// broker, whose ACL limits it to its own topics.
	Username, Password string
	// TLS, when set, configures the TLS connection.
	TLS *tls.Config
	// Prefix is the topic root; empty means DefaultPrefix.
	Prefix string
	// NoRetain publishes the status (and the will) not retained. The
	// single hub needs it retained, to learn every gateway's state when
	// it starts; the cluster mode keeps presence in a stream of its own,
	// and a NATS cluster keeps an index entry for every retained topic
	// in memory on every node.
	NoRetain bool

	Source Source
	// Traces, optional, is the log of trigger records, sent once the
	// hub's acks say it takes them.
	Traces    TraceSource
	Heartbeat HeartbeatSource // optional: heartbeats then carry no inventory
	Control   ControlHandler  // optional: requests are then answered "unsupported"
	// OnConnect, optional, is called on the sync loop's goroutine after
	// each connection is announced (status and heartbeat sent): what
	// must be said again on every connection is said from it. It must
	// not block for long.
	OnConnect func()

	// Logger receives connection and sync reports; nil discards them.
	Logger *slog.Logger
	// Version is the agent version, reported in status and heartbeats.
	Version string

	// HeartbeatInterval is the time between heartbeats; one also follows
	// every connect.
	HeartbeatInterval time.Duration
	// BatchSize caps the entries of one batch (also kept under MaxMessage).
	BatchSize int
	// Window caps the batches published but not yet acknowledged.
	Window int
	// ResendTimeout is how long the oldest unacknowledged batch waits for
	// the hub's ack before everything unacknowledged is sent again.
	ResendTimeout time.Duration
	// Timeout bounds connecting, subscribing and each publish.
	Timeout time.Duration
	// MaxReconnectInterval caps the reconnect backoff.
	MaxReconnectInterval time.Duration
	// ControlTimeout bounds one ControlHandler call.
	ControlTimeout time.Duration
	// Now is the clock for uptime, lag and resend deadlines; nil means
	// time.Now.
	Now func() time.Time
}

func (o *Options) withDefaults() error {
	switch {
	case o.Broker == "":
		return fmt.Errorf("%w: no broker URL", ErrOptions)
	case o.Source == nil:
		return fmt.Errorf("%w: no outbox source", ErrOptions)
	}
	if err := driver.ValidateID("gateway", o.Gateway); err != nil {
		return fmt.Errorf("%w: %w", ErrOptions, err)
	}
	if o.ClientID == "" {
		o.ClientID = uplink.DefaultClientID(o.Gateway)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.HeartbeatInterval, DefaultHeartbeatInterval)
	def(&o.ResendTimeout, DefaultResendTimeout)
	def(&o.Timeout, DefaultTimeout)
	def(&o.MaxReconnectInterval, DefaultMaxReconnect)
	def(&o.ControlTimeout, DefaultControlTimeout)
	if o.BatchSize <= 0 {
		o.BatchSize = DefaultBatchSize
	}
	o.BatchSize = min(o.BatchSize, store.MaxOutboxLimit)
	if o.Window <= 0 {
		o.Window = DefaultWindow
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return nil
}

// Stats is a snapshot of the uplink, for metrics.
type Stats struct {
	Connected bool
	Broker    string // the address connected to, while Connected
	Connects  uint64 // connections made, first and re-
	Batches   uint64 // batches published, resends included
	Sent      uint64 // entries published, resends included
	Acked     uint64 // entries deleted after the hub's acks
	Resends   uint64 // times the unacknowledged window was sent again
	Backlog   int    // outbox entries not yet acknowledged
	LastAck   time.Time
	// Lag is how old the oldest unacknowledged entry the uplink has read
	// is (by its event time); zero when the hub has everything.
	Lag            time.Duration
	Controls       uint64 // control requests answered
	ControlErrors  uint64 // answered with ok=false
	ControlDropped uint64 // dropped: queue full, or not this gateway's topic
	ControlRepeats uint64 // requests the hub sent again, answered from memory or the store
	ForeignAcks    uint64 // acks about another outbox of this gateway, ignored
	TraceRecords   uint64 // trigger records published, resends included
	TraceAcked     uint64 // trigger records deleted after the hub's acks
}

// Uplink syncs one gateway with the hub. Create it with New and call Run;
// Notify and Stats may be called from any goroutine.
type Uplink struct {
	opts    Options
	topics  uplink.Topics
	log     *slog.Logger
	started time.Time
	outbox  string // the Source's OutboxNamer name, if it has one

	wake     chan struct{} // Notify
	connEv   chan struct{} // the connection went up or down
	ackEv    chan struct{} // ackUpto grew
	controls chan []byte
	ackUpto  atomic.Uint64 // highest ack received, capped by maxSent on arrival
	maxSent  atomic.Uint64 // highest seq this uplink has started to publish
	// The same for trigger records; tracesOK is set by the first ack
	// that carries a trace cursor (a hub that takes them).
	traceAckUpto, maxTraceSent atomic.Uint64
	tracesOK                   atomic.Bool
	connGen                    atomic.Uint64
	ran                        atomic.Bool
	// conn is the connection being made or up, made by dial; nil
	// before the first.
	conn atomic.Pointer[mqttc.Client]
	addr atomic.Value // string: conn's address, redacted

	mu      sync.Mutex
	stats   Stats
	oldest  time.Time     // event time of the oldest unacknowledged entry read
	changed chan struct{} // closed and replaced whenever stats change
}

// New checks opts and returns an Uplink; nothing connects until Run.
func New(opts Options) (*Uplink, error) {
	if err := opts.withDefaults(); err != nil {
		return nil, err
	}
	var outbox string
	if n, ok := opts.Source.(OutboxNamer); ok {
		outbox = n.OutboxID()
	}
	return &Uplink{
		outbox:   outbox,
		opts:     opts,
		topics:   uplink.Topics{Prefix: opts.Prefix},
		log:      opts.Logger.With("component", "uplink", "gateway", opts.Gateway),
		started:  opts.Now(),
		wake:     make(chan struct{}, 1),
		connEv:   make(chan struct{}, 1),
		ackEv:    make(chan struct{}, 1),
		controls: make(chan []byte, controlQueue),
		changed:  make(chan struct{}),
	}, nil
}

// Notify tells the uplink that the outbox has new entries. It never
// blocks; call it from a driver.Observer.
func (u *Uplink) Notify() { signal(u.wake) }

// Observe implements driver.Observer by calling Notify, so an Uplink can
// be registered with the driver directly.
func (u *Uplink) Observe(driver.Event, *driver.Mission) { u.Notify() }

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Stats returns a snapshot of the uplink's counters.
func (u *Uplink) Stats() Stats {
	u.mu.Lock()
	s := u.stats
	oldest := u.oldest
	u.mu.Unlock()
	s.Backlog = u.opts.Source.OutboxLen()
	if !oldest.IsZero() && s.Backlog > 0 {
		s.Lag = max(u.opts.Now().Sub(oldest), 0)
	}
	return s
}

// update changes the stats and wakes waitStats callers.
func (u *Uplink) update(f func(s *Stats)) {
	u.mu.Lock()
	f(&u.stats)
	close(u.changed)
	u.changed = make(chan struct{})
	u.mu.Unlock()
}

// waitStats waits until cond holds for the stats or ctx ends.
func (u *Uplink) waitStats(ctx context.Context, cond func(Stats) bool) (Stats, error) {
	for {
		u.mu.Lock()
		ch := u.changed
		u.mu.Unlock()
		if s := u.Stats(); cond(s) {
			return s, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return u.Stats(), ctx.Err()
		}
	}
}

// Run connects to the hub broker and syncs until ctx ends; it then
// publishes the offline status, disconnects and returns nil. The hub
// being unreachable is not an error: Run keeps retrying, and the outbox
// keeps what is not yet acknowledged. Run may be called once.
func (u *Uplink) Run(ctx context.Context) error {
	if !u.ran.CompareAndSwap(false, true) {
		return ErrRunning
	}
	offline, err := json.Marshal(uplink.Status{Gateway: u.opts.Gateway, State: uplink.StateOffline, Protocol: uplink.Protocol, Version: u.opts.Version, Started: u.started})
	if err != nil {
		return fmt.Errorf("uplink: encode will: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	// The hub being unreachable is not an error: dial keeps trying, and
	// the connection's hooks tell the loop.
	wg.Go(func() { u.dial(ctx, offline) })
	wg.Go(func() { u.serveControls(ctx) })
	s := &sender{u: u}
	s.run(ctx)
	cancel()
	wg.Wait()
	u.goodbye()
	return nil
}

// goodbye publishes the offline status itself, since a clean disconnect
// suppresses the will, and disconnects.
func (u *Uplink) goodbye() {
	client := u.conn.Load()
	if client == nil {
		return
	}
	if client.Connected() {
		st := uplink.Status{Gateway: u.opts.Gateway, State: uplink.StateOffline, Protocol: uplink.Protocol, Version: u.opts.Version, Started: u.started, Time: u.opts.Now()}
		if err := u.publish(context.Background(), u.topics.Status(u.opts.Gateway), !u.opts.NoRetain, st); err != nil {
			u.log.Warn("publish offline status", "err", err)
		}
	}
	client.Close()
	u.update(func(s *Stats) { s.Connected, s.Broker = false, "" })
}

// publish sends one message and waits for the broker to take it, at most
// Options.Timeout.
func (u *Uplink) publish(ctx context.Context, topic string, retained bool, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode for %s: %w", topic, err)
	}
	return u.publishRaw(ctx, topic, retained, 1, b)
}

// publishRaw publishes b on the current connection.
func (u *Uplink) publishRaw(ctx context.Context, topic string, retained bool, qos byte, b []byte) error {
	client := u.conn.Load()
	if client == nil {
		return fmt.Errorf("publish %s: %w", topic, mqttc.ErrNotConnected)
	}
	if err := mqttc.Wait(ctx, client.PublishAsync(topic, b, retained, qos), u.opts.Timeout); err != nil {
		return fmt.Errorf("publish %s: %w", topic, err)
	}
	return nil
}

// BundleStatus publishes what became of a bundle the hub offered, at
// QoS 1, on the current connection; an error when there is none (the
// caller says it again from Options.OnConnect).
func (u *Uplink) BundleStatus(ctx context.Context, s uplink.BundleStatus) error {
	s.Gateway = u.opts.Gateway
	return u.publish(ctx, u.topics.BundleStatus(u.opts.Gateway), false, s)
}

// onAck handles the ack topic: it records the highest ack and wakes the
// loop, never blocking. An ack beyond what this uplink has published is
// cut down to it on arrival: a stray or forged ack must not delete
// entries the hub never had, now or once they are sent.
func (u *Uplink) onAck(_ string, payload []byte) {
	a, err := uplink.DecodeAck(payload)
	if err != nil {
		u.log.Warn("bad ack from hub", "err", err)
		return
	}
	if a.Traces != nil && !u.tracesOK.Swap(true) {
		// That the hub takes records holds whichever store it counts;
		// records held back (or sent at QoS 0 to ask) go now.
		signal(u.wake)
	}
	if !u.ours(a.Outbox) {
		// Meant for the store this one replaced (sent before the hub
		// heard from this one): its seqs count another outbox.
		u.log.Debug("ack about another outbox ignored", "outbox", *a.Outbox, "upto", a.Upto)
		u.update(func(s *Stats) { s.ForeignAcks++ })
		return
	}
	if a.Traces != nil {
		u.onTraceAck(*a.Traces)
	}
	upto := min(a.Upto, u.maxSent.Load())
	for {
		cur := u.ackUpto.Load()
		if upto <= cur || u.ackUpto.CompareAndSwap(cur, upto) {
			break
		}
	}
	signal(u.ackEv)
}

// ours says whether an ack about outbox counts this uplink's store. A
// gateway that names none takes every ack; one that does takes acks
// naming it, and acks that name nothing at all (nil: a hub before outbox
// names). An ack naming "" comes from a hub that names outboxes and is
// about a gateway that named none: the store this one replaced, whose
// late batch a replica applied.
func (u *Uplink) ours(outbox *string) bool {
	return u.outbox == "" || outbox == nil || *outbox == u.outbox
}

// onControl handles the control topic: it queues the payload for
// serveControls, never blocking.
func (u *Uplink) onControl(topic string, payload []byte) {
	if topic != u.topics.Control(u.opts.Gateway) {
		u.log.Warn("control message on a foreign topic ignored", "topic", topic)
		u.update(func(s *Stats) { s.ControlDropped++ })
		return
	}
	select {
	case u.controls <- payload:
	default:
		u.log.Warn("control queue full; request dropped")
		u.update(func(s *Stats) { s.ControlDropped++ })
	}
}

// serveControls answers queued control requests one at a time. A
// request whose ID was answered before (the hub sends it again until it
// hears back) gets the same answer again without being carried out.
func (u *Uplink) serveControls(ctx context.Context) {
	done := u.memory()
	for {
		select {
		case <-ctx.Done():
			return
		case b := <-u.controls:
			res, again := done.get(ctx, uplink.ControlID(b))
			if !again {
				res = u.control(ctx, b)
				// Every answer is kept, a failure too: a request cut
				// short by Run stopping may have acted before it failed,
				// and the hub hearing "failed" is better than the
				// request acting twice.
				if res.Code != CodeInvalid {
					done.put(ctx, res)
				}
			}
			if err := u.publish(ctx, u.topics.ControlResult(u.opts.Gateway), false, res); err != nil {
				u.log.Warn("control result not delivered", "id", res.ID, "err", err)
			}
			u.update(func(s *Stats) {
				if again {
					s.ControlRepeats++
					return
				}
				s.Controls++
				if !res.OK {
					s.ControlErrors++
				}
			})
		}
	}
}

// memory is where serveControls keeps its answers: the Source when it
// can keep them across restarts, else memory.
func (u *Uplink) memory() answers {
	mem := newAnswered(recentControls)
	if m, ok := u.opts.Source.(ControlMemory); ok {
		return &durableAnswers{m: m, mem: mem, log: u.log}
	}
	return mem
}

// answers remembers control results by request ID.
type answers interface {
	get(ctx context.Context, id string) (uplink.ControlResult, bool)
	put(ctx context.Context, r uplink.ControlResult)
}

// recentControls is how many answers serveControls remembers in memory:
// far more than the hub can have waiting on one gateway.
const recentControls = store.MaxControls

// answered remembers the latest control results by request ID, the
// oldest forgotten first.
type answered struct {
	order []string
	res   map[string]uplink.ControlResult
	max   int
}

func newAnswered(n int) *answered {
	return &answered{res: make(map[string]uplink.ControlResult, n), max: n}
}

func (a *answered) get(_ context.Context, id string) (uplink.ControlResult, bool) {
	if id == "" {
		return uplink.ControlResult{}, false
	}
	r, ok := a.res[id]
	return r, ok
}

func (a *answered) put(_ context.Context, r uplink.ControlResult) {
	if _, ok := a.res[r.ID]; ok || r.ID == "" {
		return
	}
	if len(a.order) == a.max {
		delete(a.res, a.order[0])
		a.order = a.order[1:]
	}
	a.order = append(a.order, r.ID)
	a.res[r.ID] = r
}

// durableAnswers keeps answers in a ControlMemory, and in memory too, so
// that a store that cannot keep one still answers the repeats of this
// run. It is written after the request is carried out: a gateway killed
// between the two carries the request out again when the hub repeats
// it, which is why the agent's controls are idempotent in themselves
// where they can be.
type durableAnswers struct {
	m   ControlMemory
	mem *answered
	log *slog.Logger
}

func (d *durableAnswers) get(ctx context.Context, id string) (uplink.ControlResult, bool) {
	if r, ok := d.mem.get(ctx, id); ok || id == "" {
		return r, ok
	}
	b, ok, err := d.m.RecallControl(ctx, id)
	if err != nil {
		// Carrying a request out again is the lesser harm than leaving
		// the hub without an answer.
		d.log.Warn("control answers unreadable", "id", id, "err", err)
		return uplink.ControlResult{}, false
	}
	var r uplink.ControlResult
	if !ok || json.Unmarshal(b, &r) != nil || r.ID != id {
		return uplink.ControlResult{}, false
	}
	return r, true
}

func (d *durableAnswers) put(ctx context.Context, r uplink.ControlResult) {
	d.mem.put(ctx, r)
	if r.ID == "" {
		return
	}
	b, err := json.Marshal(r)
	if err == nil {
		// The answer is kept even when Run is stopping: it is what a
		// restarted gateway reads.
		err = d.m.RememberControl(context.WithoutCancel(ctx), r.ID, b)
	}
	if err != nil {
		d.log.Warn("control answer not kept", "id", r.ID, "err", err)
	}
}

// control decodes and performs one request. A request that does not
// decode is answered with its id when one can be read.
func (u *Uplink) control(ctx context.Context, b []byte) (res uplink.ControlResult) {
	c, err := uplink.DecodeControl(b)
	if err != nil {
		id := uplink.ControlID(b)
		if id == "" {
			id = "invalid"
		}
		return uplink.ControlResult{ID: id, Error: err.Error(), Code: CodeInvalid}
	}
	if u.opts.Control == nil {
		return uplink.ControlResult{ID: c.ID, Error: "this gateway takes no control requests", Code: CodeUnsupported}
	}
	defer func() {
		if r := recover(); r != nil {
			u.log.Error("control handler panicked", "id", c.ID, "action", c.Action, "panic", r)
			res = uplink.ControlResult{ID: c.ID, Error: fmt.Sprintf("internal error: %v", r), Code: CodeInternal}
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, u.opts.ControlTimeout)
	defer cancel()
	res = u.opts.Control.Control(ctx, c)
	res.ID = c.ID
	return res
}
