package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/simulator"
)

var httpClient = &http.Client{Timeout: 10 * time.Second}

func wantState(t *testing.T, d *simulator.Device, want map[string]any) {
	t.Helper()
	got := d.State()
	for k, v := range want {
		if fmt.Sprint(got[k]) != fmt.Sprint(v) {
			t.Errorf("%s: state %s = %v, want %v (state %v)", d.ID(), k, got[k], v, got)
		}
	}
}

func TestGoHomeSucceeds(t *testing.T) {
	e := newEnv(t, "")
	e.start()
	e.goHome("r1", 23)
}

// goHome runs go_home at temperature to SUCCEEDED, checks where the
// devices ended, and returns the mission ID.
func (e *testEnv) goHome(requestID string, temperature int) string {
	t := e.t
	t.Helper()
	r := e.trigger("go_home", requestID, map[string]any{"temperature": temperature})
	id := r["mission_id"].(string)
	e.waitState(id, driver.StateSucceeded, 20*time.Second)
	wantState(t, e.device("living-light"), map[string]any{"power": "on", "brightness": 80})
	wantState(t, e.device("living-ac"), map[string]any{"power": "on", "mode": "cool", "target": temperature})
	wantState(t, e.device("living-speaker"), map[string]any{"status": "playing", "playlist": "welcome home", "volume": 30})
	return id
}

func TestDroppedAckRetriedEffectOnce(t *testing.T) {
	e := newEnv(t, "")
	e.start()
	light := e.device("living-light")
	if err := light.SetFaults(simulator.Faults{AckLoss: 1}); err != nil {
		t.Fatal(err)
	}
	// The first command is applied but its ack is lost; heal once the
	// retry is on the wire (the device may still lose that one's ack too:
	// both are the same command ID, so either way it applies once).
	var seen atomic.Int32
	second := make(chan struct{})
	e.app.Subscribe("sortie/devices/living-light/cmd", 1, func(paho.Client, paho.Message) {
		if seen.Add(1) == 2 {
			close(second)
		}
	}).WaitTimeout(5 * time.Second)
	r := e.trigger("go_home", "r-ack", nil)
	id := r["mission_id"].(string)
	select {
	case <-second:
	case <-time.After(20 * time.Second):
		t.Fatalf("light got %d commands, want a retry", seen.Load())
	}
	e.setFaults("living-light", simulator.Faults{})
	e.waitState(id, driver.StateSucceeded, 30*time.Second)
	e.waitEvent(id, func(ev agent.EventMessage) bool {
		return ev.Input == driver.InBeginStep && ev.StepID == "living-light-on" && ev.Attempt >= 2
	}, time.Second)
	c := light.Counters()
	if c.Applied != 1 {
		t.Errorf("light applied %d effects, want exactly 1 (counters %+v)", c.Applied, c)
	}
	if c.Received < 2 {
		t.Errorf("light received %d commands, want a retry", c.Received)
	}
}

func TestOfflineDeviceDelaysStep(t *testing.T) {
	e := newEnv(t, "")
	e.start()
	ac := e.device("living-ac")
	ac.SetOnline(false)
	r := e.trigger("go_home", "r-off", nil)
	id := r["mission_id"].(string)
	// The AC step waits (not-ready) instead of failing.
	e.waitEvent(id, func(ev agent.EventMessage) bool { return ev.Input == driver.InStepWait && ev.Code == "device_offline" }, 20*time.Second)
	ac.SetOnline(true)
	e.waitState(id, driver.StateSucceeded, 30*time.Second)
	wantState(t, ac, map[string]any{"power": "on", "target": 24})
	e.mu.Lock()
	defer e.mu.Unlock()
	var acEvents []string
	for _, ev := range e.events[id] {
		if ev.StepID == "2-living-ac" {
			acEvents = append(acEvents, fmt.Sprintf("%s attempt %d %s %s", ev.Input, ev.Attempt, ev.Code, ev.Error))
		}
	}
	for _, ev := range e.events[id] {
		if ev.StepID == "2-living-ac" && ev.Input == driver.InBeginStep && ev.Attempt > 1 {
			t.Errorf("waiting for an offline device spent attempts: the AC step's events:\n%s", strings.Join(acEvents, "\n"))
			break
		}
	}
}

func TestFailureCompensatesInReverse(t *testing.T) {
	e := newEnv(t, "")
	e.start()
	light, kitchen, speaker := e.device("living-light"), e.device("kitchen-light"), e.device("living-speaker")
	before := map[string]map[string]any{"living-light": light.State(), "kitchen-light": kitchen.State(), "living-speaker": speaker.State()}
	e.setFaults("front-door", simulator.Faults{Jammed: true})
	r := e.trigger("movie_night", "r-movie", nil)
	id := r["mission_id"].(string)
	e.waitState(id, driver.StateFailed, 60*time.Second)
	// The order from the durable timeline: the progress feed may drop an
	// event under load.
	var d api.MissionDetail
	if code := e.get("/api/missions/"+id, &d); code != 200 {
		t.Fatalf("mission: %d", code)
	}
	var undone []string
	for _, ev := range d.Timeline {
		if ev.Input == driver.InCompBegin {
			undone = append(undone, ev.StepID)
		}
	}
	want := []string{"5-living-speaker", "3-bedroom-curtain", "2-kitchen-light", "1-living-light"}
	if strings.Join(undone, ",") != strings.Join(want, ",") {
		t.Errorf("compensation order %v, want %v", undone, want)
	}
	wantState(t, light, before["living-light"])
	wantState(t, kitchen, before["kitchen-light"])
	wantState(t, speaker, before["living-speaker"])
}

func TestDuplicateRequestOneMission(t *testing.T) {
	e := newEnv(t, "")
	e.start()
	r1 := e.trigger("go_home", "same", nil)
	r2 := e.trigger("go_home", "same", nil)
	if r1["mission_id"] != r2["mission_id"] {
		t.Fatalf("two missions for one request: %v %v", r1, r2)
	}
	if r2["duplicate"] != true {
		t.Errorf("second reply not marked duplicate: %v", r2)
	}
	e.waitState(r1["mission_id"].(string), driver.StateSucceeded, 20*time.Second)
	r3 := e.trigger("go_home", "same", nil)
	if r3["mission_id"] != r1["mission_id"] || r3["state"] != "SUCCEEDED" {
		t.Errorf("after completion: %v", r3)
	}
}

func TestBadTriggersRejected(t *testing.T) {
	e := newEnv(t, "")
	e.start()
	big := `{"scene":"go_home","request_id":"big","params":{"x":"` + strings.Repeat("a", 20000) + `"}}`
	cases := []struct {
		name, payload, replyTo, reason string
	}{
		{"not json", `hello`, "_invalid", "bad_json"},
		{"unknown scene", `{"scene":"nope","request_id":"b1"}`, "b1", "unknown_scene"},
		{"missing scene", `{"request_id":"b2"}`, "b2", "missing_field"},
		{"missing request id", `{"scene":"go_home"}`, "_invalid", "missing_field"},
		{"wrong type", `{"scene":"go_home","request_id":"b3","params":{"temperature":"hot"}}`, "b3", "invalid_param"},
		{"out of range", `{"scene":"go_home","request_id":"b4","params":{"temperature":40}}`, "b4", "invalid_param"},
		{"wildcard id", `{"scene":"go_home","request_id":"a+b"}`, "_invalid", "invalid_field"},
		{"slash id", `{"scene":"go_home","request_id":"a/b"}`, "_invalid", "invalid_field"},
		{"params not object", `{"scene":"go_home","request_id":"b5","params":[1]}`, "b5", ""},
		{"oversized", big, "_invalid", "too_large"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e.publish(c.payload)
			r := e.reply(c.replyTo)
			if r["status"] != "rejected" || (c.reason != "" && r["reason"] != c.reason) {
				t.Errorf("reply %v, want rejected/%s", r, c.reason)
			}
			if msg, _ := r["message"].(string); msg == "" {
				t.Errorf("rejection without a message: %v", r)
			}
		})
	}
	// The agent is still healthy and takes good triggers.
	r := e.trigger("go_home", "after-bad", nil)
	e.waitState(r["mission_id"].(string), driver.StateSucceeded, 20*time.Second)
}

func TestSIGTERMThenRestartCompletes(t *testing.T) {
	e := newEnv(t, "")
	p := e.start()
	// Slow acks keep the mission mid-flight when the signal arrives.
	for _, id := range []string{"living-light", "living-ac", "living-speaker"} {
		e.setFaults(id, simulator.Faults{AckDelay: 150 * time.Millisecond})
	}
	r := e.trigger("go_home", "r-term", nil)
	id := r["mission_id"].(string)
	e.waitEvent(id, func(ev agent.EventMessage) bool { return ev.Input == driver.InStepOK }, 20*time.Second)
	if code := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0\n%s", code, p.log())
	}
	if !strings.Contains(p.log(), "agent stopping") {
		t.Errorf("no clean shutdown in log")
	}
	e.start()
	e.waitState(id, driver.StateSucceeded, 30*time.Second)
	wantState(t, e.device("living-speaker"), map[string]any{"status": "playing"})
}

func TestSIGKILLThenRestartNoDoubleEffect(t *testing.T) {
	e := newEnv(t, "")
	p := e.start()
	for _, id := range []string{"living-light", "living-ac", "living-speaker"} {
		e.setFaults(id, simulator.Faults{AckDelay: 200 * time.Millisecond})
	}
	r := e.trigger("go_home", "r-kill", nil)
	id := r["mission_id"].(string)
	// Kill while the AC command is in flight: the step is STEP_RUNNING.
	e.waitEvent(id, func(ev agent.EventMessage) bool { return ev.Input == driver.InBeginStep && ev.Step == 1 }, 20*time.Second)
	p.stop(t, syscall.SIGKILL)
	e.start()
	e.waitState(id, driver.StateSucceeded, 30*time.Second)
	for _, dev := range []string{"living-light", "living-ac", "living-speaker"} {
		if c := e.device(dev).Counters(); c.Applied != 1 {
			t.Errorf("%s applied %d effects, want 1 (%+v)", dev, c.Applied, c)
		}
	}
	e.waitEvent(id, func(ev agent.EventMessage) bool { return ev.Input == driver.InRecover }, time.Second)
}

func TestValidateReportsBrokenScene(t *testing.T) {
	dir := t.TempDir()
	scenesDir := filepath.Join(dir, "scenes")
	writeFile(t, filepath.Join(scenesDir, "bad.toml"), `[[scene]]
name = "bad"
[[scene.step]]
device = "living-ac"
action = "set"
params = { target = 35 }
`)
	cfg := filepath.Join(dir, "agent.toml")
	writeFile(t, cfg, fmt.Sprintf("devices = %q\nscenes = %q\n", testkit.RepoPath("configs/devices.toml"), scenesDir))
	out, err := exec.Command(agentBin, "validate", "-config", cfg).CombinedOutput()
	if err == nil {
		t.Fatalf("validate accepted a broken scene:\n%s", out)
	}
	for _, want := range []string{"bad.toml", `"bad"`, "target", "30"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("validate output lacks %q:\n%s", want, out)
		}
	}
	ok, err := exec.Command(agentBin, "validate", "-config", testkit.RepoPath("configs/agent.toml")).CombinedOutput()
	if err != nil {
		t.Errorf("shipped config does not validate: %v\n%s", err, ok)
	}
	// Without -config in a directory without the default files: say how.
	cmd := exec.Command(agentBin, "validate")
	cmd.Dir = t.TempDir()
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "-config configs/agent.toml") {
		t.Errorf("validate without -config or files: %v\n%s", err, out)
	}
}

// TestSceneModes: single rejects a second run, queued holds it until the
// first ends, restart cancels the first (compensating it).
func TestSceneModes(t *testing.T) {
	e := newEnv(t, "")
	e.start()
	// A slow bedroom light keeps good_night's first step in flight.
	slow := simulator.Faults{AckDelay: 300 * time.Millisecond}
	e.setFaults("bedroom-light", slow)
	first := e.trigger("good_night", "single-1", nil)["mission_id"].(string)
	b, _ := json.Marshal(map[string]any{"scene": "good_night", "request_id": "single-2"})
	e.publish(string(b))
	if r := e.reply("single-2"); r["status"] != "rejected" || r["reason"] != "already_running" {
		t.Errorf("second single run: %v", r)
	}
	e.waitState(first, driver.StateSucceeded, 30*time.Second)
	e.setFaults("bedroom-light", simulator.Faults{})

	// queued: the second run waits, paused, and starts when the first ends.
	e.setFaults("living-light", slow)
	q1 := e.trigger("leave_home", "queued-1", nil)["mission_id"].(string)
	r2 := e.trigger("leave_home", "queued-2", nil)
	if r2["state"] != string(driver.StatePaused) {
		t.Errorf("queued run state %v, want PAUSED", r2["state"])
	}
	q2 := r2["mission_id"].(string)
	e.waitState(q1, driver.StateSucceeded, 30*time.Second)
	e.waitState(q2, driver.StateSucceeded, 30*time.Second)
	e.mu.Lock()
	var q1End, q2Start time.Time
	for _, ev := range e.events[q1] {
		if ev.To.Terminal() {
			q1End = ev.Time
		}
	}
	for _, ev := range e.events[q2] {
		if ev.Input == driver.InResume {
			q2Start = ev.Time
		}
	}
	e.mu.Unlock()
	if q2Start.IsZero() || q2Start.Before(q1End) {
		t.Errorf("queued run resumed at %v, before the first ended at %v", q2Start, q1End)
	}
	e.setFaults("living-light", simulator.Faults{})

	// restart: the running go_home is cancelled (and undone), the new one runs.
	e.setFaults("living-ac", simulator.Faults{AckDelay: 500 * time.Millisecond})
	g1 := e.trigger("go_home", "restart-1", nil)["mission_id"].(string)
	e.waitEvent(g1, func(ev agent.EventMessage) bool { return ev.Input == driver.InBeginStep && ev.Step == 1 }, 20*time.Second)
	g2 := e.trigger("go_home", "restart-2", nil)["mission_id"].(string)
	e.waitState(g1, driver.StateCancelled, 30*time.Second)
	e.waitState(g2, driver.StateSucceeded, 30*time.Second)
	// The replaced run says why it was cancelled: no operator asked.
	e.mu.Lock()
	var reason string
	for _, ev := range e.events[g1] {
		if ev.Input == driver.InCompensate || ev.Input == driver.InCancel {
			reason = ev.Detail // the first: the cancellation itself
			break
		}
	}
	e.mu.Unlock()
	if !strings.Contains(reason, "replaced by a new run of go_home (restart mode, request restart-2)") {
		t.Errorf("replaced run's cancel reason = %q", reason)
	}
}

// TestCompactCommand: `agent compact` refuses while the agent runs,
// shrinks the database once it is stopped, and keeps a file it cannot
// shrink, saying so.
func TestCompactCommand(t *testing.T) {
	e := newEnv(t, "")
	p := e.start()
	id := e.trigger("go_home", "c1", nil)["mission_id"].(string)
	e.waitState(id, driver.StateSucceeded, 20*time.Second)
	out, err := exec.Command(agentBin, "compact", "-config", e.cfgPath).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "stop the agent first") {
		t.Fatalf("compact while running: %v\n%s", err, out)
	}
	p.stop(t, syscall.SIGTERM)
	out, err = exec.Command(agentBin, "compact", "-config", e.cfgPath).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "compacted") {
		t.Fatalf("compact: %v\n%s", err, out)
	}
	// Compacted already, the file has nothing to give back: kept, and said.
	out, err = exec.Command(agentBin, "compact", "-config", e.cfgPath).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "kept") || !strings.Contains(string(out), "no smaller") {
		t.Fatalf("compact of a compacted file: %v\n%s", err, out)
	}
	t.Logf("compact again: %s", strings.TrimSpace(string(out)))
	e.start()
	var m map[string]any
	if code := e.get("/api/missions/"+id, &m); code != 200 {
		t.Fatalf("mission after compaction: %d", code)
	}
}

// TestRunOnATakenPortSaysWhichFlagMovesIt: an agent whose broker port is
// taken (another broker, another demo) exits with the bind error and
// the flags and config keys that choose another port.
func TestRunOnATakenPortSaysWhichFlagMovesIt(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	cmd := exec.Command(agentBin, "run", "-config", testkit.RepoPath("configs/agent.toml"), "-data", t.TempDir(),
		"-broker-listen", ln.Addr().String(), "-http", "127.0.0.1:0")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the agent ran on a taken port:\n%s", out)
	}
	for _, want := range []string{"address already in use", "-broker-listen and -http choose others"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestRunWithAnUnknownDemoTriggerExitsAsAUsageError: -trigger names a
// scene the agent does not have: it says so, with the scenes it has,
// and exits 2, rather than running on with a warning in its log.
func TestRunWithAnUnknownDemoTriggerExitsAsAUsageError(t *testing.T) {
	cmd := exec.Command(agentBin, "run", "-config", testkit.RepoPath("configs/agent.toml"), "-data", t.TempDir(),
		"-broker-listen", "127.0.0.1:0", "-http", "127.0.0.1:0", "-trigger", "go_hom")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "-trigger go_hom: no such scene (have all_off, go_home,") {
		t.Errorf("exit %v, output:\n%s\nwant exit 2 naming the scenes", err, out)
	}
}
