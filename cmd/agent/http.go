package main

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// startHTTP binds the management listener so that a bad address fails
// start-up instead of a goroutine later. It runs after the driver has
// started, so a listening API means a running driver.
func (a *agent) startHTTP() error {
	token, err := httpToken(a.cfg)
	if err != nil {
		return err
	}
	tc, _, err := a.cfg.HTTP.serverTLS(a.cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", a.cfg.HTTP.Listen)
	if err != nil {
		return fmt.Errorf("http.listen: %w", err)
	}
	if tc != nil {
		ln = tls.NewListener(ln, tc) // its Addr is still the TCP address
	}
	a.httpLn = ln
	s := newAPI(apiOptions{
		Log: a.log.With("component", "api"), Token: token, Driver: a.drv, Devices: a.dev,
		Registry: a.reg, Catalog: a.cat, Triggers: a.trig, Backup: a.db.BackupFile,
	})
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.metrics.reg, promhttp.HandlerOpts{Registry: a.metrics.reg}))
	s.register(mux)
	a.http = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute}
	a.http.RegisterOnShutdown(s.shutdown)
	// Tests and scripts read this line to find a port chosen with :0.
	a.log.Info("http listening", "addr", ln.Addr().String(), "auth", token != "", "tls", tc != nil)
	return nil
}

// httpToken returns the API token: token_file's content when set (read
// once, at start), else token. "" leaves the API open.
func httpToken(c Config) (string, error) {
	if c.HTTP.TokenFile == "" {
		return c.HTTP.Token, nil
	}
	b, err := os.ReadFile(c.Path(c.HTTP.TokenFile))
	if err != nil {
		return "", fmt.Errorf("http.token_file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("http.token_file: %s is empty", c.HTTP.TokenFile)
	}
	return tok, nil
}
