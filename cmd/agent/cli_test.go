package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/agent/agenttest"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/driver/drivertest"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/scenes"
)

func TestBaseURL(t *testing.T) {
	cases := []struct{ in, want, err string }{
		{"127.0.0.1:8080", "http://127.0.0.1:8080", ""},
		{":8080", "http://127.0.0.1:8080", ""},
		{"0.0.0.0:9000", "http://127.0.0.1:9000", ""},
		{"[::]:9000", "http://[::1]:9000", ""},
		{"http://gw.local:8080/", "http://gw.local:8080", ""},
		{"127.0.0.1:0", "", "port 0"},
		{"localhost", "", "not host:port"},
	}
	for _, c := range cases {
		got, err := baseURL(c.in)
		if got != c.want || (c.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("baseURL(%q) = %q, %v; want %q, error %q", c.in, got, err, c.want, c.err)
		}
	}
}

// A command whose output cannot be written (a closed pipe, a full disk)
// fails instead of exiting 0 with nothing printed.
func TestUnwritableOutputFails(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"help"}, {"passwd", "-generate", "voice"}} {
		var errb strings.Builder
		code := run(context.Background(), args, failWriter{}, &errb)
		if code != 1 || !strings.Contains(errb.String(), os.ErrClosed.Error()) {
			t.Errorf("%q with an unwritable stdout: exit %d, stderr %q; want 1 and the write error", args, code, errb.String())
		}
	}
}

// failWriter is an output that is gone.
type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, os.ErrClosed }

// runCLI runs the agent's command line in-process.
func runCLI(args ...string) (code int, stdout, stderr string) {
	var out, errb strings.Builder
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestCLIAgainstAPI(t *testing.T) {
	const token = "cli-s3cret"
	f := newCLIFixture(t, token)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "agent.toml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("[http]\nlisten = %q\ntoken_file = \"token\"\n", strings.TrimPrefix(f.url, "http://"))), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(tokenEnv, "")

	code, out, errOut := runCLI("trigger", "cool", "temperature=21", "-request-id", "cli-1", "-config", cfg)
	if code != 0 || !strings.Contains(out, "accepted (cool") {
		t.Fatalf("trigger: exit %d\n%s%s", code, out, errOut)
	}
	id := regexp.MustCompile(`mission ([0-9a-f]{24}) accepted`).FindStringSubmatch(out)
	if id == nil {
		t.Fatalf("no mission ID in %q", out)
	}
	f.watch.Wait(t, id[1], driver.StateSucceeded)
	if code, out, _ := runCLI("trigger", "cool", "-request-id", "cli-1", "-config", cfg); code != 0 || !strings.Contains(out, "already accepted as mission "+id[1]) {
		t.Errorf("repeated trigger: exit %d %q", code, out)
	}

	cases := []struct {
		name   string
		args   []string
		code   int
		stdout []string
		stderr string
	}{
		{"list", []string{"missions", "list", "-config", cfg}, 0, []string{"ID", "SCENE", id[1], "SUCCEEDED", "1/1"}, ""},
		{"list json", []string{"missions", "list", "--json", "-state", "succeeded", "-config", cfg}, 0, []string{`"missions"`, `"id": "` + id[1]}, ""},
		{"show", []string{"missions", "show", id[1], "-v", "-config", cfg}, 0, []string{"Scene     cool", "State     SUCCEEDED", "living-ac set power=on target=21", "Events (", "complete"}, ""},
		{"show json", []string{"missions", "show", id[1], "--json", "-config", cfg}, 0, []string{`"timeline"`, `"trace_id"`}, ""},
		{"show unknown", []string{"missions", "show", "0190abcdef", "-config", cfg}, 1, nil, "agent: mission 0190abcdef not found\n"},
		{"cancel finished", []string{"missions", "cancel", id[1], "-config", cfg}, 1, nil, "is SUCCEEDED"},
		{"priority not a number", []string{"missions", "priority", id[1], "high", "-config", cfg}, 2, nil, "not a whole number"},
		{"unknown scene", []string{"trigger", "nope", "-config", cfg}, 1, nil, "scene nope rejected (unknown_scene)"},
		{"bad param", []string{"trigger", "cool", "temperature=hot", "-config", cfg}, 1, nil, "invalid_param"},
		{"param not key=value", []string{"trigger", "cool", "hot", "-config", cfg}, 2, nil, "not key=value"},
		{"devices", []string{"devices", "-config", cfg}, 0, []string{"living-light", "living-ac", "ONLINE"}, ""},
		{"scenes", []string{"scenes", "-config", cfg}, 0, []string{"cool", "temperature=24", "solo", "parallel"}, ""},
		{"wrong token", []string{"scenes", "-config", cfg, "-token", "nope"}, 1, nil, "wrong bearer token (set $SORTIE_TOKEN"},
		{"no agent", []string{"scenes", "-addr", "127.0.0.1:1"}, 1, nil, "cannot reach the agent at http://127.0.0.1:1"},
		{"missing action", []string{"missions"}, 2, nil, "missions needs one of: list, show, pause"},
		{"unknown action", []string{"missions", "explode", "x"}, 2, nil, `missions: unknown "explode" (one of: list,`},
		{"missing ID", []string{"missions", "show", "-config", cfg}, 2, nil, "takes 1 argument(s), got 0"},
		{"unknown flag", []string{"devices", "-bogus"}, 2, nil, "flag provided but not defined"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, out, errOut := runCLI(c.args...)
			if code != c.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, c.code, out, errOut)
			}
			for _, want := range c.stdout {
				if !strings.Contains(out, want) {
					t.Errorf("stdout lacks %q:\n%s", want, out)
				}
			}
			if c.stderr != "" && !strings.Contains(errOut, c.stderr) {
				t.Errorf("stderr lacks %q:\n%s", c.stderr, errOut)
			}
		})
	}

	// Control through the CLI, with the token from the environment.
	t.Setenv(tokenEnv, token)
	addr := strings.TrimPrefix(f.url, "http://")
	f.gate.Hold.Store(true)
	id2 := f.submit(t, "many", "cli-2")
	<-f.gate.Entered
	if code, out, errOut := runCLI("missions", "pause", id2, "-addr", addr); code != 0 || !strings.Contains(out, "pause requested") {
		t.Errorf("pause: exit %d %q %q", code, out, errOut)
	}
	if code, out, _ := runCLI("missions", "priority", id2, "80", "-addr", addr); code != 0 || !strings.Contains(out, "priority 80") {
		t.Errorf("priority: exit %d %q", code, out)
	}
	f.gate.Release <- struct{}{}
	f.watch.Wait(t, id2, driver.StatePaused)
	// The worker may still hold the mission for a moment after pausing it:
	// the cancel is then recorded and taken when it lets go.
	if code, out, _ := runCLI("missions", "cancel", id2, "-addr", addr); code != 0 || !strings.Contains(out, "CANCELLED") && !strings.Contains(out, "cancel requested") {
		t.Errorf("cancel: exit %d %q", code, out)
	}
	f.watch.Wait(t, id2, driver.StateCancelled)
}

// TestCLIEndToEnd drives the real agent binary: a trigger over MQTT,
// then the CLI lists and shows it, and starts a mission of its own.
func TestCLIEndToEnd(t *testing.T) {
	e := newEnv(t, "")
	e.start()
	r := e.trigger("go_home", "e2e-cli", map[string]any{"temperature": 22})
	id := r["mission_id"].(string)
	e.waitState(id, driver.StateSucceeded, 20*time.Second)
	e.proc.mu.Lock()
	addr := e.proc.http
	e.proc.mu.Unlock()
	t.Setenv(tokenEnv, "")
	// The CLI runs in-process (a race-built binary takes a while to start)
	// except for the trigger, which goes through the real binary.
	cli := func(args ...string) string {
		t.Helper()
		code, out, errOut := runCLI(append(args, "-addr", addr)...)
		if code != 0 {
			t.Fatalf("agent %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
		}
		return out
	}
	list := cli("missions", "list")
	if !strings.Contains(list, id) || !strings.Contains(list, "SUCCEEDED") || !strings.Contains(list, "go_home") {
		t.Errorf("missions list lacks the mission:\n%s", list)
	}
	show := cli("missions", "show", id)
	for _, want := range []string{"State     SUCCEEDED", "Source    test  (request e2e-cli)", "living-light-on: living-light turn_on", "living-ac set mode=cool power=on target=22", "succeeded  1 attempt"} {
		if !strings.Contains(show, want) {
			t.Errorf("missions show lacks %q:\n%s", want, show)
		}
	}
	cmd := exec.Command(agentBin, "trigger", "good_night", "-request-id", "e2e-cli-2", "-addr", addr)
	cmd.Env = append(os.Environ(), tokenEnv+"=")
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("agent trigger: %v\n%s", err, b)
	}
	out := string(b)
	m := regexp.MustCompile(`mission ([0-9a-f]{24}) accepted \(good_night`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("agent trigger: %s", out)
	}
	e.waitState(m[1], driver.StateSucceeded, 30*time.Second)
	if dev := cli("devices"); !strings.Contains(dev, "front-door") || !strings.Contains(dev, "locked=true") {
		t.Errorf("devices after good_night:\n%s", dev)
	}
}

// cliFixture is a whole agent in this process whose device and delay
// steps are a gate the test opens, with the scenes of the agent's API
// tests (agent/testdata/gated.toml).
type cliFixture struct {
	url   string
	token string
	gate  *drivertest.Gate
	watch *drivertest.Watcher
}

func newCLIFixture(t *testing.T, token string) *cliFixture {
	t.Helper()
	src, err := os.ReadFile(testkit.RepoPath("agent/testdata/gated.toml"))
	if err != nil {
		t.Fatal(err)
	}
	reg, cat := agenttest.Scenes(t, "configs/devices.toml", string(src))
	f := &cliFixture{token: token, gate: drivertest.NewGate(), watch: drivertest.NewWatcher()}
	a := agenttest.Start(t, agent.Options{
		Gateway: "test", Registry: reg, Catalog: cat,
		HTTP:      agent.HTTPOptions{Token: token},
		Handlers:  map[string]driver.Handler{scenes.DelayKind: f.gate, devices.KindCommand: f.gate},
		Observers: []driver.Observer{f.watch},
		Driver:    agent.DriverOptions{StopGrace: time.Second},
	})
	t.Cleanup(f.gate.Open) // before the agent's stop: a held step must not keep it waiting
	f.url = a.Addrs().API
	return f
}

// submit runs scene through the API and returns the new mission's ID.
func (f *cliFixture) submit(t *testing.T, scene, requestID string) string {
	t.Helper()
	req, err := http.NewRequest("POST", f.url+"/api/missions", strings.NewReader(`{"scene":"`+scene+`","request_id":"`+requestID+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+f.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }() // decoded: nothing left to report
	var rep scenes.Reply
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil || resp.StatusCode != http.StatusCreated || rep.MissionID == "" {
		t.Fatalf("submit %s: %d %+v %v", scene, resp.StatusCode, rep, err)
	}
	return rep.MissionID
}
