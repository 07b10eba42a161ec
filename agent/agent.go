package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sortie-edge/sortie/agent/hubsync"
	"github.com/sortie-edge/sortie/broker"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/mqttc"
	"github.com/sortie-edge/sortie/scenes"
	"github.com/sortie-edge/sortie/store"
)

// httpShutdownGrace is how long the API's requests in flight get to
// finish at shutdown.
const httpShutdownGrace = 3 * time.Second

// HomeStartTimeout bounds the wait for the simulated home's devices to
// connect; they take milliseconds on a working broker, and a home that
// cannot log in (a wrong URL, a certificate it refuses) would otherwise
// hold the start forever. A variable for tests.
var HomeStartTimeout = 20 * time.Second

// Agent is one gateway's agent: the embedded broker (or a link to an
// external one), the mission store, the driver and its step handlers,
// the trigger service, the event feed, the management API and the hub
// sync, started in that order and closed in reverse.
//
// Start it, Run it until its context ends, then Close it to release
// what Start opened. Its methods are safe for concurrent use once Start
// has returned.
type Agent struct {
	opts Options
	log  *slog.Logger

	db     *store.DB
	broker *broker.Broker
	auth   *brokerAuth // the embedded broker's, when it has users
	dev    *devices.Client
	conn   link
	drv    *driver.Driver
	cat    *scenes.Catalog
	reg    *devices.Registry
	home   homeRef        // the simulated home (Options.Home), for tests
	ha     *homeAssistant // nil unless Options.HomeAssistant
	topics agentTopics
	trig   *Triggers
	traces *tracer
	sched  *scheduler
	feed   *feed
	arb    *arbiter
	cfg    *configs // nil unless Options.Bundles

	metrics *instruments
	http    *http.Server
	httpLn  net.Listener
	handler atomic.Pointer[http.Handler] // the stand-in while starting, then the API
	served  chan error                   // Serve's end
	httpWG  sync.WaitGroup
	up      *hubsync.Uplink

	// link is the agent's own connection to an external broker (nil with
	// the embedded one), and waiting what start-up waits for, if
	// anything: both for /readyz.
	link    *mqttc.Client
	waiting atomic.Pointer[func() error]

	closeMu sync.Mutex
	closers []func()
}

// New checks opts and returns an agent that Start will start.
func New(opts Options) (*Agent, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Agent{
		opts: opts, log: opts.Logger, cat: opts.Catalog, reg: opts.Registry,
		topics: newAgentTopics(opts.Broker.Prefix, opts.Gateway),
	}, nil
}

// Close stops and releases everything Start opened, in reverse order.
// It is safe to call more than once, and after a failed Start.
func (a *Agent) Close() {
	a.closeMu.Lock()
	cs := a.closers
	a.closers = nil // closed once, whoever calls first
	a.closeMu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
}

func (a *Agent) onClose(f func()) {
	a.closeMu.Lock()
	a.closers = append(a.closers, f)
	a.closeMu.Unlock()
}

// Start opens and wires every component; it returns once the agent takes
// triggers and its API listens. On error, Close undoes what was done.
func (a *Agent) Start(ctx context.Context) error {
	o, log := a.opts, a.log
	if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
		return fmt.Errorf("data_dir: %w", err)
	}
	var err error
	if o.Bundles != nil {
		// First: a bundle applied before this start is what every part
		// below is built from.
		var lc *liveConfig
		if a.cfg, lc, err = openConfigs(o, log.With("component", "bundles")); err != nil {
			return err
		}
		a.reg, a.cat = lc.set.Registry, lc.set.Catalog
		a.opts.Registry, a.opts.Catalog, a.opts.Location = lc.set.Registry, lc.set.Catalog, lc.loc
		o = a.opts
	}
	a.metrics = newInstruments()
	a.metrics.setBuild(o.Version, o.Revision)
	// With a hub, every event is also written to the outbox in the same
	// transaction as the change it reports.
	sopts := store.Options{Logger: log, Outbox: o.Hub != nil,
		OnCommit: a.metrics.commit, OnCheckpoint: a.metrics.checkpoint, OnPrune: a.metrics.prunedMissions}
	if o.Hub != nil {
		sopts.OutboxMax = o.Hub.OutboxMax
	}
	if a.db, err = store.Open(filepath.Join(o.DataDir, "missions.db"), sopts); err != nil {
		if errors.Is(err, store.ErrLocked) {
			return fmt.Errorf("%w (is another agent running with this data_dir?)", err)
		}
		return err
	}
	a.onClose(func() {
		if err := a.db.Close(); err != nil {
			log.Error("close store", "err", err)
		}
	})
	// Flushed last, before the store closes: the trigger service records
	// the answers it gives while it stops.
	a.traces = newTracer(a.db, log.With("component", "traces"), o.Traces.FlushInterval)
	a.onClose(func() { _ = a.traces.flush() }) // a failure is logged by flush; nothing more to do at close
	if o.HTTP.Listen != "" {
		if err := a.listenHTTP(); err != nil {
			return err
		}
	}

	brokerURL, user, password, tlsCfg := o.Broker.URL, o.Broker.Username, o.Broker.Password, o.Broker.TLS
	if o.Broker.Embedded {
		bopts := broker.Options{Addr: o.Broker.Listen, TLS: o.Broker.ServerTLS, Logger: log.With("component", "broker")}
		if len(o.Broker.Users) > 0 {
			src := "sortie" // the Shelly adapter's default src
			if v, ok := o.Registry.Protocols["shelly"]["src"].(string); ok && v != "" {
				src = v
			}
			auth, internal, err := newBrokerAuth(o.Broker, o.Gateway, src, log.With("component", "broker"))
			if err != nil {
				return err
			}
			// The agent's own TCP clients log in as the agent itself.
			bopts.Auth, user, password = auth.hook, InternalUser, internal
			a.auth = auth
		}
		if a.broker, err = broker.Start(bopts); err != nil {
			return err
		}
		a.onClose(func() { _ = a.broker.Close() }) // its clients are gone by now; nothing left to report
		brokerURL = a.broker.URL()
		// Tests and scripts read this line to find a port chosen with :0.
		log.Info("embedded broker listening", "addr", a.broker.Addr(), "tls", bopts.TLS != nil, "users", len(o.Broker.Users))
	}

	if o.Home != nil {
		if err := a.startHome(ctx, *o.Home, homeConn{broker: brokerURL, user: user, password: password, tls: tlsCfg}); err != nil {
			return err
		}
	}

	a.metrics.watchStore(a.db)
	if a.auth != nil {
		a.metrics.reg.MustRegister(a.auth.refusals)
	}
	a.drv, err = driver.New(driver.Options{
		Store: a.db, Logger: log.With("component", "driver"), Workers: o.Driver.Workers, MaxLive: o.Driver.MaxLive,
		StepTimeout: o.Driver.StepTimeout, StopGrace: o.Driver.StopGrace,
		// The owner is random per process, so a restart sees the leases of
		// the previous run as foreign and records their recovery.
	})
	if err != nil {
		return err
	}
	drv := a.drv
	// The embedded broker is in this process: the agent's own traffic
	// goes to it by function call, with no socket or client in between.
	// Devices and apps still connect to it over TCP.
	var local devices.Local
	if a.broker != nil && !o.OverTCP {
		local = a.broker
	}
	// Devices of other ecosystems do not say what they were before a
	// command: the state read then is kept in data_dir/priors.log, for
	// an undo after a kill (devices.PriorLog).
	var priors *devices.PriorLog
	// (With bundles, a registry swapped in later may bring such devices.)
	if o.Bundles != nil || slices.ContainsFunc(a.reg.Devices, func(d devices.Device) bool { return d.Protocol != "" && d.Protocol != devices.ProtocolSortie }) {
		if priors, err = devices.OpenPriorLog(filepath.Join(o.DataDir, "priors.log"), 0); err != nil {
			return err
		}
		a.onClose(func() { _ = priors.Close() }) // appended without fsync by design: nothing to flush
	}
	a.dev, err = a.dialDevices(ctx, devices.Options{
		Local: local, Broker: brokerURL, ClientID: "sortie-" + o.Gateway + "-devices", Username: user,
		Password: password, TLS: tlsCfg, Prefix: o.Broker.Prefix, AckTimeout: o.Broker.AckTimeout,
		Logger: log, Registry: a.reg, PriorLog: priors,
		// A device coming online or reporting state may unblock the steps
		// waiting on that device (and only those).
		OnChange:     drv.Wake,
		OnAckTimeout: a.metrics.ackTimeout,
	})
	if err != nil {
		return err
	}
	a.onClose(func() { _ = a.dev.Close() }) // a failed goodbye to the broker changes nothing for the next start
	registerHandlers(a)

	var external *mqttc.Client
	if local != nil {
		a.conn = local
	} else {
		// Connected once the trigger subscription is recorded, below: the
		// triggers its session kept while the agent was away arrive right
		// after the broker accepts the connection.
		var will *mqttc.Will
		if o.HomeAssistant != nil {
			// Home Assistant shows the scenes unavailable when the agent
			// is gone, however it went.
			will = &mqttc.Will{Topic: a.topics.base + "/ha/availability", Payload: []byte("offline"), QoS: 1, Retained: true}
		}
		mc, err := newLink(brokerURL, "sortie-"+o.Gateway+"-agent", user, password, tlsCfg, will, log.With("component", "mqtt"))
		if err != nil {
			return err
		}
		a.onClose(mc.Close)
		a.conn, external, a.link = mc, mc, mc
	}
	pub := linkPublisher{a.conn}
	a.trig = newTriggers(log.With("component", "triggers"), a.cat, drv, pub, a.topics, a.metrics)
	a.trig.traces, a.trig.now = a.traces, o.Clock.Now
	if a.sched, err = newScheduler(o, log.With("component", "schedules"), a.trig, a.traces, a.db, drv.Lookup); err != nil {
		return err
	}
	if err := a.sched.start(ctx); err != nil {
		return err
	}
	a.feed = newFeed(log.With("component", "feed"), pub, a.topics, o.Gateway)
	if a.broker != nil {
		a.feed.listened, a.feed.subsAdded = a.broker.Subscribed, a.broker.SubscriptionsAdded
	}
	drv.Observe(a.metrics)
	if a.cfg != nil {
		a.wireConfigs()
		drv.Observe(a.cfg)
	}
	drv.Observe(a.arb)
	drv.Observe(a.trig)
	drv.Observe(a.feed)
	if !o.QuietMissions {
		drv.Observe(logObserver{log: log})
	}
	for _, obs := range o.Observers {
		drv.Observe(obs)
	}
	if o.HomeAssistant != nil {
		a.ha = newHomeAssistant(*o.HomeAssistant, log.With("component", "homeassistant"), a.conn, a.cat, a.topics, o.Gateway,
			func(p []byte) { a.trig.onMessage("", p) }, o.Clock.Now)
		drv.Observe(a.ha)
	}
	active, err := a.db.Active(ctx)
	if err != nil {
		return err
	}
	a.trig.seed(active)
	if err := seedOwners(ctx, a.arb.hs, a.db, active); err != nil {
		return err
	}
	a.metrics.setDeviceTypes(deviceTypes(a.reg))
	a.metrics.watch(drv, a.dev)
	a.metrics.resumed(active)
	if counts, err := terminalCounts(ctx, a.db); err == nil {
		a.metrics.setTerminal(counts)
	}
	if o.Hub != nil {
		if err := a.startUplink(); err != nil {
			return err
		}
	}
	if err := drv.Start(ctx); err != nil {
		return err
	}
	a.onClose(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), o.Driver.StopGrace+time.Second)
		defer cancel()
		if err := drv.Stop(stopCtx); err != nil {
			log.Warn("driver stop", "err", err)
		}
	})
	if len(active) > 0 {
		log.Info("resuming missions from the last run", "count", len(active))
	}
	cancel, err := a.conn.Subscribe(a.topics.Trigger(), a.trig.onMessage)
	if err != nil {
		return fmt.Errorf("subscribe to triggers: %w", err)
	}
	// With an external broker, no UNSUBSCRIBE at Close: the session
	// keeps the subscription, and the triggers sent until the next start.
	if external == nil {
		a.onClose(cancel)
	}
	if external != nil {
		// Last: what the session kept is acked as it is queued for the
		// trigger workers, so no later step may fail and leave it there.
		// A broker that refuses (a subscription, the login) or is not up
		// yet holds the start, with /readyz saying why, and never ends it.
		a.waitFor(func() error { return fmt.Errorf("broker: %w", external.Problem()) })
		if err := external.Connect(ctx); err != nil {
			return err
		}
		a.waitFor(nil)
	}
	if a.ha != nil {
		if err := a.ha.start(); err != nil {
			return err
		}
		a.onClose(a.ha.stop)
	}
	if a.http != nil {
		a.mountHTTP()
	}
	log.Info("agent ready", "gateway", o.Gateway, "version", o.Version, "scenes", strings.Join(a.catalog().Names(), ","), "trigger_topic", a.topics.Trigger())
	return nil
}

// Run runs the agent's loops until ctx ends, then stops them in order
// (stop taking triggers, let in-flight steps finish) and returns; Close
// then releases the rest. It starts the agent first if Start was not
// called.
func (a *Agent) Run(ctx context.Context) error {
	if a.drv == nil {
		if err := a.Start(ctx); err != nil {
			return err
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	// First thing on shutdown: stop taking steps and let those in flight
	// finish, alongside (not after) the HTTP drain and the other loops.
	g.Go(func() error {
		<-gctx.Done()
		stopCtx, cancel := context.WithTimeout(context.Background(), a.opts.Driver.StopGrace+time.Second)
		defer cancel()
		if err := a.drv.Stop(stopCtx); err != nil {
			a.log.Warn("driver stop", "err", err)
		}
		return nil
	})
	g.Go(func() error { return a.trig.Run(gctx) })
	g.Go(func() error { return a.feed.Run(gctx) })
	if a.ha != nil {
		g.Go(func() error { return a.ha.Run(gctx) })
	}
	g.Go(func() error { return a.arb.Run(gctx) })
	if a.cfg != nil {
		g.Go(func() error { return a.cfg.run(gctx) })
	}
	if a.http != nil {
		g.Go(func() error {
			select {
			case err := <-a.served:
				if err != nil {
					return fmt.Errorf("http: %w", err)
				}
			case <-gctx.Done():
			}
			return nil
		})
		g.Go(func() error {
			<-gctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), httpShutdownGrace)
			defer cancel()
			if err := a.http.Shutdown(sctx); err != nil {
				// A request still running, or a client that opened a
				// connection and sent nothing (net/http waits 5s for
				// those): neither should hold the agent's stop or make it
				// fail. What they asked is durable or will be retried.
				a.log.Warn("http: closing connections still open at shutdown", "err", err)
				_ = a.http.Close() // closing is the point; its error says no more than Shutdown's
			}
			return nil
		})
	}
	g.Go(func() error { return a.retention(gctx) })
	g.Go(func() error { return a.traces.run(gctx) })
	g.Go(func() error { return a.sched.run(gctx) })
	if a.up != nil {
		g.Go(func() error { return a.up.Run(gctx) })
	}
	if a.opts.DemoTrigger != "" {
		if err := a.selfTrigger(a.opts.DemoTrigger); err != nil {
			a.log.Error("demo trigger", "err", err)
		}
	}
	err := g.Wait()
	a.log.Info("agent stopping")
	return err
}

// selfTrigger publishes a trigger to our own topic, exercising the same
// path an app would.
func (a *Agent) selfTrigger(scene string) error {
	payload := fmt.Sprintf(`{"scene":%q,"request_id":"demo-%d","source":"demo"}`, scene, time.Now().UnixNano())
	return a.conn.Publish(a.topics.Trigger(), []byte(payload), false, 1)
}

// Addrs are where a started agent can be reached.
type Addrs struct {
	// BrokerURL is the broker devices and apps use (tcp:// or ssl://).
	BrokerURL string
	// BrokerListen is the embedded broker's bound host:port; "" with an
	// external broker.
	BrokerListen string
	// API is the management API's base URL; "" when it is disabled.
	API string
	// TriggerTopic is where apps publish triggers.
	TriggerTopic string
	// Scenes are the scenes that can be triggered.
	Scenes []string
	// BrokerUsers says whether the embedded broker asks for a login.
	BrokerUsers bool
}

// Addrs says where the started agent listens.
func (a *Agent) Addrs() Addrs {
	ad := Addrs{BrokerURL: a.opts.Broker.URL, TriggerTopic: a.topics.Trigger(), Scenes: a.catalog().Names(), BrokerUsers: a.auth != nil}
	if a.broker != nil {
		ad.BrokerURL, ad.BrokerListen = a.broker.URL(), a.broker.Addr()
	}
	if a.httpLn != nil {
		scheme := "http://"
		if a.opts.HTTP.TLS != nil {
			scheme = "https://"
		}
		ad.API = scheme + a.httpLn.Addr().String()
	}
	return ad
}

// Unfinished counts the missions a next start would go on with.
func (a *Agent) Unfinished(ctx context.Context) (int, error) {
	active, err := a.db.Active(ctx)
	return len(active), err
}

// Broker is the embedded broker, for an embedder that adds its own
// hooks or publishes in process; nil with an external broker or before
// Start.
func (a *Agent) Broker() *broker.Broker { return a.broker }

// Driver is the mission driver, for an embedder that submits, controls
// or observes missions directly; nil before Start.
func (a *Agent) Driver() *driver.Driver { return a.drv }

// dialDevices connects the devices client. A broker that is not up yet
// or refuses the connection is tried again, for as long as ctx lasts,
// with the cause logged once and shown in /readyz: a gateway whose
// broker starts after it, or comes back after it, waits instead of
// exiting. Invalid options end the start.
func (a *Agent) dialDevices(ctx context.Context, o devices.Options) (*devices.Client, error) {
	var logged string
	for {
		dev, err := devices.Dial(ctx, o)
		if err == nil || o.Local != nil || errors.Is(err, mqttc.ErrOptions) || ctx.Err() != nil {
			a.waitFor(nil)
			return dev, err
		}
		a.waitFor(func() error { return fmt.Errorf("devices: %w", err) })
		if err.Error() != logged {
			logged = err.Error()
			a.log.Warn("cannot connect to the broker for the devices; retrying until it answers", "err", err)
		}
		// Dial itself retried for its ConnectTimeout: a pause, then again.
		t := time.NewTimer(time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
	}
}

// waitFor records what start-up waits for (nil: nothing), for /readyz.
func (a *Agent) waitFor(why func() error) {
	if why == nil {
		a.waiting.Store(nil)
		return
	}
	a.waiting.Store(&why)
}

// waitingFor says what start-up waits for; nil when nothing.
func (a *Agent) waitingFor() error {
	if f := a.waiting.Load(); f != nil {
		return (*f)()
	}
	return nil
}

// linkProblem says why the link to an external broker is not up; nil
// when it is, or with the embedded broker.
func (a *Agent) linkProblem() error {
	if a.link == nil {
		return nil
	}
	return a.link.Problem()
}
