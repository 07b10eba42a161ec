package hub

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sortie-edge/sortie/internal/mqttc"
	"github.com/sortie-edge/sortie/uplink"
)

// ServiceOptions configures a Service.
type ServiceOptions struct {
	// Broker is the MQTT broker URL (tcp://, ssl://, tls://, mqtts://).
	Broker string
	// ClientID is the hub's MQTT client ID; default "sortie-hub".
	ClientID string
	// Username and Password are the hub's identity on the broker.
	Username, Password string
	// TLS configures ssl:// brokers.
	TLS *tls.Config
	// Prefix is the topic prefix; default uplink.DefaultPrefix.
	Prefix string
	// Cluster, when set, is the cluster mode: the gateways are reached
	// through NATS (JetStream), not Broker, and st is shared with other
	// replicas (a PGStore).
	Cluster *ClusterOptions
	// ControlTimeout bounds the wait for a control result; default 10s.
	ControlTimeout time.Duration
	// ControlResend is how often a control request is sent again until
	// its result arrives, to gateways of protocol 2 (which take it at
	// QoS 0 and answer a repeat from memory); default 2s.
	ControlResend time.Duration
	// OfflineAfter is how long a gateway may go unheard (no heartbeat, no
	// batch, no status) before the hub marks it offline (OfflineSilent),
	// whatever its connection seems to be: a broker node that dies
	// publishes no will. Longer than the gateways' heartbeat interval
	// (two or three of them); default 90s.
	OfflineAfter time.Duration
	// Queue is how many inbound messages may wait for the store; when it
	// is full the MQTT client stops reading, pushing back on gateways.
	// Default 4096.
	Queue int
	// Group caps the messages committed in one transaction; default 512.
	Group int
	// Retention, when set, is applied every PruneEvery (default 1h).
	Retention  Retention
	PruneEvery time.Duration
	// Logger receives the service's logs; nil discards them.
	Logger *slog.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Fleet configures the rollout engine, which runs when the store
	// keeps bundles and rollouts (a FleetStore: the bbolt Store; not yet
	// the cluster mode's). Its Send is the service's; Now and Logger
	// default to the service's.
	Fleet FleetOptions
}

// Service is the hub's MQTT side: it ingests what gateways publish,
// acknowledges it once durable, and relays control requests. Start it
// with Run; Control and Watch may be called at any time from any
// goroutine.
type Service struct {
	metrics *hubMetrics
	st      Backing
	opts    ServiceOptions
	log     *slog.Logger
	topics  uplink.Topics
	queue   chan inboundRaw

	// link is the way to the gateways: an MQTT broker, or a NATS
	// cluster (Cluster set).
	link      transport
	readyOnce sync.Once
	ready     chan struct{}

	// pingMu guards the store's last health answer.
	pingMu  sync.Mutex
	pingAt  time.Time
	pingErr error

	ackMu   sync.Mutex
	acks    map[string]pendingAck // by gateway, waiting to be published
	ackWake chan struct{}

	ctlMu   sync.Mutex
	waiters map[string]chan uplink.ControlResult
	// protocols is each gateway's protocol as last stored, for controls
	// sent while the store cannot be read.
	protocols sync.Map

	watchMu  sync.Mutex
	watchers map[*watcher]struct{}

	presence presence
	// fleet is the rollout engine, nil when the store keeps no rollouts.
	fleet *Fleet
	// storeFailed is when the store last failed to take a group (Unix
	// nanoseconds): silence since then may be the hub's own.
	storeFailed atomic.Int64
}

type inboundRaw struct {
	topic   string
	payload []byte
	at      time.Time
	// done, when set, is told whether the message was stored (or,
	// refused as malformed, never will be): the cluster's stream then
	// forgets it, or delivers it again.
	done func(stored bool)
}

func (r inboundRaw) finish(stored bool) {
	if r.done != nil {
		r.done(stored)
	}
}

// transport is how a Service reaches its gateways.
type transport interface {
	// start connects (retrying in the background) and hands every
	// gateway message to deliver, each gateway's in the order sent;
	// ready is called once everything is subscribed.
	start(ctx context.Context, deliver func(inboundRaw), ready func()) error
	// publish sends payload on a gateway topic (an ack, a control
	// request); wait reports when the link has taken it.
	publish(topic string, payload []byte) (wait func(context.Context) error)
	connected() bool
	// problem is what keeps the link from working although connected
	// (NATS refusing a permission the hub needs), or "".
	problem() string
	close()
	// share, when not nil, sends an update to every replica's watchers
	// (their own included, through watch); nil: the service is alone.
	share(u Update) bool
}

// NewService returns a Service over st. It does nothing until Run.
func NewService(st Backing, opts ServiceOptions) *Service {
	if opts.ClientID == "" {
		opts.ClientID = "sortie-hub"
	}
	orDefault(&opts.ControlResend, 2*time.Second)
	orDefault(&opts.ControlTimeout, 10*time.Second)
	orDefault(&opts.Queue, 4096)
	orDefault(&opts.Group, 512)
	orDefault(&opts.PruneEvery, time.Hour)
	orDefault(&opts.OfflineAfter, 90*time.Second)
	if opts.Now == nil {
		opts.Now = time.Now
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s := &Service{
		st: st, opts: opts, log: log,
		topics:   uplink.Topics{Prefix: opts.Prefix},
		queue:    make(chan inboundRaw, opts.Queue),
		ready:    make(chan struct{}),
		acks:     map[string]pendingAck{},
		ackWake:  make(chan struct{}, 1),
		waiters:  map[string]chan uplink.ControlResult{},
		watchers: map[*watcher]struct{}{},
	}
	if opts.Cluster != nil {
		nl := newNATSLink(*opts.Cluster, s.topics, log, opts.Now)
		nl.broadcast, nl.resync = s.broadcast, s.closeWatchers
		s.link = nl
	} else {
		s.link = &mqttLink{opts: opts, topics: s.topics, log: log}
	}
	if fs, ok := st.(FleetStore); ok {
		fo := opts.Fleet
		fo.Send = s.sendControl
		if fo.Now == nil {
			fo.Now = opts.Now
		}
		if fo.Logger == nil {
			fo.Logger = log.With("component", "rollouts")
		}
		s.fleet = NewFleet(fs, fo)
	}
	s.metrics = newHubMetrics(s)
	return s
}

// leader is a store that can say which replica drives the rollouts.
type leader interface {
	Lead(ctx context.Context) (held bool, lost <-chan struct{}, release func(), err error)
}

// leadEvery is how often a cluster replica tries to drive the rollouts.
const leadEvery = 2 * time.Second

// lead runs the rollout engine while this replica holds the lead (a
// PostgreSQL session lock): it loads the state when it takes it, and
// forgets it when it loses it, so that exactly one replica at a time
// offers bundles. A replica that dies frees the lock with its
// connection; another takes over within leadEvery and resumes from the
// store.
func (s *Service) lead(ctx context.Context, l leader) error {
	for {
		held, lost, release, err := l.Lead(ctx)
		if err != nil && ctx.Err() == nil {
			s.log.Warn("rollouts: cannot ask who drives them", "err", err)
		}
		if held {
			s.log.Info("rollouts: this replica drives them")
			lctx, cancel := context.WithCancel(ctx)
			var g errgroup.Group
			g.Go(func() error {
				select {
				case <-lost:
					s.log.Warn("rollouts: lost the lead (its database connection is gone)")
				case <-lctx.Done():
				}
				cancel()
				return nil
			})
			err := s.fleet.Run(lctx)
			cancel()
			_ = g.Wait() // its only error is nil
			release()
			s.fleet.unload()
			if err != nil {
				s.log.Error("rollouts: the engine stopped", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(leadEvery):
		}
	}
}

// Fleet is the rollout engine: bundles, rollouts, drift. It is nil on
// a store that keeps none; in the cluster mode it drives the rollouts
// on one replica at a time (Fleet.Leading).
func (s *Service) Fleet() *Fleet { return s.fleet }

// sendControl publishes a control request without waiting for its
// result (the rollout engine's offers: their results reach the engine
// by their IDs, and an unanswered one is sent again).
func (s *Service) sendControl(gw string, c uplink.Control) error {
	payload, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if !s.link.connected() {
		return ErrNotConnected
	}
	// Not waited for: a lost offer is sent again with the same ID.
	s.link.publish(s.topics.Control(gw), payload)
	return nil
}

// Store returns the service's store.
func (s *Service) Store() Backing { return s.st }

// Ready is closed once the service is connected and subscribed for the
// first time.
func (s *Service) Ready() <-chan struct{} { return s.ready }

// Connected reports whether the link to the gateways is up.
func (s *Service) Connected() bool {
	return s.link != nil && s.link.connected()
}

// Health is what /healthz and /readyz say of a hub process.
type Health struct {
	// Status is ok, broker_unavailable, nats_permission_denied or
	// store_unavailable (Readiness only); cmd/hub answers starting while
	// the service does not run yet.
	Status  string `json:"status"`
	Broker  bool   `json:"broker"`
	Message string `json:"message,omitempty"`
}

// healthWait bounds the store's answer to a health check, and
// healthCache is how long an answer serves the checks after it: probes
// from every load balancer must not become the database's load.
const (
	healthWait  = 2 * time.Second
	healthCache = 2 * time.Second
)

// Health says whether the hub's link to the gateways is up and working:
// what controls need. A load balancer in front of replicas asks this,
// so that controls keep flowing while the database is away.
func (s *Service) Health(context.Context) Health {
	h := Health{Status: "ok", Broker: s.Connected()}
	if s.link != nil {
		if p := s.link.problem(); p != "" {
			h.Status, h.Message = "nats_permission_denied", p
			return h
		}
	}
	if !h.Broker {
		h.Status = "broker_unavailable"
	}
	return h
}

// Readiness is Health and the store answering (when the store can be
// asked: PostgreSQL; a bbolt file in the process always answers): all
// the hub's work, ingest and the API's reads included.
func (s *Service) Readiness(ctx context.Context) Health {
	h := s.Health(ctx)
	if h.Status != "ok" {
		return h
	}
	if err := s.pingStore(ctx); err != nil {
		h.Status, h.Message = "store_unavailable", err.Error()
	}
	return h
}

// pingStore asks the store whether it answers, at most once per
// healthCache; checks meanwhile wait for that answer.
func (s *Service) pingStore(ctx context.Context) error {
	p, ok := s.st.(interface{ Ping(context.Context) error })
	if !ok {
		return nil
	}
	s.pingMu.Lock()
	defer s.pingMu.Unlock()
	if now := time.Now(); now.Sub(s.pingAt) >= healthCache {
		// Not the probe's own context: one that hangs up must not leave
		// "context canceled" as the answer for the next checks.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), healthWait)
		defer cancel()
		s.pingErr, s.pingAt = p.Ping(ctx), now
	}
	return s.pingErr
}

const tokenWait = 10 * time.Second

// Run connects to the broker and ingests until ctx is cancelled. It
// returns nil after a clean stop, or the error that stopped it.
func (s *Service) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if s.link == nil {
		return fmt.Errorf("%w: no broker URL and no cluster", ErrInvalid)
	}
	if s.fleet != nil && s.opts.Cluster == nil {
		// Before anything arrives or the API is ready: a rollout asked
		// for is then one the engine knows.
		if err := s.fleet.Load(ctx); err != nil {
			return err
		}
	}
	if err := s.link.start(ctx, func(r inboundRaw) { s.receive(ctx, r) }, func() { s.readyOnce.Do(func() { close(s.ready) }) }); err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	groups := make(chan []inboundRaw, 1)
	decoded := make(chan decodedGroup, 1)
	g.Go(func() error { return s.groupLoop(gctx, groups) })
	g.Go(func() error { return s.decodeLoop(gctx, groups, decoded) })
	g.Go(func() error { return s.ingestLoop(gctx, decoded) })
	g.Go(func() error { return s.ackLoop(gctx) })
	g.Go(func() error { return s.presenceLoop(gctx) })
	if s.opts.Retention != (Retention{}) {
		g.Go(func() error { return s.pruneLoop(gctx) })
	}
	switch l, ok := s.st.(leader); {
	case s.fleet == nil:
	case s.opts.Cluster == nil:
		g.Go(func() error { return s.fleet.Run(gctx) })
	case ok:
		g.Go(func() error { return s.lead(gctx, l) })
	}
	err := g.Wait()
	cancel() // a receive blocked on a full queue gives up, so close can wait for it
	s.link.close()
	s.closeWatchers()
	return err
}

// mqttLink is the single hub's transport: one MQTT connection to the
// broker (embedded or external).
type mqttLink struct {
	opts   ServiceOptions
	topics uplink.Topics
	log    *slog.Logger
	client atomic.Pointer[mqttc.Client]
}

func (l *mqttLink) start(_ context.Context, deliver func(inboundRaw), ready func()) error {
	if l.opts.Broker == "" {
		return fmt.Errorf("%w: no broker URL", ErrInvalid)
	}
	c, err := mqttc.New(mqttc.Options{
		Broker: l.opts.Broker, ClientID: l.opts.ClientID, Username: l.opts.Username, Password: l.opts.Password,
		TLS: l.opts.TLS, Timeout: tokenWait,
		// Order matters: a gateway's batches are best committed in the
		// order it sent them. The handler only hands messages to the
		// queue, so it blocks only when the store falls behind.
		Ordered: true,
		// The subscriptions are in place when this runs.
		OnConnect: ready,
		Logger:    l.log,
	})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	for _, kind := range []string{"status", "heartbeat", "events", "traces", "control/result", "bundle/status"} {
		if _, err := c.Subscribe(l.topics.Wildcard(kind), func(topic string, payload []byte) {
			deliver(inboundRaw{topic: topic, payload: payload, at: l.opts.Now()})
		}); err != nil {
			return err
		}
	}
	l.client.Store(c)
	// An unreachable broker is retried (and logged) until ctx ends.
	c.Start()
	return nil
}

func (l *mqttLink) publish(topic string, payload []byte) func(context.Context) error {
	c := l.client.Load()
	if c == nil || !c.Connected() {
		return func(context.Context) error { return ErrNotConnected }
	}
	tok := c.PublishAsync(topic, payload, false, 1)
	return func(ctx context.Context) error { return mqttc.Wait(ctx, tok, tokenWait) }
}

func (l *mqttLink) connected() bool {
	c := l.client.Load()
	return c != nil && c.Connected()
}

func (l *mqttLink) problem() string { return "" }

func (l *mqttLink) close() {
	if c := l.client.Load(); c != nil {
		c.Close()
	}
}

func (l *mqttLink) share(Update) bool { return false }

// receive runs on the connection's receive path, in order. Control
// results go straight to their waiter; everything else is queued for the
// store.
func (s *Service) receive(ctx context.Context, raw inboundRaw) {
	gw, kind, ok := gatewayOf(s.topics, raw.topic)
	if !ok {
		raw.finish(true) // never storable
		return
	}
	if kind == "control/result" {
		raw.finish(true)
		r, err := uplink.DecodeControlResult(raw.payload)
		if err != nil {
			s.log.Warn("bad control result", "gateway", gw, "err", err)
			return
		}
		s.ctlMu.Lock()
		ch := s.waiters[r.ID]
		s.ctlMu.Unlock()
		if ch != nil {
			select {
			case ch <- r:
			default: // a duplicate; the first one counts
			}
		} else if s.fleet != nil {
			s.fleet.NoteResult(gw, r)
		}
		return
	}
	if kind == "bundle/status" {
		raw.finish(true)
		st, err := uplink.DecodeBundleStatus(raw.payload)
		if err != nil {
			s.log.Warn("bad bundle status", "gateway", gw, "err", err)
			return
		}
		if s.fleet != nil {
			s.fleet.NoteStatus(gw, st)
		}
		return
	}
	select {
	case s.queue <- raw:
	case <-ctx.Done():
	}
}

// decode turns a queued message into an Inbound, or reports why not.
func (s *Service) decode(r inboundRaw) (Inbound, error) {
	gw, kind, _ := gatewayOf(s.topics, r.topic)
	in := Inbound{Gateway: gw, Received: r.at}
	switch kind {
	case "events":
		b, raws, err := decodeBatch(r.payload)
		if err != nil {
			return in, err
		}
		in.Batch, in.rawEvents = &b, raws
	case "status":
		if len(r.payload) == 0 {
			return in, fmt.Errorf("%w: empty status (retained message cleared)", uplink.ErrMessage)
		}
		st, err := uplink.DecodeStatus(r.payload)
		if err != nil {
			return in, err
		}
		in.Status = &st
	case "heartbeat":
		hb, err := uplink.DecodeHeartbeat(r.payload)
		if err != nil {
			return in, err
		}
		in.Heartbeat = &hb
	case "traces":
		tb, err := uplink.DecodeTraceBatch(r.payload)
		if err != nil {
			return in, err
		}
		in.Traces = &tb
	default:
		return in, fmt.Errorf("%w: unexpected topic kind %q", uplink.ErrMessage, kind)
	}
	return in, nil
}

// groupLoop takes the queued messages in groups of at most Group.
func (s *Service) groupLoop(ctx context.Context, out chan<- []inboundRaw) error {
	for {
		group := make([]inboundRaw, 0, s.opts.Group)
		select {
		case <-ctx.Done():
			return nil
		case r := <-s.queue:
			group = append(group, r)
		}
	drain:
		for len(group) < s.opts.Group {
			select {
			case r := <-s.queue:
				group = append(group, r)
			default:
				break drain
			}
		}
		select {
		case out <- group:
		case <-ctx.Done():
			return nil
		}
	}
}

// decodedGroup is a group of messages decoded, with the ones that will
// be stored (in, in arrival order; from[i] is in[i]'s index in raw) and
// all of them (raw, to finish).
type decodedGroup struct {
	in   []Inbound
	from []int
	raw  []inboundRaw
}

// decodeLoop decodes each group in parallel (JSON decoding is most of
// the CPU cost of ingest) and hands it, still in arrival order, to
// ingestLoop, which meanwhile commits the previous group.
func (s *Service) decodeLoop(ctx context.Context, groups <-chan []inboundRaw, out chan<- decodedGroup) error {
	workers := runtime.GOMAXPROCS(0)
	for {
		var group []inboundRaw
		select {
		case <-ctx.Done():
			return nil
		case group = <-groups:
		}
		decoded := make([]Inbound, len(group))
		errs := make([]error, len(group))
		var wg sync.WaitGroup
		for w := range min(workers, len(group)) {
			wg.Go(func() {
				for i := w; i < len(group); i += workers {
					decoded[i], errs[i] = s.decode(group[i])
				}
			})
		}
		wg.Wait()
		in := decoded[:0]
		var from []int
		for i, m := range decoded {
			if errs[i] != nil {
				s.log.Warn("dropping bad message", "topic", group[i].topic, "err", errs[i])
				group[i].finish(true) // sending it again would not mend it
				group[i].done = nil
				continue
			}
			in = append(in, m)
			from = append(from, i)
		}
		select {
		case out <- decodedGroup{in: in, from: from, raw: group}:
		case <-ctx.Done():
			return nil
		}
	}
}

func (s *Service) ingestLoop(ctx context.Context, groups <-chan decodedGroup) error {
	for {
		var g decodedGroup
		select {
		case <-ctx.Done():
			return nil
		case g = <-groups:
		}
		if len(g.in) == 0 {
			continue
		}
		res, err := s.st.Apply(ctx, g.in)
		if errors.Is(err, ErrInvalid) && len(g.in) > 1 {
			// The store refused the group for what one message holds (a
			// byte PostgreSQL will not take as text): one at a time, so
			// the others are stored and that one alone is dropped,
			// rather than the whole group tried again for ever.
			s.applyEach(ctx, g)
			continue
		}
		// The stream forgets what is stored before the gateways hear of
		// it (report acks them), and delivers again what is not; nothing
		// unstored is acknowledged, so gateways send it again too.
		for _, r := range g.raw {
			r.finish(err == nil || errors.Is(err, ErrInvalid))
		}
		if err != nil {
			s.storeFailed.Store(s.opts.Now().UnixNano())
			s.log.Error("store messages", "messages", len(g.in), "err", err)
			if errors.Is(err, ErrInvalid) {
				s.metrics.rejected.Inc()
			}
			continue
		}
		s.report(res)
	}
}

// applyEach stores a group's messages one by one, dropping those the
// store refuses as invalid.
func (s *Service) applyEach(ctx context.Context, g decodedGroup) {
	for i := range g.raw {
		if !slices.Contains(g.from, i) {
			g.raw[i].finish(true) // refused by the decoder, finished there
		}
	}
	for i, m := range g.in {
		res, err := s.st.Apply(ctx, []Inbound{m})
		raw := g.raw[g.from[i]]
		switch {
		case err == nil:
			raw.finish(true)
			s.report(res)
		case errors.Is(err, ErrInvalid):
			raw.finish(true) // never storable: forget it
			s.metrics.rejected.Inc()
			s.log.Error("dropping a message the store refuses", "topic", raw.topic, "err", err)
		default:
			raw.finish(false)
			s.log.Error("store message", "topic", raw.topic, "err", err)
		}
	}
}

// report acknowledges, logs and broadcasts what a commit changed.
func (s *Service) report(res Result) {
	s.metrics.observe(res, s.opts.Now())
	if len(res.Acks) > 0 || len(res.TraceAcks) > 0 {
		s.ackMu.Lock()
		for gw, oa := range res.Acks {
			a := s.acks[gw].about(oa.Outbox)
			a.upto = max(a.upto, oa.Upto)
			s.acks[gw] = a
		}
		for gw, ta := range res.TraceAcks {
			a, ok := s.acks[gw]
			if ta.Upto > 0 || !ok {
				a = a.about(ta.Outbox)
			}
			// else only an ack to send (every ack says the hub takes
			// records), about whichever store the pending one counts.
			a.traces = max(a.traces, ta.Upto)
			s.acks[gw] = a
		}
		s.ackMu.Unlock()
		select {
		case s.ackWake <- struct{}{}:
		default:
		}
	}
	for _, err := range res.Rejected {
		s.log.Warn("rejected message", "err", err)
	}
	for _, gw := range res.NewOutboxes {
		s.log.Info("gateway sends from another outbox than its cursor counted (its store replaced or restored, or the agent upgraded); the cursor starts again", "gateway", gw)
	}
	if res.Unchained > 0 {
		s.log.Warn("batches from gateways before protocol 2 stored but not acknowledged: the cluster mode acks only chained batches; upgrade those gateways", "batches", res.Unchained)
	}
	for _, g := range res.Gaps {
		switch {
		case g.Compacted:
			s.log.Info("events compacted by gateway", "gateway", g.Gateway, "mission", g.MissionID, "from", g.From, "to", g.To)
		case s.opts.Cluster != nil:
			// Replicas commit one gateway's batches in either order: most
			// such gaps are filled a moment later.
			s.log.Info("gap in mission events (another replica's batch may fill it)", "gateway", g.Gateway, "mission", g.MissionID, "from", g.From, "to", g.To)
		default:
			s.log.Warn("gap in mission events", "gateway", g.Gateway, "mission", g.MissionID, "from", g.From, "to", g.To)
		}
	}
	for i := range res.Gateways {
		s.protocols.Store(res.Gateways[i].ID, res.Gateways[i].Protocol)
		s.announce(Update{Type: "gateway", Gateway: &res.Gateways[i]})
	}
	for i := range res.Missions {
		s.announce(Update{Type: "mission", Mission: &res.Missions[i]})
	}
}

// announce tells every watcher of an update: through the cluster, whose
// replicas all hand it to theirs, or here alone.
func (s *Service) announce(u Update) {
	if !s.link.share(u) {
		s.broadcast(u)
	}
}

// pendingAck is what the next ack to a gateway says: events stored up
// to upto and trigger records up to traces, of the store named outbox.
type pendingAck struct {
	outbox       string
	upto, traces uint64
}

// about returns a for the store named outbox: the counts it holds for
// another store are other seqs and are dropped (a later ack makes up for
// them).
func (a pendingAck) about(outbox string) pendingAck {
	if a.outbox != outbox {
		return pendingAck{outbox: outbox}
	}
	return a
}

// ackLoop publishes acks apart from the ingest loop: the client delivers
// the broker's PUBACKs on the goroutine that a full queue may hold up, so
// waiting for them while ingesting could stall both.
func (s *Service) ackLoop(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.ackWake:
		}
		s.ackMu.Lock()
		acks := s.acks
		s.acks = map[string]pendingAck{}
		s.ackMu.Unlock()
		waits := make(map[string]func(context.Context) error, len(acks))
		for gw, pa := range acks {
			// Every ack carries the trace cursor, 0 when this one moved
			// none: that the hub takes trigger records must reach a
			// gateway that missed the ack of its coming online (QoS 0,
			// maybe sent before it listened), and it hears one at every
			// batch.
			b, _ := json.Marshal(uplink.Ack{Upto: pa.upto, Outbox: &pa.outbox, Traces: &pa.traces})
			waits[gw] = s.link.publish(s.topics.Ack(gw), b)
			s.metrics.acks.Inc()
		}
		for gw, wait := range waits {
			// A lost ack only costs a re-delivery, which is idempotent.
			if err := wait(ctx); err != nil {
				s.log.Warn("publish ack", "gateway", gw, "upto", acks[gw].upto, "err", err)
			}
		}
	}
}

func (s *Service) pruneLoop(ctx context.Context) error {
	t := time.NewTicker(s.opts.PruneEvery)
	defer t.Stop()
	for {
		n, err := s.st.Prune(ctx, s.opts.Now(), s.opts.Retention)
		switch {
		case err != nil:
			s.log.Error("prune finished missions", "err", err)
		case n > 0:
			s.log.Info("pruned finished missions", "removed", n)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Control sends a control request to gateway gw and waits for its
// result, at most ControlTimeout. It fills in c.ID (and, for a
// trigger without one, c.RequestID, so a re-delivered request runs the
// scene once).
func (s *Service) Control(ctx context.Context, gw string, c uplink.Control) (uplink.ControlResult, error) {
	r, err := s.control(ctx, gw, c)
	s.metrics.control(c.Action, r.OK, err)
	return r, err
}

// Refused counts a control request the API turned away (the gateway is
// offline) as Control counts the others.
func (s *Service) Refused(action string, err error) { s.metrics.control(action, false, err) }

// Now is the service's clock.
func (s *Service) Now() time.Time { return s.opts.Now() }

// Metrics is the hub's /metrics (Prometheus text format): fleet
// aggregates, no label per gateway.
func (s *Service) Metrics() http.Handler { return s.metrics.handler }

func (s *Service) control(ctx context.Context, gw string, c uplink.Control) (uplink.ControlResult, error) {
	g, err := s.st.Gateway(ctx, gw)
	switch {
	case errors.Is(err, ErrUnknownGateway):
		return uplink.ControlResult{}, err
	case err != nil:
		// The store is unreachable (a database restarting): that says
		// nothing of the gateway, which answers if it is there. Repeats go
		// only to a gateway last seen speaking protocol 2: an older one
		// would carry out each copy.
		s.log.Warn("gateway presence unknown; sending the control anyway", "gateway", gw, "err", err)
		g = Gateway{ID: gw, State: StateOnline}
		if p, ok := s.protocols.Load(gw); ok {
			g.Protocol = p.(int)
		}
	}
	c.ID = newID()
	if c.Action == uplink.ActionTrigger && c.RequestID == "" {
		c.RequestID = "hub-" + c.ID
	}
	payload, err := json.Marshal(c)
	if err != nil {
		return uplink.ControlResult{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if _, err := uplink.DecodeControl(payload); err != nil {
		return uplink.ControlResult{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if g.State != StateOnline {
		return uplink.ControlResult{}, fmt.Errorf("%w: %s is %s", ErrOffline, gw, g.State)
	}
	if !s.link.connected() {
		return uplink.ControlResult{}, ErrNotConnected
	}
	ch := make(chan uplink.ControlResult, 1)
	s.ctlMu.Lock()
	s.waiters[c.ID] = ch
	s.ctlMu.Unlock()
	defer func() {
		s.ctlMu.Lock()
		delete(s.waiters, c.ID)
		s.ctlMu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(ctx, s.opts.ControlTimeout)
	defer cancel()
	if err := s.link.publish(s.topics.Control(gw), payload)(ctx); err != nil {
		if ctx.Err() != nil {
			err = ErrTimeout
		}
		return uplink.ControlResult{}, fmt.Errorf("publish control: %w", err)
	}
	// An older gateway would carry out a repeat: it gets the request once.
	var resend <-chan time.Time
	if g.Protocol >= 2 {
		t := time.NewTicker(s.opts.ControlResend)
		defer t.Stop()
		resend = t.C
	}
	for {
		select {
		case r := <-ch:
			return r, nil
		case <-resend:
			if s.link.connected() {
				// Not waited for: the next tick or the result decides.
				s.link.publish(s.topics.Control(gw), payload)
				s.metrics.controlResends.Inc()
			}
		case <-ctx.Done():
			return uplink.ControlResult{}, fmt.Errorf("%w: %s %s (id %s)", ErrTimeout, gw, c.Action, c.ID)
		}
	}
}

func newID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}

// Update is a change pushed to watchers: a gateway or a mission record
// after a commit.
type Update struct {
	Type    string   `json:"type"` // "gateway" or "mission"
	Gateway *Gateway `json:"gateway,omitempty"`
	Mission *Mission `json:"mission,omitempty"`
}

type watcher struct {
	ch     chan Update
	closed bool
}

// Watch returns a channel of updates with room for buf of them, and a
// function to stop watching. A watcher that falls buf updates behind is
// dropped: its channel is closed, and it should reload and watch again
// (the dashboard's EventSource does so by itself).
func (s *Service) Watch(buf int) (<-chan Update, func()) {
	w := &watcher{ch: make(chan Update, max(buf, 1))}
	s.watchMu.Lock()
	s.watchers[w] = struct{}{}
	s.watchMu.Unlock()
	return w.ch, func() {
		s.watchMu.Lock()
		defer s.watchMu.Unlock()
		s.dropLocked(w)
	}
}

func (s *Service) dropLocked(w *watcher) {
	delete(s.watchers, w)
	if !w.closed {
		w.closed = true
		close(w.ch)
	}
}

func (s *Service) broadcast(u Update) {
	if u.Gateway != nil {
		s.presence.note(*u.Gateway)
		// Every replica hears every gateway's change here (the cluster's
		// feed): the one driving the rollouts needs them all.
		if s.fleet != nil {
			s.fleet.NoteGateway(*u.Gateway)
		}
	}
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	for w := range s.watchers {
		select {
		case w.ch <- u:
		default:
			s.dropLocked(w)
		}
	}
}

func (s *Service) closeWatchers() {
	s.presence.forget()
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	for w := range s.watchers {
		s.dropLocked(w)
	}
}
