package agent

import (
	"context"
	"crypto/tls"
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

// startHTTP binds the management listener so that a bad address fails
// start-up instead of a goroutine later. It runs after the driver has
// started, so a listening API means a running driver.
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

func (a *Agent) startHTTP() error {
	token, tc := a.opts.HTTP.Token, a.opts.HTTP.TLS
	ln, err := net.Listen("tcp", a.opts.HTTP.Listen)
	if err != nil {
		return fmt.Errorf("http.listen: %w", err)
	}
	if tc != nil {
		ln = tls.NewListener(ln, tc) // its Addr is still the TCP address
	}
	a.httpLn = ln
	s := api.New(api.Options{
		Log: a.log.With("component", "api"), Token: token, Driver: a.drv, Devices: a.dev,
		Registry: a.reg, Catalog: a.cat, Trigger: a.trig.Call, Backup: a.db.BackupFile,
		Why: a.Why, RecentWhy: a.RecentWhy, Declined: a.trig.declined(viaAPI), Schedules: a.sched.list,
		WriteError: a.db.WriteError,
		Discover: func(ctx context.Context, window time.Duration) (devices.Discovery, error) {
			base, _ := a.reg.Protocols["zigbee2mqtt"]["base_topic"].(string)
			return a.dev.Discover(ctx, devices.DiscoverOptions{Window: window, Z2MBase: base})
		},
	})
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", a.metrics.reg)
	s.Register(mux)
	a.http = &http.Server{Handler: cleanPaths(mux), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute}
	a.http.RegisterOnShutdown(s.Shutdown)
	// Tests and scripts read this line to find a port chosen with :0.
	a.log.Info("http listening", "addr", ln.Addr().String(), "auth", token != "", "tls", tc != nil)
	return nil
}
