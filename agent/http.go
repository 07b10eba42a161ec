package agent

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/sortie-edge/sortie/agent/api"
)

// startHTTP binds the management listener so that a bad address fails
// start-up instead of a goroutine later. It runs after the driver has
// started, so a listening API means a running driver.
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
	})
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", a.metrics.reg)
	s.Register(mux)
	a.http = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute}
	a.http.RegisterOnShutdown(s.Shutdown)
	// Tests and scripts read this line to find a port chosen with :0.
	a.log.Info("http listening", "addr", ln.Addr().String(), "auth", token != "", "tls", tc != nil)
	return nil
}
