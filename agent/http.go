package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path"
	"strconv"
	"time"

	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/internal/httpjson"
)

// cleanPaths answers a path that is not in canonical form (".." or "."
// segments, doubled slashes) with a JSON 404, where the mux would send a
// plain-text redirect: every error of the API is JSON (docs/api.md), and
// no client has a reason to send such a path.
func cleanPaths(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		if p == "" || p[0] != '/' || path.Clean(p) != p && path.Clean(p)+"/" != p {
			httpjson.WriteError(w, http.StatusNotFound, api.CodeNotFound, "no endpoint "+r.Method+" "+strconv.Quote(p)+" (paths are canonical: no \"..\", \".\" or \"//\")", true)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// listenHTTP binds the management listener early in Start, so that a
// bad address fails start-up and a supervisor can ask /readyz while
// the agent waits for its broker, and serves a stand-in until mountHTTP:
// /healthz answers, /readyz says what start-up waits for, and the rest
// answers 503 "starting". The API proper is mounted once the driver
// runs, so an API that answers means a running driver.
func (a *Agent) listenHTTP() error {
	token, tc := a.opts.HTTP.Token, a.opts.HTTP.TLS
	ln, err := net.Listen("tcp", a.opts.HTTP.Listen)
	if err != nil {
		return fmt.Errorf("http.listen: %w", err)
	}
	if tc != nil {
		ln = tls.NewListener(ln, tc) // its Addr is still the TCP address
	}
	a.httpLn = ln
	starting := http.NewServeMux()
	starting.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		httpjson.Write(w, http.StatusOK, map[string]string{"status": "ok"}, true)
	})
	starting.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		reason := "starting"
		if err := a.waitingFor(); err != nil {
			reason += ": " + err.Error()
		}
		httpjson.Write(w, http.StatusServiceUnavailable, api.Readiness{Status: "not_ready", Reasons: []string{reason}}, true)
	})
	starting.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		httpjson.WriteError(w, http.StatusServiceUnavailable, api.CodeStarting, "the agent is starting; GET /readyz says what it waits for", true)
	})
	var h http.Handler = starting
	a.handler.Store(&h)
	a.http = &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*a.handler.Load()).ServeHTTP(w, r) }),
		ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute,
	}
	a.served = make(chan error, 1)
	a.httpWG.Go(func() {
		err := a.http.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		a.served <- err
	})
	a.onClose(func() {
		_ = a.http.Close() // after Run's Shutdown, or a failed start: nothing left to drain
		a.httpWG.Wait()
	})
	// Tests and scripts read this line to find a port chosen with :0.
	a.log.Info("http listening", "addr", ln.Addr().String(), "auth", token != "", "tls", tc != nil)
	return nil
}

// mountHTTP replaces listenHTTP's stand-in with the API and /metrics.
func (a *Agent) mountHTTP() {
	o := api.Options{
		Log: a.log.With("component", "api"), Token: a.opts.HTTP.Token, Driver: a.drv, Devices: a.dev,
		Registry: a.reg, Registries: a.dev.Registry, Catalog: a.cat, Scenes: a.catalog, Trigger: a.trig.Call, Backup: a.db.BackupFile,
		Why: a.Why, RecentWhy: a.RecentWhy, Declined: a.trig.declined(viaAPI), Schedules: a.sched.list,
		WriteError: a.db.WriteError, Broker: a.linkProblem,
		Discover: func(ctx context.Context, window time.Duration) (devices.Discovery, error) {
			return a.dev.Discover(ctx, devices.DiscoverOptions{Window: window})
		},
	}
	if a.cfg != nil {
		o.Config, o.Apply, o.ConfigProblem = a.cfg.info, a.Apply, a.cfg.Problem
	}
	s := api.New(o)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", a.metrics.reg)
	s.Register(mux)
	a.http.RegisterOnShutdown(s.Shutdown)
	h := cleanPaths(mux)
	a.handler.Store(&h)
}
