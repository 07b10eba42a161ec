package main

import (
	"io"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/simulator"
)

// newEmbeddedEnv starts the agent with its own broker, as make run does:
// the agent's traffic goes to the broker in process, while the simulated
// home and the app connect to it over TCP. (The other tests run the
// broker in the test process, so that it outlives the agent's restarts.)
func newEmbeddedEnv(t *testing.T) *testEnv {
	t.Helper()
	e := newBareEnv(t, "emb")
	e.writeConfig("embedded = true\nlisten = \"127.0.0.1:0\"\n", "")
	p := e.start()
	p.mu.Lock()
	addr := p.broker
	p.mu.Unlock()
	if addr == "" {
		t.Fatalf("the log does not say where the embedded broker listens\n%s", p.log())
	}
	e.connect("tcp://" + addr)
	return e
}

func TestEmbeddedBrokerInProcess(t *testing.T) {
	e := newEmbeddedEnv(t)

	// A scene end to end, with its progress events followed over MQTT.
	id := e.goHome("emb-1", 21)

	// The same request again is the same mission.
	if r2 := e.trigger("go_home", "emb-1", nil); r2["mission_id"] != id || r2["state"] != "SUCCEEDED" {
		t.Errorf("repeated request: %v, want mission %s, SUCCEEDED", r2, id)
	}

	// Bad triggers are rejected with a reason.
	for _, c := range []struct{ payload, replyTo, reason string }{
		{`{"scene":"nope","request_id":"emb-b1"}`, "emb-b1", "unknown_scene"},
		{`not json`, "_invalid", "bad_json"},
		{`{"scene":"go_home","request_id":"emb-b2","params":{"x":"` + strings.Repeat("a", 20000) + `"}}`, "_invalid", "too_large"},
	} {
		e.publish(c.payload)
		if got := e.reply(c.replyTo); got["status"] != "rejected" || got["reason"] != c.reason {
			t.Errorf("reply %v, want rejected/%s", got, c.reason)
		}
	}

	// A failing step undoes the ones before it, in reverse order, back to
	// the state each device reported in its ack.
	light, kitchen, speaker := e.device("living-light"), e.device("kitchen-light"), e.device("living-speaker")
	before := map[string]map[string]any{"living-light": light.State(), "kitchen-light": kitchen.State(), "living-speaker": speaker.State()}
	if err := e.device("front-door").SetFaults(simulator.Faults{Jammed: true}); err != nil {
		t.Fatal(err)
	}
	id = e.trigger("movie_night", "emb-movie", nil)["mission_id"].(string)
	e.waitState(id, driver.StateFailed, 60*time.Second)
	wantState(t, light, before["living-light"])
	wantState(t, kitchen, before["kitchen-light"])
	wantState(t, speaker, before["living-speaker"])

	if code := e.proc.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0\n%s", code, e.proc.log())
	}
}

// A simulated home that cannot reach its broker fails the start with the
// reason, instead of holding it forever.
func TestSimulatedHomeStartBounded(t *testing.T) {
	defer func(d time.Duration) { agent.HomeStartTimeout = d }(agent.HomeStartTimeout)
	agent.HomeStartTimeout = time.Second
	url := "tcp://" + testkit.FreeAddr(t) // nothing listens there now
	dir := t.TempDir()
	cfg := DefaultConfig()
	cfg.Dir = dir
	cfg.Devices = testkit.RepoPath("configs/devices.toml")
	cfg.Scenes = testkit.RepoPath("configs/scenes")
	cfg.Simulator.Home = testkit.RepoPath("configs/home.toml")
	cfg.Broker.Embedded, cfg.Broker.URL = false, url
	cfg.HTTP.Listen = ""
	opts, err := agentOptions(cfg, newLogger(cfg.Log, io.Discard))
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	err = a.Start(t.Context())
	a.Close()
	if err == nil || !strings.Contains(err.Error(), "not online within 1s") || !strings.Contains(err.Error(), "connect to "+url) {
		t.Fatalf("start: %v, want the home's timeout and its last connection error", err)
	}
}
