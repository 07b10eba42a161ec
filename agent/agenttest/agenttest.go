// Package agenttest starts whole agents for tests, in the shape of
// net/http/httptest: Start makes an agent of the options given (filling
// in a test's defaults: its own data directory, the embedded broker and
// the API on 127.0.0.1 port 0, the shipped devices and scenes), starts
// it, runs it, and stops it at the test's end, failing the test if Run
// did not end cleanly. Only tests import it.
package agenttest

import (
	"testing"

	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/bundle"
	"github.com/sortie-edge/sortie/bundle/check"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/scenes"
)

// Agent is a started agent, running until Stop or the test's end.
type Agent struct {
	*agent.Agent
	// API is a client of the agent's management API.
	API *api.Client
	// Stop stops the agent as SIGTERM would and closes it, failing the
	// test if Run returns an error or not within testkit.StopWithin.
	// Only the first call does anything; the test's cleanup calls it too.
	Stop func()
}

// Start makes an agent of o and starts and runs it, failing tb if it
// cannot. Zero fields of o get a test's defaults: gateway "home", a data
// directory of tb.TempDir(), the embedded broker (unless o names an
// external one) and the API listening on 127.0.0.1 port 0, and, with
// neither a Registry nor a Catalog, the shipped ones (Shipped). A nil
// Logger discards, as agent.New has it.
func Start(tb testing.TB, o agent.Options) *Agent {
	tb.Helper()
	if o.Gateway == "" {
		o.Gateway = "home"
	}
	if o.DataDir == "" {
		o.DataDir = tb.TempDir()
	}
	if o.Broker.URL == "" {
		o.Broker.Embedded = true
	}
	if o.Broker.Embedded && o.Broker.Listen == "" {
		o.Broker.Listen = "127.0.0.1:0"
	}
	if o.HTTP.Listen == "" {
		o.HTTP.Listen = "127.0.0.1:0"
	}
	if o.Registry == nil && o.Catalog == nil {
		o.Registry, o.Catalog = Shipped(tb)
	}
	a, err := agent.New(o)
	if err != nil {
		tb.Fatal(err)
	}
	stop := testkit.Run(tb, a)
	return &Agent{Agent: a, API: &api.Client{Base: a.Addrs().API}, Stop: stop}
}

// Registry loads the device registry at p (relative to the repository's
// root).
func Registry(tb testing.TB, p string) *devices.Registry {
	tb.Helper()
	reg, err := devices.LoadRegistry(testkit.RepoPath(p))
	if err != nil {
		tb.Fatal(err)
	}
	return reg
}

// Shipped loads the shipped device registry and scenes (configs/).
func Shipped(tb testing.TB) (*devices.Registry, *scenes.Catalog) {
	tb.Helper()
	reg := Registry(tb, "configs/devices.toml")
	cat, err := scenes.Load(testkit.RepoPath("configs/scenes"), reg)
	if err != nil {
		tb.Fatal(err)
	}
	return reg, cat
}

// Bundle returns the device registry and scenes of a configuration
// bundle, checked as an agent checks the bundle of its files.
func Bundle(tb testing.TB, b *bundle.Bundle) (*devices.Registry, *scenes.Catalog) {
	tb.Helper()
	set, err := check.Bundle(b)
	if err != nil {
		tb.Fatal(err)
	}
	return set.Registry, set.Catalog
}

// Scenes parses the scenes in src against the registry at p (relative to
// the repository's root).
func Scenes(tb testing.TB, p, src string) (*devices.Registry, *scenes.Catalog) {
	tb.Helper()
	reg := Registry(tb, p)
	cat, err := scenes.Parse([]byte(src), "test.toml", reg)
	if err != nil {
		tb.Fatal(err)
	}
	return reg, cat
}
