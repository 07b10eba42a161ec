package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sortie-edge/sortie/broker"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/scenes"
	"github.com/sortie-edge/sortie/simulator"
	"github.com/sortie-edge/sortie/store"
	"github.com/sortie-edge/sortie/uplink"
)

// runFlags are the command-line overrides of run; set flags win over the
// config file.
type runFlags struct {
	config   string
	trigger  string
	progress bool
	set      map[string]func(*Config, string) error
	values   map[string]string
}

func newRunFlagSet(stderr io.Writer) (*flag.FlagSet, *runFlags) {
	rf := &runFlags{values: map[string]string{}}
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&rf.config, "config", "", "config file (TOML); default: built-in defaults")
	fs.StringVar(&rf.trigger, "trigger", "", "trigger this scene once the agent is up (demo)")
	fs.BoolVar(&rf.progress, "progress", false, "print mission progress to stdout, one line per step, instead of the missions' log lines")
	rf.set = map[string]func(*Config, string) error{
		"gateway":       func(c *Config, v string) error { c.GatewayID = v; return nil },
		"data":          func(c *Config, v string) error { c.DataDir = v; return nil },
		"devices":       func(c *Config, v string) error { c.Devices = v; return nil },
		"scenes":        func(c *Config, v string) error { c.Scenes = v; return nil },
		"broker-listen": func(c *Config, v string) error { c.Broker.Embedded, c.Broker.Listen = true, v; return nil },
		"broker-url":    func(c *Config, v string) error { c.Broker.Embedded, c.Broker.URL = false, v; return nil },
		"http":          func(c *Config, v string) error { c.HTTP.Listen = v; return nil },
		"log-level":     func(c *Config, v string) error { c.Log.Level = v; return nil },
		"log-format":    func(c *Config, v string) error { c.Log.Format = v; return nil },
		"sim":           func(c *Config, v string) error { c.Simulator.Home = v; return nil },
		"hub":           func(c *Config, v string) error { c.Hub.URL = v; return nil },
	}
	help := map[string]string{
		"gateway":       "gateway ID (gateway_id)",
		"data":          "data directory (data_dir)",
		"devices":       "device registry file (devices)",
		"scenes":        "scene directory (scenes)",
		"broker-listen": "run the embedded broker on this address (broker.listen)",
		"broker-url":    "use this external broker instead of the embedded one (broker.url)",
		"http":          "management HTTP address, \"\" to disable (http.listen)",
		"log-level":     "debug, info, warn or error (log.level)",
		"log-format":    "text or json (log.format)",
		"sim":           "run a simulated home from this file (simulator.home)",
		"hub":           "hub broker URL for status sync (hub.url)",
	}
	for name := range rf.set {
		fs.Func(name, help[name], func(v string) error { rf.values[name] = v; return nil })
	}
	return fs, rf
}

// loadRunConfig reads the file, applies flags and validates. Paths given
// as flags are relative to the working directory, not the config file.
func (rf *runFlags) load() (Config, error) {
	cfg, err := LoadConfig(rf.config)
	if err != nil {
		return cfg, err
	}
	for name, v := range rf.values {
		if err := rf.set[name](&cfg, v); err != nil {
			return cfg, err
		}
		switch name {
		case "data", "devices", "scenes", "sim":
			if abs, err := filepath.Abs(v); err == nil && v != "" {
				_ = rf.set[name](&cfg, abs)
			}
		}
	}
	file := rf.config
	if file == "" {
		file = "(defaults)"
	}
	return cfg, cfg.Validate(file)
}

func newLogger(c LogConfig, w io.Writer) *slog.Logger {
	lvl, _ := parseLevel(c.Level)
	opts := &slog.HandlerOptions{Level: lvl}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// gcPercent is the agent's GOGC unless the environment sets one. Its
// live heap is a few MiB, so at Go's default of 100 it collects after
// every few MiB allocated: under load every ~30 ms, each collection
// taking one of a gateway's few cores for ~3 ms, which shows up as
// latency in whatever command is in flight. At 400 it collects a
// quarter as often for a heap goal of ~20 MiB.
const gcPercent = 400

func tuneGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
}

// homeStartTimeout bounds the wait for the simulated home's devices to
// connect; they take milliseconds on a working broker. A variable for
// tests.
var homeStartTimeout = 20 * time.Second

// agent is the running set of components, closed in reverse order.
type agent struct {
	cfg    Config
	log    *slog.Logger
	db     *store.DB
	broker *broker.Broker
	auth   *brokerAuth // the embedded broker's, when it has users
	home   *simulator.Home
	dev    *devices.Client
	conn   link
	// overTCP makes the agent reach its embedded broker over TCP, as it
	// does an external one, instead of in process; benchmarks compare.
	overTCP bool
	drv     *driver.Driver
	cat     *scenes.Catalog
	reg     *devices.Registry
	trig    *triggers
	feed    *feed
	metrics *metrics
	http    *http.Server
	httpLn  net.Listener
	up      *uplink.Uplink
	closers []func()
}

func (a *agent) close() {
	for i := len(a.closers) - 1; i >= 0; i-- {
		a.closers[i]()
	}
	a.closers = nil // closed once, whoever calls first
}

func cmdRun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, rf := newRunFlagSet(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &usageError{msg: err.Error()}
	}
	if fs.NArg() > 0 {
		return &usageError{msg: fmt.Sprintf("run takes no arguments, got %q", fs.Args())}
	}
	cfg, err := rf.load()
	if err != nil {
		return err
	}
	log := newLogger(cfg.Log, stderr)
	a := &agent{cfg: cfg, log: log}
	defer a.close()
	if err := a.start(ctx, rf, stdout); err != nil {
		return err
	}
	if rf.progress {
		a.banner(stdout)
	}
	err = a.serve(ctx, rf)
	if rf.progress {
		// Said once everything is closed: "Stopped." must be true by then.
		bye := a.farewell()
		a.close()
		fmt.Fprintln(stdout, bye)
	}
	return err
}

// farewell is what tells someone watching the progress view that the
// agent has stopped, and what it left for the next start.
func (a *agent) farewell() string {
	active, err := a.db.Active(context.Background())
	if err != nil || len(active) == 0 {
		return "Stopped."
	}
	return fmt.Sprintf("Stopped. %d unfinished mission(s) go on at the next start.", len(active))
}

// start opens and wires every component; on error, close undoes it.
func (a *agent) start(ctx context.Context, rf *runFlags, stdout io.Writer) error {
	cfg, log := a.cfg, a.log
	tuneGC()
	var err error
	if a.reg, err = devices.LoadRegistry(cfg.Path(cfg.Devices)); err != nil {
		return err
	}
	if a.cat, err = scenes.Load(cfg.Path(cfg.Scenes), a.reg); err != nil {
		return err
	}
	dataDir := cfg.Path(cfg.DataDir)
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return fmt.Errorf("data_dir: %w", err)
	}
	// With a hub, every event is also written to the outbox in the same
	// transaction as the change it reports.
	if a.db, err = store.Open(filepath.Join(dataDir, "missions.db"), store.Options{
		Logger: log, Outbox: cfg.Hub.URL != "", OutboxMax: cfg.Hub.OutboxMax,
	}); err != nil {
		if errors.Is(err, store.ErrLocked) {
			return fmt.Errorf("%w (is another agent running with this data_dir?)", err)
		}
		return err
	}
	a.closers = append(a.closers, func() {
		if err := a.db.Close(); err != nil {
			log.Error("close store", "err", err)
		}
	})

	brokerURL := cfg.Broker.URL
	// user and password are the agent's own login for the clients it runs
	// over TCP: the external broker's, or the internal one of the
	// embedded broker when it has users.
	user := cfg.Broker.Username
	password, err := cfg.Broker.password(cfg)
	if err != nil {
		return err
	}
	tlsCfg, err := cfg.Broker.tlsConfig(cfg)
	if err != nil {
		return err
	}
	if cfg.Broker.Embedded {
		opts := broker.Options{Addr: cfg.Broker.Listen}
		// The agent's own TCP clients trust its certificate alone.
		if opts.TLS, tlsCfg, err = cfg.Broker.serverTLS(cfg); err != nil {
			return err
		}
		if len(cfg.Broker.Users) > 0 {
			if err := checkDeviceUsers(cfg.Broker, a.reg); err != nil {
				return err
			}
			auth, internal, err := newBrokerAuth(cfg.Broker, cfg.GatewayID, log.With("component", "broker"))
			if err != nil {
				return err
			}
			opts.Auth, user, password = auth.hook, internalUser, internal
			a.auth = auth
		}
		if a.broker, err = broker.Start(opts); err != nil {
			return err
		}
		a.closers = append(a.closers, func() { _ = a.broker.Close() })
		brokerURL = a.broker.URL()
		// Tests and scripts read this line to find a port chosen with :0.
		log.Info("embedded broker listening", "addr", a.broker.Addr(), "tls", opts.TLS != nil, "users", len(cfg.Broker.Users))
	}
	for _, w := range exposureWarnings(cfg) {
		log.Warn(w)
	}

	if cfg.Simulator.Home != "" {
		hc, err := simulator.LoadHome(cfg.Path(cfg.Simulator.Home))
		if err != nil {
			return err
		}
		hc.Broker = brokerURL
		hc.Username, hc.Password, hc.TLS = user, password, tlsCfg
		hc.Prefix = cfg.Broker.Prefix
		hc.Logger = log.With("component", "simulator")
		if a.home, err = simulator.NewHome(hc); err != nil {
			return err
		}
		// Bounded: a home that cannot log in (a wrong broker URL, a
		// certificate it refuses) would otherwise hold the start forever.
		sctx, cancel := context.WithTimeoutCause(ctx, homeStartTimeout, fmt.Errorf("not online within %s", homeStartTimeout))
		err = a.home.Start(sctx)
		cancel()
		if err != nil {
			return fmt.Errorf("simulated home: %w", err)
		}
		a.closers = append(a.closers, func() { _ = a.home.Close() })
		log.Info("simulated home running", "devices", len(a.home.Devices()))
	}

	a.metrics = newMetrics()
	if a.auth != nil {
		a.metrics.reg.MustRegister(a.auth.refusals)
	}
	a.drv, err = driver.New(driver.Options{
		Store: a.db, Logger: log.With("component", "driver"), Workers: cfg.Driver.Workers,
		StepTimeout: cfg.Driver.StepTimeout.D(), StopGrace: cfg.Driver.StopGrace.D(),
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
	if a.broker != nil && !a.overTCP {
		local = a.broker
	}
	a.dev, err = devices.Dial(ctx, devices.Options{
		Local: local, Broker: brokerURL, ClientID: "sortie-" + cfg.GatewayID + "-devices", Username: user,
		Password: password, TLS: tlsCfg, Prefix: cfg.Broker.Prefix, AckTimeout: cfg.Broker.AckTimeout.D(),
		Logger: log,
		// A device coming online or reporting state may unblock the steps
		// waiting on that device (and only those).
		OnChange: drv.Wake,
	})
	if err != nil {
		return err
	}
	a.closers = append(a.closers, func() { _ = a.dev.Close() })
	registerHandlers(a)

	topics := newAgentTopics(cfg.Broker.Prefix, cfg.GatewayID)
	if local != nil {
		a.conn = &localLink{b: local}
	} else if a.conn, err = dialConn(ctx, connOptions{
		URL: brokerURL, ClientID: "sortie-" + cfg.GatewayID + "-agent", Username: user,
		Password: password, TLS: tlsCfg, Log: log.With("component", "mqtt"),
	}); err != nil {
		return err
	}
	a.closers = append(a.closers, a.conn.Close)
	a.trig = newTriggers(log.With("component", "triggers"), a.cat, drv, a.conn, topics, cfg.GatewayID, a.metrics)
	a.feed = newFeed(log.With("component", "feed"), a.conn, topics, cfg.GatewayID)
	if a.broker != nil {
		a.feed.listened, a.feed.subsAdded = a.broker.Subscribed, a.broker.SubscriptionsAdded
	}
	drv.Observe(a.metrics)
	drv.Observe(a.trig)
	drv.Observe(a.feed)
	if rf.progress {
		// The progress lines say what the mission log lines would, in the
		// same terminal: one of the two is enough.
		drv.Observe(newProgress(stdout))
	} else {
		drv.Observe(logObserver{log: log})
	}
	active, err := a.db.Active(ctx)
	if err != nil {
		return err
	}
	a.trig.seed(active)
	a.metrics.setDeviceTypes(deviceTypes(a.reg))
	a.metrics.watch(drv, a.dev, func() (int, error) { s, err := a.db.Stats(); return s.Missions, err })
	if counts, err := terminalCounts(ctx, a.db); err == nil {
		a.metrics.setTerminal(counts)
	}
	if cfg.Hub.URL != "" {
		if err := a.startUplink(); err != nil {
			return err
		}
	}
	if err := drv.Start(ctx); err != nil {
		return err
	}
	a.closers = append(a.closers, func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), cfg.Driver.StopGrace.D()+time.Second)
		defer cancel()
		if err := drv.Stop(stopCtx); err != nil {
			log.Warn("driver stop", "err", err)
		}
	})
	if len(active) > 0 {
		log.Info("resuming missions from the last run", "count", len(active))
	}
	if err := a.conn.Subscribe(topics.Trigger(), a.trig.onMessage); err != nil {
		return err
	}
	if cfg.HTTP.Listen != "" {
		if err := a.startHTTP(); err != nil {
			return err
		}
	}
	log.Info("agent ready", "gateway", cfg.GatewayID, "version", Version, "scenes", strings.Join(a.cat.Names(), ","), "trigger_topic", topics.Trigger())
	return nil
}

// serve runs the long-lived loops until ctx ends, then shuts down in
// order: stop taking triggers, let in-flight steps finish, close.
func (a *agent) serve(ctx context.Context, rf *runFlags) error {
	g, gctx := errgroup.WithContext(ctx)
	// First thing on shutdown: stop taking steps and let those in flight
	// finish, alongside (not after) the HTTP drain and the other loops.
	g.Go(func() error {
		<-gctx.Done()
		stopCtx, cancel := context.WithTimeout(context.Background(), a.cfg.Driver.StopGrace.D()+time.Second)
		defer cancel()
		if err := a.drv.Stop(stopCtx); err != nil {
			a.log.Warn("driver stop", "err", err)
		}
		return nil
	})
	g.Go(func() error { return a.trig.Run(gctx) })
	g.Go(func() error { return a.feed.Run(gctx) })
	if a.http != nil {
		g.Go(func() error {
			if err := a.http.Serve(a.httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("http: %w", err)
			}
			return nil
		})
		g.Go(func() error {
			<-gctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return a.http.Shutdown(sctx)
		})
	}
	g.Go(func() error { return a.retention(gctx) })
	if a.up != nil {
		g.Go(func() error { return a.up.Run(gctx) })
	}
	if rf.trigger != "" {
		if err := a.selfTrigger(rf.trigger); err != nil {
			a.log.Error("demo trigger", "err", err)
		}
	}
	err := g.Wait()
	a.log.Info("agent stopping")
	return err
}

// selfTrigger publishes a trigger to our own topic, exercising the same
// path an app would.
func (a *agent) selfTrigger(scene string) error {
	payload := fmt.Sprintf(`{"scene":%q,"request_id":"demo-%d","source":"demo"}`, scene, time.Now().UnixNano())
	return a.conn.Publish(newAgentTopics(a.cfg.Broker.Prefix, a.cfg.GatewayID).Trigger(), 1, false, []byte(payload))
}

// terminalCounts counts finished missions by state, for the gauge.
func terminalCounts(ctx context.Context, db *store.DB) (map[driver.State]int, error) {
	counts := map[driver.State]int{}
	f := driver.Filter{States: []driver.State{driver.StateSucceeded, driver.StateFailed, driver.StateCancelled}, Limit: 1000}
	for {
		ms, next, err := db.List(ctx, f)
		if err != nil {
			return nil, err
		}
		for _, m := range ms {
			counts[m.State]++
		}
		if next == "" {
			return counts, nil
		}
		f.After = next
	}
}

// logObserver writes one structured log line per meaningful transition,
// with mission and trace IDs, so logs can be joined with the hub and
// device logs.
type logObserver struct{ log *slog.Logger }

func (o logObserver) Observe(ev driver.Event, m *driver.Mission) {
	lvl, msg := slog.LevelDebug, "transition"
	switch {
	case ev.Input == driver.InStepWait:
		// Waiting is normal (a delay step, an offline device); say so
		// quietly.
		lvl, msg = slog.LevelInfo, "step waiting"
		if ev.Code == scenes.DelayCode {
			lvl = slog.LevelDebug
		}
	case ev.Input == driver.InStepError:
		lvl, msg = slog.LevelWarn, "step failed"
	case ev.To.Terminal():
		lvl, msg = slog.LevelInfo, "mission finished"
		if ev.To != driver.StateSucceeded {
			lvl = slog.LevelWarn
		}
	case ev.Input == driver.InCompResult && ev.Error != "":
		lvl, msg = slog.LevelWarn, "compensation attempt failed"
	}
	// Checked before the record is built: this runs for every transition,
	// and building the record costs more than the rest of the observer.
	if !o.log.Enabled(context.Background(), lvl) {
		return
	}
	args := []any{"mission", m.ID, "trace", m.Meta.TraceID, "scene", m.Type}
	switch msg {
	case "step waiting":
		args = append(args, "step", ev.StepID, "code", ev.Code, "reason", ev.Error)
	case "step failed":
		args = append(args, "step", ev.StepID, "attempt", ev.Attempt, "class", ev.Detail, "code", ev.Code, "err", ev.Error)
	case "mission finished":
		args = append(args, "state", ev.To, "reason", m.Reason, "err", m.Error)
	case "compensation attempt failed":
		args = append(args, "step", ev.StepID, "err", ev.Error)
	default:
		args = append(args, "input", ev.Input, "from", ev.From, "to", ev.To, "step", ev.StepID, "attempt", ev.Attempt)
	}
	o.log.Log(context.Background(), lvl, msg, args...)
}

// deviceTypes maps device IDs to their types, for metric labels.
func deviceTypes(reg *devices.Registry) map[string]string {
	out := make(map[string]string, len(reg.Devices))
	for _, d := range reg.Devices {
		out[d.ID] = d.Type
	}
	return out
}

// banner tells someone watching the progress view what is running and
// how to drive it.
func (a *agent) banner(w io.Writer) {
	broker := a.cfg.Broker.URL
	host, port := "BROKER", ""
	if a.broker != nil {
		broker = a.broker.URL()
		host, port, _ = net.SplitHostPort(a.broker.Addr())
		if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
			host = "127.0.0.1" // listening everywhere, this host included
		}
	}
	api := "(disabled)"
	if a.httpLn != nil {
		scheme := "http://"
		if a.cfg.HTTP.CertFile != "" {
			scheme = "https://"
		}
		api = scheme + a.httpLn.Addr().String()
	}
	topics := newAgentTopics(a.cfg.Broker.Prefix, a.cfg.GatewayID)
	fmt.Fprintf(w, "Sortie agent %q ready. Broker %s, API %s.\nScenes: %s.\n", a.cfg.GatewayID, broker, api, strings.Join(a.cat.Names(), ", "))
	fmt.Fprintf(w, "Trigger one from another terminal:\n  ./bin/agent trigger movie_night\n")
	flags := ""
	if port != "" && port != "1883" {
		flags += " -p " + port
	}
	if a.cfg.Broker.Embedded && a.cfg.Broker.ServerCertFile != "" {
		flags += " --cafile CA.pem"
	}
	if a.auth != nil {
		flags += " -u APP_USER -P PASSWORD"
	}
	fmt.Fprintf(w, "  mosquitto_pub -h %s%s -q 1 -t %s -m '{\"scene\":\"good_night\",\"request_id\":\"night-%d\"}'\n", host, flags, topics.Trigger(), time.Now().Unix())
	fmt.Fprintf(w, "Ctrl-C stops (in-flight steps finish first).\n\n")
}
