package hub

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sortie-edge/sortie/uplink"
)

// ClusterOptions configure the cluster mode: the gateways connect over
// MQTT to any node of a NATS cluster (MQTT and JetStream enabled on
// every node), their batches land in a replicated stream, and every hub
// replica pulls from one durable consumer into the shared PostgreSQL
// store (PGStore). See docs/cluster.md.
type ClusterOptions struct {
	// NATS lists the servers' client URLs, comma separated
	// (nats://10.0.0.1:4222,nats://10.0.0.2:4222).
	NATS string
	// User and Password are the hub's NATS identity: it publishes acks,
	// controls and the live feed, reads the streams and manages them.
	User, Password string
	TLS            *tls.Config
	// Replicas of the streams: 1, 3 or 5; default 3.
	Replicas int
	// MaxAge and MaxBytes bound the uplink stream, what gateways sent
	// and no replica has stored yet (a hub outage): past them the oldest
	// is dropped, which loses nothing, since a gateway keeps every entry
	// until it is acked and sends it again. Defaults 7 days and 1 GiB.
	MaxAge   time.Duration
	MaxBytes int64
	// AckWait is how long a replica may hold a message before the
	// stream hands it to another: longer than a store transaction takes;
	// default 30s.
	AckWait time.Duration
	// MaxAckPending bounds the messages handed out and not yet
	// acknowledged, across replicas; default 8192.
	MaxAckPending int
	// Fetch is how many messages a replica asks for at a time; default
	// 512.
	Fetch int
}

// Stream and consumer names of the cluster mode.
const (
	streamUplink   = "SORTIE_UPLINK"
	streamPresence = "SORTIE_PRESENCE"
	consumerHub    = "sortie-hub"
)

func (o *ClusterOptions) withDefaults() {
	orDefault(&o.Replicas, 3)
	orDefault(&o.MaxAge, 7*24*time.Hour)
	orDefault(&o.MaxBytes, 1<<30)
	orDefault(&o.AckWait, 30*time.Second)
	orDefault(&o.MaxAckPending, 8192)
	orDefault(&o.Fetch, 512)
}

// orDefault sets *v to d when it is not positive: the options' zero
// value, or a nonsense one, means the default.
func orDefault[T ~int | ~int64](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}

// topicToSubject is the NATS subject an MQTT topic (or filter) arrives
// on: levels joined by ".", a "." inside a level (a gateway ID may have
// one) as "//", as nats-server's MQTT converts it, and the wildcards +
// and # as * and >.
func topicToSubject(topic string) string {
	levels := strings.Split(topic, "/")
	for i, l := range levels {
		switch l {
		case "+":
			levels[i] = "*"
		case "#":
			levels[i] = ">"
		default:
			levels[i] = strings.ReplaceAll(l, ".", "//")
		}
	}
	return strings.Join(levels, ".")
}

// subjectToTopic is topicToSubject undone.
func subjectToTopic(subject string) string {
	tokens := strings.Split(subject, ".")
	for i, t := range tokens {
		tokens[i] = strings.ReplaceAll(t, "//", ".")
	}
	return strings.Join(tokens, "/")
}

// natsLink is a cluster replica's transport.
type natsLink struct {
	opts   ClusterOptions
	topics uplink.Topics
	log    *slog.Logger
	now    func() time.Time
	// id names this replica on the feed.
	id string

	nc        atomic.Pointer[nats.Conn]
	ready     atomic.Bool // streams, consumers and subscriptions in place
	resetting atomic.Bool // a set-up after a lost consumer is running
	// denied is the latest permission NATS refused the hub, and when;
	// violations counts them.
	denied       atomic.Pointer[denial]
	violations   atomic.Uint64
	deniedLogged atomic.Int64 // Unix ns of the last one logged

	// broadcast and resync hand the feed to this replica's watchers.
	broadcast func(Update)
	resync    func()
	feedMu    sync.Mutex
	feedSeq   uint64 // updates published, under feedMu

	mu    sync.Mutex
	peers map[string]peer // by replica ID
	// heard is when this replica began hearing the feed (set up); zero
	// before.
	heard time.Time
	stops []func()

	// subscribe is nc.Subscribe; a test makes it fail half-way through a
	// set-up.
	subscribe func(nc *nats.Conn, subj string, cb nats.MsgHandler) (*nats.Subscription, error)
}

// denial is a permission violation NATS reported. A refused
// subscription is sticky: it is made once, and stays missing until the
// hub restarts.
type denial struct {
	err    string
	at     time.Time
	sticky bool
}

// deniedFor is how long a permission violation keeps a replica
// unhealthy: a violation on acks or controls recurs every few seconds
// while the permission is missing, and a fixed one stops recurring.
const deniedFor = 30 * time.Second

func (l *natsLink) problem() string {
	d := l.denied.Load()
	if d == nil || !d.sticky && l.now().Sub(d.at) > deniedFor {
		return ""
	}
	return d.err + " (the hub's NATS user needs the permissions in docs/cluster.md, Permissions)"
}

// feedMsg is an update on the feed subject: from replica R, its Seq-th;
// without U, a beat that says R's latest Seq, so an update lost at the
// end of a burst is noticed too.
type feedMsg struct {
	R   string  `json:"r"`
	Seq uint64  `json:"seq"`
	U   *Update `json:"u,omitempty"`
}

// feedBeat is how often a replica says its feed's latest seq; a peer
// not heard for feedForget is forgotten (restarted replicas take a new
// ID).
const (
	feedBeat   = 2 * time.Second
	feedForget = time.Minute
)

// peer is what a replica knows of another's feed.
type peer struct {
	seq  uint64
	seen time.Time
}

func newNATSLink(opts ClusterOptions, topics uplink.Topics, log *slog.Logger, now func() time.Time) *natsLink {
	opts.withDefaults()
	b := make([]byte, 6)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return &natsLink{opts: opts, topics: topics, log: log, now: now, id: hex.EncodeToString(b), peers: map[string]peer{},
		subscribe: (*nats.Conn).Subscribe}
}

func (l *natsLink) subject(kind string) string { return topicToSubject(l.topics.Wildcard(kind)) }

func (l *natsLink) feedSubject() string { return hubSubjectRoot(l.topics.Prefix) + ".feed" }

func (l *natsLink) start(ctx context.Context, deliver func(inboundRaw), ready func()) error {
	if l.opts.NATS == "" {
		return fmt.Errorf("%w: cluster mode without NATS URLs", ErrInvalid)
	}
	opts := []nats.Option{
		nats.Name("sortie-hub-" + l.id),
		nats.UserInfo(l.opts.User, l.opts.Password),
		nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond),
		nats.RetryOnFailedConnect(true),
		// Feed messages missed while away, or dropped as too slow: the
		// watchers reload rather than show a page that missed updates.
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if !nc.IsClosed() { // closed: the hub is stopping
				l.log.Warn("lost the connection to NATS; reconnecting", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			l.log.Info("reconnected to NATS", "server", nc.ConnectedUrlRedacted())
			l.gap("reconnected")
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrSlowConsumer) && sub != nil && sub.Subject == l.feedSubject() {
				l.gap("slow consumer")
				return
			}
			if errors.Is(err, nats.ErrPermissionViolation) {
				// A permission the hub needs, refused: acks or controls
				// go nowhere, which nothing else would say. Logged once
				// per deniedFor: a refused ack recurs at ingest rate.
				l.violations.Add(1)
				now := l.now()
				prev := l.denied.Load()
				sticky := strings.Contains(err.Error(), "Subscription") || prev != nil && prev.sticky
				l.denied.Store(&denial{err: err.Error(), at: now, sticky: sticky})
				if last := l.deniedLogged.Load(); last == 0 || now.Sub(time.Unix(0, last)) > deniedFor {
					l.deniedLogged.Store(now.UnixNano())
					l.log.Error("NATS refuses the hub's user a permission it needs; see docs/cluster.md, Permissions", "user", l.opts.User, "err", err)
				}
				return
			}
			l.log.Warn("nats", "err", err)
		}),
	}
	if l.opts.TLS != nil {
		opts = append(opts, nats.Secure(l.opts.TLS))
	}
	nc, err := nats.Connect(l.opts.NATS, opts...)
	if err != nil {
		return fmt.Errorf("connect to nats: %w", err)
	}
	l.nc.Store(nc)
	go l.setup(ctx, nc, deliver, ready)
	go l.beat(ctx)
	return nil
}

// beat says this replica's latest feed seq every feedBeat.
func (l *natsLink) beat(ctx context.Context) {
	t := time.NewTicker(feedBeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		nc := l.nc.Load()
		if nc == nil || !l.ready.Load() {
			continue
		}
		l.feedMu.Lock()
		if b, err := json.Marshal(feedMsg{R: l.id, Seq: l.feedSeq}); err == nil {
			_ = nc.Publish(l.feedSubject(), b) // a lost beat is only late news
		}
		l.feedMu.Unlock()
	}
}

// setup creates the streams and the consumers (idempotent: every
// replica does it) and starts consuming; while the cluster cannot (no
// JetStream leader yet, a node down) it tries again.
func (l *natsLink) setup(ctx context.Context, nc *nats.Conn, deliver func(inboundRaw), ready func()) {
	for attempt := 0; ; attempt++ {
		err := l.trySetup(ctx, nc, deliver)
		if err == nil {
			l.ready.Store(true)
			l.mu.Lock()
			l.heard = time.Now()
			l.mu.Unlock()
			l.log.Info("cluster link ready", "replica", l.id)
			// Updates the other replicas sent before this one heard the
			// feed are missing from its watchers: they reload.
			l.gap("feed subscribed")
			ready()
			return
		}
		if !nc.IsConnected() {
			// The set-up's own error ("connection closed", a deadline)
			// hides why: the connection's last error names it (a wrong
			// password is an "Authorization Violation").
			why := "no server answers"
			if last := nc.LastError(); last != nil {
				why = last.Error()
			}
			err = fmt.Errorf("not connected to NATS at %s (%s): %w", l.opts.NATS, why, err)
		}
		l.log.Warn("cluster set-up failed; retrying", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(min(time.Duration(attempt+1)*250*time.Millisecond, 5*time.Second)):
		}
	}
}

func (l *natsLink) trySetup(ctx context.Context, nc *nats.Conn, deliver func(inboundRaw)) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	// Short: a JetStream API request sent while a leader is being elected
	// may get no answer at all, and the next attempt will.
	sctx, cancel := context.WithTimeout(ctx, 4*time.Second)
	defer cancel()
	o := l.opts
	// Created when missing, left alone when there: an operator may have
	// tuned them, and every replica runs this at each start.
	streams := []jetstream.StreamConfig{{
		Name: streamUplink, Subjects: []string{l.subject("events"), l.subject("traces")},
		Storage: jetstream.FileStorage, Replicas: o.Replicas, Retention: jetstream.LimitsPolicy,
		Discard: jetstream.DiscardOld, MaxAge: o.MaxAge, MaxBytes: o.MaxBytes,
		MaxMsgSize: uplink.MaxMessage + 4096,
	}, {
		// Presence and heartbeats: only the latest of each gateway matters.
		Name: streamPresence, Subjects: []string{l.subject("status"), l.subject("heartbeat")},
		Storage: jetstream.FileStorage, Replicas: o.Replicas, Retention: jetstream.LimitsPolicy,
		Discard: jetstream.DiscardOld, MaxMsgsPerSubject: 1, MaxAge: o.MaxAge,
		MaxMsgSize: uplink.MaxMessage + 4096,
	}}
	for _, sc := range streams {
		_, err := js.Stream(sctx, sc.Name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			_, err = js.CreateStream(sctx, sc)
		}
		if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("stream %s: %w", sc.Name, err)
		}
	}
	l.stopAll()
	var started []func()
	ok := false
	defer func() {
		// A set-up that failed half-way leaves nothing consuming: the
		// next attempt starts afresh.
		if !ok {
			for _, stop := range started {
				stop()
			}
		}
	}()
	for _, stream := range []string{streamUplink, streamPresence} {
		cons, err := js.Consumer(sctx, stream, consumerHub)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			cons, err = js.CreateConsumer(sctx, stream, jetstream.ConsumerConfig{
				Durable: consumerHub, AckPolicy: jetstream.AckExplicitPolicy, AckWait: o.AckWait,
				MaxAckPending: o.MaxAckPending, DeliverPolicy: jetstream.DeliverAllPolicy,
			})
			if errors.Is(err, jetstream.ErrConsumerExists) {
				cons, err = js.Consumer(sctx, stream, consumerHub) // another replica was quicker
			}
		}
		if err != nil {
			return fmt.Errorf("consumer %s/%s: %w", stream, consumerHub, err)
		}
		cc, err := cons.Consume(func(m jetstream.Msg) {
			// When the stream stored it: replicas apply messages out of
			// order, and presence is ordered by this.
			at := l.now()
			if md, err := m.Metadata(); err == nil {
				at = md.Timestamp
			}
			deliver(inboundRaw{topic: subjectToTopic(m.Subject()), payload: m.Data(), at: at, done: func(stored bool) {
				if stored {
					_ = m.Ack() // lost, it is delivered again: a duplicate, stored once
					return
				}
				_ = m.NakWithDelay(time.Second)
			}})
		}, jetstream.PullMaxMessages(o.Fetch), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			// A consumer deleted (by an operator, or lost with its stream)
			// ends this consumption for good: set up again, or nothing
			// would be ingested while /healthz said all is well.
			if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) {
				l.again(ctx, nc, deliver, fmt.Sprintf("consumer %s/%s: %v", stream, consumerHub, err))
			}
		}))
		if err != nil {
			return fmt.Errorf("consume %s: %w", stream, err)
		}
		started = append(started, func() {
			// Stop only asks: wait for the consumption to end, so that the
			// next set-up does not consume beside it (bounded: a
			// connection gone ends it anyway).
			cc.Stop()
			select {
			case <-cc.Closed():
			case <-time.After(5 * time.Second):
			}
		})
	}
	// Control results go to whichever replica waits for them: every
	// replica hears them all. Each subscription joins started as soon as
	// it is made, so a set-up failing at the next one drops it too.
	res, err := l.subscribe(nc, l.subject("control/result"), func(m *nats.Msg) {
		deliver(inboundRaw{topic: subjectToTopic(m.Subject), payload: m.Data, at: l.now()})
	})
	if err != nil {
		return fmt.Errorf("subscribe to control results: %w", err)
	}
	started = append(started, func() { _ = res.Unsubscribe() })
	// Bundle statuses too: the replica that drives the rollouts takes
	// them, the others drop them.
	bst, err := l.subscribe(nc, l.subject("bundle/status"), func(m *nats.Msg) {
		deliver(inboundRaw{topic: subjectToTopic(m.Subject), payload: m.Data, at: l.now()})
	})
	if err != nil {
		return fmt.Errorf("subscribe to bundle statuses: %w", err)
	}
	started = append(started, func() { _ = bst.Unsubscribe() })
	feed, err := l.subscribe(nc, l.feedSubject(), l.onFeed)
	if err != nil {
		return fmt.Errorf("subscribe to the feed: %w", err)
	}
	started = append(started, func() { _ = feed.Unsubscribe() })
	_ = feed.SetPendingLimits(65536, 64<<20) // positive limits on a live subscription: no error
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		return err
	}
	ok = true
	l.mu.Lock()
	l.stops = started
	l.mu.Unlock()
	return nil
}

// again sets the link up anew (at most one at a time), not ready
// meanwhile.
func (l *natsLink) again(ctx context.Context, nc *nats.Conn, deliver func(inboundRaw), why string) {
	if !l.resetting.CompareAndSwap(false, true) {
		return
	}
	l.ready.Store(false)
	l.log.Warn("cluster link lost its consumer; setting up again", "why", why)
	go func() {
		defer l.resetting.Store(false)
		l.setup(ctx, nc, deliver, func() {})
	}()
}

// onFeed hands a replica's update to this replica's watchers; an update
// missing from a replica's sequence makes them reload.
func (l *natsLink) onFeed(m *nats.Msg) {
	var f feedMsg
	if err := json.Unmarshal(m.Data, &f); err != nil {
		l.log.Warn("bad feed message", "err", err)
		return
	}
	now := time.Now()
	l.mu.Lock()
	last, known := l.peers[f.R]
	l.peers[f.R] = peer{seq: f.Seq, seen: now}
	var gone []string
	for id, p := range l.peers {
		if now.Sub(p.seen) > feedForget {
			delete(l.peers, id)
			gone = append(gone, id)
		}
	}
	// A replica is new once this one has heard every live one's beat.
	joined := !known && f.R != l.id && !l.heard.IsZero() && now.Sub(l.heard) > 2*feedBeat
	l.mu.Unlock()
	want := last.seq + 1 // an update follows the last
	if f.U == nil {
		want = last.seq // a beat repeats it
	}
	switch {
	case known && f.Seq != want:
		l.gap(fmt.Sprintf("replica %s: seq %d after %d", f.R, f.Seq, last.seq))
	// A replica killed between its commit and its feed message (or with
	// them in its connection's buffer) leaves no gap in any sequence: it
	// is just never heard again. Its successor, or its silence, says it
	// may have taken updates with it.
	case joined:
		l.gap(fmt.Sprintf("replica %s joined the feed (one that left may have taken updates with it)", f.R))
	case len(gone) > 0:
		l.gap(fmt.Sprintf("replicas %v left the feed (they may have taken updates with them)", gone))
	}
	if f.U != nil && l.broadcast != nil {
		l.broadcast(*f.U)
	}
}

func (l *natsLink) gap(why string) {
	l.log.Info("live feed interrupted; watchers reload", "why", why)
	if l.resync != nil {
		l.resync()
	}
}

func (l *natsLink) publish(topic string, payload []byte) func(context.Context) error {
	nc := l.nc.Load()
	if nc == nil {
		return func(context.Context) error { return ErrNotConnected }
	}
	err := nc.Publish(topicToSubject(topic), payload)
	return func(context.Context) error { return err }
}

func (l *natsLink) connected() bool {
	nc := l.nc.Load()
	return nc != nil && nc.IsConnected() && l.ready.Load()
}

// share publishes u on the feed. It does so even before the set-up is
// done (a consumer may deliver already): an update kept to this replica
// would be missing on the others without their knowing.
func (l *natsLink) share(u Update) bool {
	nc := l.nc.Load()
	if nc == nil {
		return false
	}
	// Numbered and published together, so a beat never reports a seq
	// whose update it overtook on the connection.
	l.feedMu.Lock()
	defer l.feedMu.Unlock()
	l.feedSeq++
	b, err := json.Marshal(feedMsg{R: l.id, Seq: l.feedSeq, U: &u})
	if err != nil {
		return false
	}
	if err := nc.Publish(l.feedSubject(), b); err != nil {
		l.log.Warn("publish to the live feed", "err", err)
		return false
	}
	return true
}

// stopAll ends the consumers and subscriptions of the last set-up.
func (l *natsLink) stopAll() {
	l.mu.Lock()
	stops := l.stops
	l.stops = nil
	l.mu.Unlock()
	for _, stop := range stops {
		stop()
	}
}

func (l *natsLink) close() {
	l.stopAll()
	if nc := l.nc.Load(); nc != nil {
		nc.Close()
	}
}
