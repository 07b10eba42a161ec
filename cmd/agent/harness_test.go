package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/broker"
	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/simulator"
)

// agentBin and hubBin are the binaries built once for the tests that need
// real processes (signals, crashes, restarts).
var agentBin, hubBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sortie-agent-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	agentBin, hubBin = filepath.Join(dir, "agent"), filepath.Join(dir, "hub")
	// Built as `make build` builds them (stripped), so that what the
	// footprint benchmark measures is what a gateway runs.
	flags := []string{"-trimpath", "-ldflags=-s -w"}
	if testkit.Race {
		flags = append(flags, "-race")
	}
	for _, b := range []struct{ out, pkg string }{{agentBin, "."}, {hubBin, "../hub"}} {
		args := append(append([]string{"build", "-o", b.out}, flags...), b.pkg)
		cmd := exec.Command("go", args...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build", b.pkg, err)
			os.Exit(1)
		}
	}
	if testkit.Race {
		// A race-detecting binary sleeps a second at every exit (the
		// race runtime's atexit_sleep_ms) so that other threads may
		// finish a report; the agent and hub started here exit hundreds
		// of times (completions, restarts, CLI calls), and a race is
		// still reported, and the exit code still 66, when it is found.
		_ = os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	}
	code := m.Run()
	_ = os.RemoveAll(dir) // a temporary directory; the result is the tests'
	os.Exit(code)
}

// testEnv is one agent process, a broker and a simulated home in the
// test process (so they survive the agent's restarts), and an app client.
type testEnv struct {
	t      *testing.T
	scenes string // the scene directory; "" for configs/scenes
	// devices is the registry; "" for configs/devices.toml. ackTimeout
	// is [broker] ack_timeout; "" for 300ms.
	devices, ackTimeout string
	gw                  string
	dir                 string
	broker              *broker.Broker
	home                *simulator.Home
	app                 paho.Client
	cfgPath             string
	// env is added to the agent's environment (a test that sets its own
	// with t.Setenv cannot run in parallel).
	env []string

	mu      sync.Mutex
	replies map[string]chan map[string]any
	events  map[string][]agent.EventMessage
	evCh    chan agent.EventMessage

	proc *agentProc
}

type agentProc struct {
	cmd    *exec.Cmd
	exited chan error
	mu     sync.Mutex
	lines  []string
	grew   chan struct{} // closed, and replaced, at each line logged
	ready  chan struct{}
	http   string
	broker string // the embedded broker's address, if it runs one
	stdout *strings.Builder
}

// newEnv starts the broker, the home (from configs/home.toml without its
// faults) and an app client, and writes an agent config that uses them.
func newEnv(t *testing.T, extraConfig string) *testEnv {
	t.Helper()
	return newGatewayEnv(t, "test", extraConfig)
}

// newGatewayEnv is newEnv for a gateway with the given ID. The broker
// runs in the test process, and the agent uses it as an external one.
func newGatewayEnv(t *testing.T, gw, extraConfig string) *testEnv {
	t.Helper()
	e := newBareEnv(t, gw)
	e.broker = brokertest.Start(t)
	e.connect(e.broker.URL())
	e.writeConfig(fmt.Sprintf("embedded = false\nurl = %q\n", e.broker.URL()), extraConfig)
	return e
}

func newBareEnv(t *testing.T, gw string) *testEnv {
	return &testEnv{t: t, gw: gw, dir: t.TempDir(), replies: map[string]chan map[string]any{}, events: map[string][]agent.EventMessage{}, evCh: make(chan agent.EventMessage, 1024)}
}

// connect starts the home (from configs/home.toml without its faults)
// and the app client on the broker at url.
func (e *testEnv) connect(url string) {
	t := e.t
	t.Helper()
	hc, err := simulator.LoadHome(testkit.RepoPath("configs/home.toml"))
	if err != nil {
		t.Fatal(err)
	}
	hc.Broker = url
	for i := range hc.Devices {
		hc.Devices[i].Faults = simulator.Faults{}
	}
	if e.home, err = simulator.NewHome(hc); err != nil {
		t.Fatal(err)
	}
	if err := e.home.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.home.Close(); err != nil {
			t.Errorf("close home: %v", err)
		}
	})
	e.connectApp(url)
}

// connectApp connects the app client, which triggers scenes and hears
// replies and mission events, to the broker at url.
func (e *testEnv) connectApp(url string) {
	t := e.t
	t.Helper()
	opts := paho.NewClientOptions().AddBroker(url).SetClientID("test-app-" + e.gw).SetOrderMatters(false)
	e.app = paho.NewClient(opts)
	if tok := e.app.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("app connect: %v", tok.Error())
	}
	t.Cleanup(func() { e.app.Disconnect(50) })
	sub := func(topic string, h paho.MessageHandler) {
		if tok := e.app.Subscribe(topic, 1, h); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Fatalf("subscribe %s: %v", topic, tok.Error())
		}
	}
	base := "sortie/gateways/" + e.gw
	sub(base+"/replies/#", func(_ paho.Client, m paho.Message) {
		var r map[string]any
		if err := json.Unmarshal(m.Payload(), &r); err != nil {
			t.Errorf("reply is not JSON: %s", m.Payload())
			return
		}
		id := strings.TrimPrefix(m.Topic(), base+"/replies/")
		e.replyChan(id) <- r
	})
	sub(base+"/missions/+/events", func(_ paho.Client, m paho.Message) {
		var ev agent.EventMessage
		if err := json.Unmarshal(m.Payload(), &ev); err != nil {
			t.Errorf("event is not JSON: %s", m.Payload())
			return
		}
		e.mu.Lock()
		e.events[ev.MissionID] = append(e.events[ev.MissionID], ev)
		e.mu.Unlock()
		select {
		case e.evCh <- ev:
		default:
		}
	})
}

// writeConfig writes the agent's config with broker as the body of its
// [broker] section.
func (e *testEnv) writeConfig(broker, extraConfig string) {
	t := e.t
	e.cfgPath = filepath.Join(e.dir, "agent.toml")
	cfg := fmt.Sprintf(`gateway_id = %q
data_dir = %q
devices = %q
scenes = %q
[broker]
%sack_timeout = %q
[http]
listen = "127.0.0.1:0"
[log]
level = "debug"
format = "json"
[driver]
stop_grace = "5s"
%s
`, e.gw, filepath.Join(e.dir, "data"), cmp.Or(e.devices, testkit.RepoPath("configs/devices.toml")), cmp.Or(e.scenes, testkit.RepoPath("configs/scenes")), broker, cmp.Or(e.ackTimeout, "300ms"), extraConfig)
	if err := os.WriteFile(e.cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
}

func (e *testEnv) replyChan(id string) chan map[string]any {
	e.mu.Lock()
	defer e.mu.Unlock()
	ch := e.replies[id]
	if ch == nil {
		ch = make(chan map[string]any, 16)
		e.replies[id] = ch
	}
	return ch
}

// start runs the agent binary and waits until it says it is ready.
func (e *testEnv) start(args ...string) *agentProc {
	e.t.Helper()
	p := e.launch(args...)
	select {
	case <-p.ready:
	case err := <-p.exited:
		e.t.Fatalf("agent exited before ready: %v\n%s", err, p.log())
	case <-time.After(30 * time.Second):
		e.t.Fatalf("agent not ready\n%s", p.log())
	}
	e.awaitRetained()
	return p
}

// launch runs the agent binary, with its log read as it comes.
func (e *testEnv) launch(args ...string) *agentProc {
	e.t.Helper()
	cmd := exec.Command(agentBin, append([]string{"run", "-config", e.cfgPath}, args...)...)
	if e.env != nil {
		cmd.Env = append(os.Environ(), e.env...)
	}
	p := &agentProc{cmd: cmd, exited: make(chan error, 1), grew: make(chan struct{}), ready: make(chan struct{}), stdout: new(strings.Builder)}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	cmd.Stdout = p.stdout
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	logDone := make(chan struct{})
	go func() {
		defer close(logDone)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		once := sync.Once{}
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.lines = append(p.lines, line)
			close(p.grew)
			p.grew = make(chan struct{})
			p.mu.Unlock()
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil {
				if rec["msg"] == "http listening" {
					p.mu.Lock()
					p.http, _ = rec["addr"].(string)
					p.mu.Unlock()
				}
				if rec["msg"] == "embedded broker listening" {
					p.mu.Lock()
					p.broker, _ = rec["addr"].(string)
					p.mu.Unlock()
				}
				if rec["msg"] == "agent ready" {
					once.Do(func() { close(p.ready) })
				}
			}
		}
	}()
	go func() { <-logDone; p.exited <- cmd.Wait() }()
	e.proc = p
	e.t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill() // the test is over; it may be exiting by itself
			if err := <-p.exited; e.t.Failed() {
				e.t.Logf("agent ended: %v", err)
			}
		}
		if e.t.Failed() {
			e.t.Logf("agent log:\n%s", p.log())
		}
	})
	return p
}

// awaitRetained waits until the agent knows every device of the test's
// home as online and with a state. mochi's SUBACK comes before it has
// sent the retained messages, and a test that cuts a device's connection
// meanwhile has the broker write its retained last will while it is
// still reading the retained messages: a data race inside mochi v2.7.9
// (TopicsIndex.RetainMessage against scanMessages, on a topic's
// retainPath), harmless in practice, since a topic's retainPath is always
// the same string, but a failure under -race.
func (e *testEnv) awaitRetained() {
	e.proc.mu.Lock()
	addr := e.proc.http
	e.proc.mu.Unlock()
	if e.home == nil || addr == "" {
		return
	}
	want := len(e.home.Devices())
	testkit.Until(e.t, 10*time.Second, func() error {
		var l api.DeviceList
		e.get("/api/devices", &l)
		n := 0
		for _, d := range l.Devices {
			if d.Available && d.State != nil && e.home.Device(d.ID) != nil {
				n++
			}
		}
		if n < want {
			return fmt.Errorf("the agent knows %d of the home's %d devices\n%s", n, want, e.proc.log())
		}
		return nil
	})
}

// awaitLog waits up to within for a log line, after the first skip,
// whose JSON record match accepts, and reports whether one came.
func (p *agentProc) awaitLog(skip int, within time.Duration, match func(rec map[string]any) bool) bool {
	deadline := time.After(within)
	for {
		p.mu.Lock()
		skip = min(skip, len(p.lines))
		lines, grew := p.lines[skip:], p.grew
		p.mu.Unlock()
		for _, l := range lines {
			var rec map[string]any
			if json.Unmarshal([]byte(l), &rec) == nil && match(rec) {
				return true
			}
		}
		skip += len(lines)
		select {
		case <-grew:
		case <-deadline:
			return false
		}
	}
}

// logLines is how many lines the agent has logged.
func (p *agentProc) logLines() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.lines)
}

func (p *agentProc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// stop sends sig and waits for the process to exit, returning its code.
func (p *agentProc) stop(t *testing.T, sig syscall.Signal) int {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.exited:
		if err := waitError(err); err != nil {
			t.Fatalf("agent on %v: %v\n%s", sig, err, p.log())
		}
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill() // the test fails: what the kill says adds nothing
		t.Fatalf("agent did not exit on %v\n%s", sig, p.log())
	}
	return p.cmd.ProcessState.ExitCode()
}

// waitError is the error of exec.Cmd.Wait other than an exit status: a
// process that ran and ended, however, is not an error here.
func waitError(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return nil
	}
	return err
}

// trigger publishes a raw trigger payload.
func (e *testEnv) publish(payload string) {
	e.t.Helper()
	if tok := e.app.Publish("sortie/gateways/"+e.gw+"/trigger", 1, false, payload); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		e.t.Fatalf("publish trigger: %v", tok.Error())
	}
}

// trigger sends a trigger for scene and returns the accepted reply.
func (e *testEnv) trigger(scene, requestID string, params map[string]any) map[string]any {
	e.t.Helper()
	b, _ := json.Marshal(map[string]any{"scene": scene, "request_id": requestID, "source": "test", "params": params})
	e.publish(string(b))
	r := e.reply(requestID)
	if r["status"] != "accepted" {
		e.t.Fatalf("trigger %s rejected: %v", scene, r)
	}
	return r
}

func (e *testEnv) reply(requestID string) map[string]any {
	e.t.Helper()
	select {
	case r := <-e.replyChan(requestID):
		return r
	case <-time.After(15 * time.Second):
		e.t.Fatalf("no reply for %s", requestID)
		return nil
	}
}

// waitState waits for an event of mission id reaching state. The
// progress feed is QoS 0 and drops events when its queue is full (its
// durable record is the timeline), so the API is asked too, once a
// second, lest a dropped event leave the wait hanging.
func (e *testEnv) waitState(id string, want driver.State, within time.Duration) {
	e.t.Helper()
	deadline := time.After(within)
	poll := time.NewTicker(time.Second)
	defer poll.Stop()
	for {
		e.mu.Lock()
		for _, ev := range e.events[id] {
			if ev.To == want {
				e.mu.Unlock()
				return
			}
		}
		e.mu.Unlock()
		select {
		case <-e.evCh:
		case <-poll.C:
			var d api.MissionDetail
			if e.get("/api/missions/"+id, &d) == 200 && d.Mission != nil && d.Mission.State == want {
				return
			}
		case <-deadline:
			e.t.Fatalf("mission %s did not reach %s; events: %v\n%s", id, want, e.eventSummary(id), e.proc.log())
		}
	}
}

// waitEvent waits for an event matching f and returns it.
func (e *testEnv) waitEvent(id string, f func(agent.EventMessage) bool, within time.Duration) agent.EventMessage {
	e.t.Helper()
	deadline := time.After(within)
	for {
		e.mu.Lock()
		for _, ev := range e.events[id] {
			if f(ev) {
				e.mu.Unlock()
				return ev
			}
		}
		e.mu.Unlock()
		select {
		case <-e.evCh:
		case <-deadline:
			e.t.Fatalf("mission %s: event not seen; events: %v", id, e.eventSummary(id))
			return agent.EventMessage{}
		}
	}
}

func (e *testEnv) eventSummary(id string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var parts []string
	for _, ev := range e.events[id] {
		parts = append(parts, fmt.Sprintf("%s:%s->%s(%s %s)", ev.Input, ev.From, ev.To, ev.StepID, ev.Error))
	}
	return strings.Join(parts, " ")
}

// api calls the agent's HTTP API.
func (e *testEnv) get(path string, out any) int {
	e.t.Helper()
	e.proc.mu.Lock()
	addr := e.proc.http
	e.proc.mu.Unlock()
	resp, err := httpClient.Get("http://" + addr + path)
	if err != nil {
		e.t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }() // read to the end: nothing left to report
	b, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			e.t.Fatalf("GET %s: %v: %s", path, err, b)
		}
	}
	return resp.StatusCode
}

func (e *testEnv) device(id string) *simulator.Device {
	d := e.home.Device(id)
	if d == nil {
		e.t.Fatalf("no simulated device %s", id)
	}
	return d
}

// setFaults sets the faults of a simulated device.
func (e *testEnv) setFaults(id string, f simulator.Faults) {
	e.t.Helper()
	if err := e.device(id).SetFaults(f); err != nil {
		e.t.Fatalf("faults of %s: %v", id, err)
	}
}

// writeFile writes a file of the test, and its directory if need be.
func writeFile(tb testing.TB, path, content string) {
	tb.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		tb.Fatal(err)
	}
}
