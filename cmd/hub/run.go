package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sortie-edge/sortie/broker"
	"github.com/sortie-edge/sortie/hub"
	"github.com/sortie-edge/sortie/internal/cli"
	"github.com/sortie-edge/sortie/internal/conf"
	"github.com/sortie-edge/sortie/internal/httpjson"
)

// onListening, when set (by tests), learns the bound addresses.
var onListening func(httpAddr, brokerAddr string)

// cmdRun runs the hub until ctx is cancelled.
func cmdRun(ctx context.Context, e *cli.Env, args []string) error {
	stderr := e.Stderr
	fs := e.FlagSet()
	path := fs.String("config", "configs/hub.toml", "configuration file")
	dataDir := fs.String("data-dir", "", "override data_dir")
	httpAddr := fs.String("http", "", "override http.listen")
	brokerListen := fs.String("broker-listen", "", "override broker.listen (embedded broker)")
	brokerURL := fs.String("broker-url", "", "use this external broker instead of the embedded one")
	logLevel := fs.String("log-level", "", "override log.level")
	logFormat := fs.String("log-format", "", "override log.format")
	if err := noArgs(fs, args, "run"); err != nil {
		return err
	}
	cfg, err := LoadConfig(*path)
	if err != nil {
		return err
	}
	// Flags override the file.
	var unused []string
	fs.Visit(func(f *flag.Flag) {
		if cfg.Cluster.Enabled && slices.Contains([]string{"data-dir", "broker-listen", "broker-url"}, f.Name) {
			unused = append(unused, "-"+f.Name)
		}
		switch f.Name {
		case "data-dir":
			cfg.DataDir = *dataDir
		case "http":
			cfg.HTTP.Listen = *httpAddr
		case "broker-listen":
			cfg.Broker.Listen = *brokerListen
		case "broker-url":
			cfg.Broker.URL, cfg.Broker.Embedded = *brokerURL, false
		case "log-level":
			cfg.Log.Level = *logLevel
		case "log-format":
			cfg.Log.Format = *logFormat
		}
	})
	if len(unused) > 0 {
		return &usageError{Msg: fmt.Sprintf("%s: not used in the cluster mode ([cluster] enabled in %s), where gateways connect to NATS and the store is PostgreSQL", strings.Join(unused, ", "), *path)}
	}
	if err := cfg.Validate(*path); err != nil {
		return err
	}
	log := newLogger(cfg.Log, stderr)
	return serve(ctx, cfg, log)
}

func newLogger(c LogConfig, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(c.Level)) // checked by Validate
	opts := &slog.HandlerOptions{Level: level}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// serve starts the HTTP server, then has runHub open the store and the
// broker (or the cluster link) and run the service, until ctx is
// cancelled or one fails. It closes what runHub opened after the HTTP
// server has drained; their close errors join what it returns: a store
// that failed to close may not have kept the last ingest.
func serve(ctx context.Context, cfg Config, log *slog.Logger) (rerr error) {
	token, err := cfg.token()
	if err != nil {
		return err
	}
	// HTTP first: while the store is awaited (PostgreSQL starting), a
	// load balancer's /healthz gets a 503 that says why, not a refused
	// connection.
	ln, err := net.Listen("tcp", cfg.HTTP.Listen)
	if err != nil {
		return fmt.Errorf("http listen: %w", err)
	}
	front := &starting{token: token}
	srv := &http.Server{Handler: front, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	log.Info("http listening", "addr", ln.Addr().String(), "dashboard", "http://"+ln.Addr().String()+"/")
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("http: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			return fmt.Errorf("http shutdown: %w", err)
		}
		return nil
	})
	// The store and the broker close after the HTTP server has drained:
	// a request in flight must not find them gone.
	var closers []func() error
	keep := func(c func() error) { closers = append(closers, c) }
	err = runHub(gctx, cfg, log, token, front, srv, ln.Addr().String(), keep)
	cancel()
	if werr := g.Wait(); err == nil {
		err = werr
	}
	for i := len(closers) - 1; i >= 0; i-- {
		err = errors.Join(err, closers[i]())
	}
	log.Info("hub stopped", "err", err)
	return err
}

// runHub opens the store, starts the broker or the cluster link, and runs
// the service until ctx ends, front serving the API once it is ready.
// What it opens it hands to keep, for serve to close.
func runHub(ctx context.Context, cfg Config, log *slog.Logger, token string, front *starting, srv *http.Server, httpAddr string, keep func(func() error)) error {
	var st hub.Backing
	var err error
	if cfg.Cluster.Enabled {
		st, err = openPG(ctx, cfg, log, front)
	} else {
		st, err = hub.Open(filepath.Join(cfg.path(cfg.DataDir), "hub.db"), hub.Options{Logger: log})
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while waiting: not an error
		}
		return err
	}
	keep(st.Close)
	// In the cluster mode gateways log in to NATS: [gateways] (the
	// embedded broker's credentials) names none.
	ids := make([]string, 0, len(cfg.Gateways))
	for id := range cfg.Gateways {
		if !cfg.Cluster.Enabled {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	if err := st.Register(ctx, time.Now(), ids...); err != nil {
		return err
	}
	sopts := hub.ServiceOptions{
		ClientID: cfg.Identity.ClientID, Username: cfg.Identity.Username, Prefix: cfg.Prefix,
		ControlTimeout: cfg.HTTP.ControlTimeout.D(), ControlResend: cfg.HTTP.ControlResend.D(),
		Retention:    hub.Retention{MaxAge: cfg.Retention.MaxAge.D(), MaxCount: cfg.Retention.MaxCount},
		PruneEvery:   cfg.Retention.Interval.D(),
		Fleet:        hub.FleetOptions{KeepRollouts: cfg.Retention.RolloutsMaxAge.D(), KeepRolloutsPerGroup: cfg.Retention.RolloutsPerGroup},
		OfflineAfter: cfg.Presence.OfflineAfter.D(),
		Logger:       log.With("component", "service"),
	}
	if sopts.Password, err = cfg.secret(cfg.Identity.Password, cfg.Identity.PasswordFile); err != nil {
		return fmt.Errorf("identity.password_file: %w", err)
	}
	brokerAddr := ""
	switch {
	case cfg.Cluster.Enabled:
		if sopts.Cluster, err = clusterOptions(cfg); err != nil {
			return err
		}
		log.Info("cluster mode", "nats", cfg.Cluster.NATS, "stream_replicas", cfg.Cluster.Replicas)
	case cfg.Broker.Embedded:
		if sopts.Password == "" {
			// Only this process uses the hub identity of its own broker.
			b := make([]byte, 24)
			_, _ = rand.Read(b)
			sopts.Password = hex.EncodeToString(b)
		}
		broker, url, clientTLS, err := startBroker(cfg, sopts.Password, log)
		if err != nil {
			return err
		}
		keep(broker.Close)
		brokerAddr = broker.Addr()
		sopts.Broker, sopts.TLS = url, clientTLS
		log.Info("embedded broker listening", "addr", brokerAddr, "tls", clientTLS != nil, "gateways", len(ids))
	default:
		sopts.Broker = cfg.Broker.URL
		if sopts.TLS, err = cfg.clientTLS(); err != nil {
			return err
		}
		log.Info("using external broker", "url", cfg.Broker.URL)
	}
	svc := hub.NewService(st, sopts)
	api := hub.NewAPI(svc, hub.APIOptions{Token: token, Logger: log.With("component", "api")})
	srv.RegisterOnShutdown(api.Close)
	front.ready(api)
	if onListening != nil {
		onListening(httpAddr, brokerAddr)
	}
	return svc.Run(ctx)
}

// starting is the HTTP handler while the hub starts: 503 to everything,
// saying what it waits for, until ready hands it the API.
type starting struct {
	token   string // the API's: only a request with it gets the error
	api     atomic.Pointer[hub.API]
	waiting atomic.Pointer[string]
}

func (s *starting) ready(api *hub.API) { s.api.Store(api) }

func (s *starting) wait(why string) { s.waiting.Store(&why) }

func (s *starting) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if api := s.api.Load(); api != nil {
		api.ServeHTTP(w, r)
		return
	}
	status, msg := "starting", "starting"
	if why := s.waiting.Load(); why != nil {
		msg = "waiting for the store"
		if hub.Authorized(r, s.token) {
			msg = *why // it names hosts and users
		}
		if r.URL.Path == "/readyz" {
			status = "store_unavailable" // /healthz leaves the store out
		}
	}
	w.Header().Set("Retry-After", "1")
	if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" {
		httpjson.Write(w, http.StatusServiceUnavailable, hub.Health{Status: status, Message: msg}, false)
		return
	}
	httpjson.WriteError(w, http.StatusServiceUnavailable, "starting", "the hub is starting: "+msg, false)
}

// openPG opens the cluster's shared store.
func openPG(ctx context.Context, cfg Config, log *slog.Logger, front *starting) (*hub.PGStore, error) {
	dsn, err := cfg.secret(cfg.Cluster.Postgres, cfg.Cluster.PostgresFile)
	if err != nil {
		return nil, fmt.Errorf("cluster.postgres_file: %w", err)
	}
	// A database that cannot be reached yet (starting, restarting, a
	// network down) is waited for, as NATS is, backing off to 10 s; one
	// that refuses the hub (a wrong password, no such database) is an
	// error at once: waiting would not mend it.
	for attempt := 1; ; attempt++ {
		octx, cancel := context.WithTimeout(ctx, 10*time.Second)
		st, err := hub.OpenPG(octx, dsn)
		cancel()
		if err == nil || !errors.Is(err, hub.ErrStoreUnavailable) || ctx.Err() != nil {
			return st, err
		}
		log.Warn("waiting for PostgreSQL", "attempt", attempt, "err", err)
		front.wait("waiting for PostgreSQL: " + err.Error())
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(min(time.Duration(attempt)*time.Second, 10*time.Second)):
		}
	}
}

// clusterOptions is the replica's link to NATS.
func clusterOptions(cfg Config) (*hub.ClusterOptions, error) {
	c := cfg.Cluster
	pw, err := cfg.secret(c.NATSPassword, c.NATSPasswordFile)
	if err != nil {
		return nil, fmt.Errorf("cluster.nats_password_file: %w", err)
	}
	o := &hub.ClusterOptions{
		NATS: c.NATS, User: c.NATSUser, Password: pw, Replicas: c.Replicas,
		MaxAge: c.MaxAge.D(), MaxBytes: c.MaxBytes, AckWait: c.AckWait.D(),
		MaxAckPending: c.MaxAckPending, Fetch: c.Fetch,
	}
	if c.NATSCAFile != "" {
		if o.TLS, err = conf.ClientTLS(cfg.path(c.NATSCAFile), "", "", false); err != nil {
			return nil, fmt.Errorf("cluster.nats_ca_file: %w", err)
		}
	}
	return o, nil
}

// startBroker starts the embedded broker with the hub's ACL, and returns
// the URL and TLS settings the hub's own client uses to reach it.
func startBroker(cfg Config, hubPassword string, log *slog.Logger) (*broker.Broker, string, *tls.Config, error) {
	auth, err := hub.NewAuth(hub.AuthOptions{
		Prefix: cfg.Prefix, HubUser: cfg.Identity.Username, HubPassword: hubPassword,
		HubClientID: cfg.Identity.ClientID, Gateways: cfg.Gateways, Logger: log.With("component", "broker"),
	})
	if err != nil {
		return nil, "", nil, err
	}
	serverTLS, clientTLS, err := cfg.serverTLS()
	if err != nil {
		return nil, "", nil, err
	}
	b, err := broker.Start(broker.Options{
		Addr: cfg.Broker.Listen, TLS: serverTLS, Auth: auth, Logger: log.With("component", "broker"),
	})
	if err != nil {
		return nil, "", nil, err
	}
	_, port, _ := net.SplitHostPort(b.Addr())
	host, _, _ := net.SplitHostPort(cfg.Broker.Listen)
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	addr := net.JoinHostPort(host, port)
	if serverTLS == nil {
		return b, "tcp://" + addr, nil, nil
	}
	return b, "ssl://" + addr, clientTLS, nil
}
