package agent_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/scenes"
)

// TestRunStopsCleanlyDespiteASilentAPIConnection: a client that opened a
// connection to the API and sent nothing (net/http waits 5 s for those
// before it calls them idle) neither holds the agent's stop past its
// grace nor makes Run fail. Found by a benchmark whose HTTP client had
// dialled one connection more than it used.
func TestRunStopsCleanlyDespiteASilentAPIConnection(t *testing.T) {
	reg, err := devices.LoadRegistry("../configs/devices.toml")
	if err != nil {
		t.Fatal(err)
	}
	cat, err := scenes.Load("../configs/scenes", reg)
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(agent.Options{
		Gateway: "home", DataDir: t.TempDir(), Registry: reg, Catalog: cat,
		Broker: agent.BrokerOptions{Embedded: true, Listen: "127.0.0.1:0"},
		HTTP:   agent.HTTPOptions{Listen: "127.0.0.1:0"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	addr := a.Addrs().API[len("http://"):]
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }() // the test's own idle connection
	start := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v, want a clean stop", err)
		}
		t.Logf("stopped in %v", time.Since(start).Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return")
	}
}
