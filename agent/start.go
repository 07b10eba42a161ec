package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sortie-edge/sortie/broker"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/mqttc"
	"github.com/sortie-edge/sortie/store"
)

// startPhase is one named step of Start. It opens or wires one part and
// registers with onClose how to undo each thing as it does it, so that
// Close undoes a failed start from wherever it stopped.
type startPhase struct {
	name string
	run  func(context.Context, *startup) error
}

// startup is what one phase of Start hands the later ones.
type startup struct {
	// conn is the broker devices and the agent's own clients reach, and
	// the login they use.
	conn homeConn
	// local is the embedded broker reached by function call; nil when
	// the agent's traffic goes over TCP.
	local devices.Local
	// external is the agent's own client of an external broker, which
	// connects last.
	external *mqttc.Client
	// active are the missions the last run left unfinished.
	active []*driver.Mission
}

// PhaseTime is how long one phase of Start took.
type PhaseTime struct {
	Phase string
	Took  time.Duration
}

// phases lists Start's phases in order, leaving out those the options
// turn off.
func (a *Agent) phases() []startPhase {
	o := a.opts
	all := []struct {
		on bool
		startPhase
	}{
		{true, startPhase{"data dir", a.makeDataDir}},
		{o.Bundles != nil, startPhase{"configs", a.openConfigs}},
		{true, startPhase{"store", a.openStore}},
		{o.HTTP.Listen != "", startPhase{"api listener", func(context.Context, *startup) error { return a.listenHTTP() }}},
		{true, startPhase{"broker", a.startBroker}},
		{o.Home != nil, startPhase{"simulated home", func(ctx context.Context, s *startup) error { return a.startHome(ctx, *a.opts.Home, s.conn) }}},
		{true, startPhase{"driver", a.newDriver}},
		{true, startPhase{"devices", a.connectDevices}},
		{true, startPhase{"link", a.openLink}},
		{true, startPhase{"triggers", a.wireTriggers}},
		{true, startPhase{"missions", a.loadMissions}},
		{o.Hub != nil, startPhase{"uplink", func(context.Context, *startup) error { return a.startUplink() }}},
		{true, startPhase{"run driver", a.runDriver}},
		{true, startPhase{"trigger subscription", a.subscribeTriggers}},
		{o.HomeAssistant != nil, startPhase{"home assistant", a.startHomeAssistant}},
		{o.HTTP.Listen != "", startPhase{"api", func(context.Context, *startup) error { a.mountHTTP(); return nil }}},
	}
	var ps []startPhase
	for _, p := range all {
		if p.on {
			ps = append(ps, p.startPhase)
		}
	}
	return ps
}

// Start opens and wires every component, phase by phase (phases lists
// them); it returns once the agent takes triggers and its API listens.
// An error names the phase that failed, and what the phases before it
// opened is closed before Start returns (Close is still safe to call).
// How long each phase took is logged at debug level as it ends, and all
// of them with "agent ready"; StartTimes returns them.
func (a *Agent) Start(ctx context.Context) (err error) {
	defer func() {
		if err != nil {
			a.Close()
		}
	}()
	began := time.Now()
	var s startup
	for _, p := range a.phases() {
		if a.startFault != nil {
			if err := a.startFault(p.name); err != nil {
				return fmt.Errorf("start: %s: %w", p.name, err)
			}
		}
		t0 := time.Now()
		if err := p.run(ctx, &s); err != nil {
			return fmt.Errorf("start: %s: %w", p.name, err)
		}
		took := time.Since(t0)
		a.startTimes = append(a.startTimes, PhaseTime{Phase: p.name, Took: took})
		a.log.Debug("start-up phase done", "phase", p.name, "took", roundTook(took))
	}
	o := a.opts
	a.log.Info("agent ready", "gateway", o.Gateway, "version", o.Version, "scenes", strings.Join(a.catalog().Names(), ","),
		"trigger_topic", a.topics.Trigger(), "took", roundTook(time.Since(began)), slog.Group("phases", a.phaseAttrs()...))
	return nil
}

// StartTimes returns how long each phase of the last Start took, in
// order; the phases the options turn off are not there.
func (a *Agent) StartTimes() []PhaseTime { return slices.Clone(a.startTimes) }

func (a *Agent) phaseAttrs() []any {
	attrs := make([]any, 0, len(a.startTimes))
	for _, p := range a.startTimes {
		attrs = append(attrs, slog.String(p.Phase, roundTook(p.Took)))
	}
	return attrs
}

// roundTook renders a phase's duration for an operator ("5.25ms"): the
// JSON log would otherwise give nanoseconds.
func roundTook(d time.Duration) string { return d.Round(10 * time.Microsecond).String() }

func (a *Agent) makeDataDir(context.Context, *startup) error {
	return os.MkdirAll(a.opts.DataDir, 0o700)
}

// openConfigs comes first: a bundle applied before this start is what
// every later phase is built from.
func (a *Agent) openConfigs(context.Context, *startup) error {
	cfg, lc, err := openConfigs(a.opts, a.log.With("component", "bundles"))
	if err != nil {
		return err
	}
	a.cfg = cfg
	a.reg, a.cat = lc.set.Registry, lc.set.Catalog
	a.opts.Registry, a.opts.Catalog, a.opts.Location = lc.set.Registry, lc.set.Catalog, lc.loc
	return nil
}

// openStore opens the mission store, and the trace recorder on it.
func (a *Agent) openStore(context.Context, *startup) error {
	o, log := a.opts, a.log
	a.metrics = newInstruments()
	a.metrics.setBuild(o.Version, o.Revision)
	// With a hub, every event is also written to the outbox in the same
	// transaction as the change it reports.
	sopts := store.Options{Logger: log, Outbox: o.Hub != nil,
		OnCommit: a.metrics.commit, OnCheckpoint: a.metrics.checkpoint, OnPrune: a.metrics.prunedMissions}
	if o.Hub != nil {
		sopts.OutboxMax = o.Hub.OutboxMax
	}
	db, err := store.Open(filepath.Join(o.DataDir, "missions.db"), sopts)
	if err != nil {
		if errors.Is(err, store.ErrLocked) {
			return fmt.Errorf("%w (is another agent running with this data_dir?)", err)
		}
		return err
	}
	a.db = db
	a.onClose(func() {
		if err := db.Close(); err != nil {
			log.Error("close store", "err", err)
		}
	})
	// Flushed last, before the store closes: the trigger service records
	// the answers it gives while it stops.
	a.traces = newTracer(db, log.With("component", "traces"), o.Traces.FlushInterval)
	a.onClose(func() { _ = a.traces.flush() }) // a failure is logged by flush; nothing more to do at close
	return nil
}

// startBroker starts the embedded broker, if the agent runs one, and
// settles which broker and login the later phases use.
func (a *Agent) startBroker(_ context.Context, s *startup) error {
	o, log := a.opts, a.log
	s.conn = homeConn{broker: o.Broker.URL, user: o.Broker.Username, password: o.Broker.Password, tls: o.Broker.TLS}
	if !o.Broker.Embedded {
		return nil
	}
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
		bopts.Auth, s.conn.user, s.conn.password = auth.hook, InternalUser, internal
		a.auth = auth
	}
	b, err := broker.Start(bopts)
	if err != nil {
		return err
	}
	a.broker = b
	a.onClose(func() { _ = b.Close() }) // its clients are gone by now; nothing left to report
	s.conn.broker = b.URL()
	// The agent's own traffic goes to it by function call, with no
	// socket or client in between; devices and apps still connect to
	// it over TCP.
	if !o.OverTCP {
		s.local = b
	}
	// Tests and scripts read this line to find a port chosen with :0.
	log.Info("embedded broker listening", "addr", b.Addr(), "tls", bopts.TLS != nil, "users", len(o.Broker.Users))
	return nil
}

// newDriver makes the mission driver on the store; it runs from
// runDriver on, once everything it reports to is wired.
func (a *Agent) newDriver(context.Context, *startup) error {
	o := a.opts
	a.metrics.watchStore(a.db)
	if a.auth != nil {
		a.metrics.reg.MustRegister(a.auth.refusals)
	}
	drv, err := driver.New(driver.Options{
		Store: a.db, Logger: a.log.With("component", "driver"), Workers: o.Driver.Workers, MaxLive: o.Driver.MaxLive,
		StepTimeout: o.Driver.StepTimeout, StopGrace: o.Driver.StopGrace,
		// The owner is random per process, so a restart sees the leases of
		// the previous run as foreign and records their recovery.
	})
	if err != nil {
		return err
	}
	a.drv = drv
	return nil
}

// connectDevices connects the devices client (waiting for a broker that
// is not up yet) and registers the step handlers on it.
func (a *Agent) connectDevices(ctx context.Context, s *startup) error {
	o := a.opts
	// Devices of other ecosystems do not say what they were before a
	// command: the state read then is kept in data_dir/priors.log, for
	// an undo after a kill (devices.PriorLog).
	var priors *devices.PriorLog
	// (With bundles, a registry swapped in later may bring such devices.)
	if o.Bundles != nil || slices.ContainsFunc(a.reg.Devices, func(d devices.Device) bool { return d.Protocol != "" && d.Protocol != devices.ProtocolSortie }) {
		var err error
		if priors, err = devices.OpenPriorLog(filepath.Join(o.DataDir, "priors.log"), 0); err != nil {
			return err
		}
		a.onClose(func() { _ = priors.Close() }) // appended without fsync by design: nothing to flush
	}
	dev, err := a.dialDevices(ctx, devices.Options{
		Local: s.local, Broker: s.conn.broker, ClientID: "sortie-" + o.Gateway + "-devices", Username: s.conn.user,
		Password: s.conn.password, TLS: s.conn.tls, Prefix: o.Broker.Prefix, AckTimeout: o.Broker.AckTimeout,
		Logger: a.log, Registry: a.reg, PriorLog: priors,
		// A device coming online or reporting state may unblock the steps
		// waiting on that device (and only those).
		OnChange:     a.drv.Wake,
		OnAckTimeout: a.metrics.ackTimeout,
	})
	if err != nil {
		return err
	}
	a.dev = dev
	a.onClose(func() { _ = dev.Close() }) // a failed goodbye to the broker changes nothing for the next start
	registerHandlers(a)
	return nil
}

// openLink makes the agent's own link for triggers, replies and events:
// the embedded broker itself, or a client of the external one that
// subscribeTriggers connects.
func (a *Agent) openLink(_ context.Context, s *startup) error {
	if s.local != nil {
		a.conn = s.local
		return nil
	}
	o := a.opts
	// Connected once the trigger subscription is recorded: the triggers
	// its session kept while the agent was away arrive right after the
	// broker accepts the connection.
	var will *mqttc.Will
	if o.HomeAssistant != nil {
		// Home Assistant shows the scenes unavailable when the agent is
		// gone, however it went.
		will = &mqttc.Will{Topic: a.topics.base + "/ha/availability", Payload: []byte("offline"), QoS: 1, Retained: true}
	}
	mc, err := newLink(s.conn.broker, "sortie-"+o.Gateway+"-agent", s.conn.user, s.conn.password, s.conn.tls, will, a.log.With("component", "mqtt"))
	if err != nil {
		return err
	}
	a.onClose(mc.Close)
	a.conn, s.external, a.link = mc, mc, mc
	return nil
}

// wireTriggers builds what turns messages and schedules into missions
// and missions into messages (the trigger service, the schedules, the
// event feed, Home Assistant's scenes), and has the driver report to
// them.
func (a *Agent) wireTriggers(ctx context.Context, _ *startup) error {
	o, log, drv := a.opts, a.log, a.drv
	pub := linkPublisher{a.conn}
	a.trig = newTriggers(log.With("component", "triggers"), a.cat, drv, pub, a.topics, a.metrics)
	a.trig.traces, a.trig.now = a.traces, o.Clock.Now
	var err error
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
	return nil
}

// loadMissions reads the missions the last run left unfinished and
// seeds from them what tracks runs (the scenes' modes, the devices'
// owners) and the metrics.
func (a *Agent) loadMissions(ctx context.Context, s *startup) error {
	active, err := a.db.Active(ctx)
	if err != nil {
		return err
	}
	s.active = active
	a.trig.seed(active)
	if err := seedOwners(ctx, a.arb.hs, a.db, active); err != nil {
		return err
	}
	a.metrics.setDeviceTypes(deviceTypes(a.reg))
	a.metrics.watch(a.drv, a.dev)
	a.metrics.resumed(active)
	if counts, err := terminalCounts(ctx, a.db); err == nil {
		a.metrics.setTerminal(counts)
	}
	return nil
}

// runDriver starts the driver's loop, which resumes the unfinished
// missions.
func (a *Agent) runDriver(ctx context.Context, s *startup) error {
	drv := a.drv
	if err := drv.Start(ctx); err != nil {
		return err
	}
	a.onClose(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), a.opts.Driver.StopGrace+time.Second)
		defer cancel()
		if err := drv.Stop(stopCtx); err != nil {
			a.log.Warn("driver stop", "err", err)
		}
	})
	if len(s.active) > 0 {
		a.log.Info("resuming missions from the last run", "count", len(s.active))
	}
	return nil
}

// subscribeTriggers subscribes the link to the trigger topic and, with
// an external broker, connects it: after every phase that builds what a
// trigger needs, since what the session kept is acked as it is queued
// for the trigger workers.
func (a *Agent) subscribeTriggers(ctx context.Context, s *startup) error {
	handle := a.trig.onMessage // the embedded broker dies with the agent: nothing to deliver again
	if s.external != nil {
		handle = a.trig.onMessageDecided
		a.onClose(a.trig.abandon) // before the link's Close, which waits for its handlers
	}
	cancel, err := a.conn.Subscribe(a.topics.Trigger(), handle)
	if err != nil {
		return err
	}
	if s.external == nil {
		a.onClose(cancel)
		return nil
	}
	// With an external broker, no UNSUBSCRIBE at Close: the session keeps
	// the subscription, and the triggers sent until the next start. A
	// broker that refuses (a subscription, the login) or is not up yet
	// holds the start, with /readyz saying why, and never ends it.
	a.waitFor(func() error { return fmt.Errorf("broker: %w", s.external.Problem()) })
	defer a.waitFor(nil)
	return s.external.Connect(ctx)
}

func (a *Agent) startHomeAssistant(context.Context, *startup) error {
	if err := a.ha.start(); err != nil {
		return err
	}
	a.onClose(a.ha.stop)
	return nil
}
