package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/hub"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/simulator"
)

// hubProc runs the hub binary.
type hubProc struct {
	t                 *testing.T
	cfg, broker, http string
	token             string
	cmd               *exec.Cmd
	exited            chan error
	log               *strings.Builder
	mu                sync.Mutex
}

func startHubProc(t *testing.T, passwords map[string]string) *hubProc {
	dir := t.TempDir()
	h := &hubProc{t: t, broker: testkit.FreeAddr(t), http: testkit.FreeAddr(t), token: "system-test-token"}
	var gws strings.Builder
	for gw, pw := range passwords {
		hash, err := hub.HashPassword(pw)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&gws, "%s = %q\n", gw, hash)
	}
	h.cfg = filepath.Join(dir, "hub.toml")
	writeFile(t, h.cfg, fmt.Sprintf(`data_dir = %q
[broker]
listen = %q
[http]
listen = %q
token = %q
[log]
level = "debug"
[gateways]
%s`, filepath.Join(dir, "data"), h.broker, h.http, h.token, gws.String()))
	h.start()
	return h
}

func (h *hubProc) start() {
	h.t.Helper()
	h.cmd = exec.Command(hubBin, "run", "-config", h.cfg)
	h.log = new(strings.Builder)
	stderr, _ := h.cmd.StderrPipe()
	h.cmd.Stdout = io.Discard
	if err := h.cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	h.exited = make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		once := sync.Once{}
		for sc.Scan() {
			h.mu.Lock()
			h.log.WriteString(sc.Text() + "\n")
			h.mu.Unlock()
			if strings.Contains(sc.Text(), "http listening") {
				once.Do(func() { close(ready) })
			}
		}
		h.exited <- h.cmd.Wait()
	}()
	h.t.Cleanup(func() {
		if h.cmd.ProcessState == nil {
			_ = h.cmd.Process.Kill() // the test is over; it may be exiting by itself
			if err := <-h.exited; h.t.Failed() {
				h.t.Logf("hub ended: %v", err)
			}
		}
		if h.t.Failed() {
			h.mu.Lock()
			h.t.Logf("hub log:\n%s", h.log.String())
			h.mu.Unlock()
		}
	})
	select {
	case <-ready:
	case err := <-h.exited:
		h.t.Fatalf("hub exited: %v\n%s", err, h.log)
	case <-time.After(20 * time.Second):
		h.t.Fatal("hub not ready")
	}
}

func (h *hubProc) stop() {
	if err := h.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		h.t.Fatal(err)
	}
	err := testkit.Receive(h.t, h.exited, 20*time.Second, "hub did not stop")
	if err != nil {
		h.t.Errorf("hub on SIGTERM: %v", err)
	}
}

func (h *hubProc) api(method, path string, body any, out any) int {
	h.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, "http://"+h.http+path, rd)
	req.Header.Set("Authorization", "Bearer "+h.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }() // read to the end: nothing left to report
	b, _ := io.ReadAll(resp.Body)
	if out != nil && json.Unmarshal(b, out) != nil {
		h.t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	return resp.StatusCode
}

type hubMission struct {
	Gateway  string         `json:"gateway"`
	ID       string         `json:"id"`
	Summary  driver.Summary `json:"summary"`
	Seq      uint64         `json:"seq"`
	Events   int            `json:"events"`
	Gaps     []any          `json:"gaps"`
	Timeline []driver.Event `json:"timeline"`
}

// waitOnline waits until the hub sees gw online (after a restart the
// gateway reconnects within its backoff).
func (h *hubProc) waitOnline(gw string) {
	h.t.Helper()
	testkit.Until(h.t, 30*time.Second, func() error { // polling an HTTP API
		var out struct {
			Gateways []struct {
				ID    string `json:"id"`
				State string `json:"state"`
			} `json:"gateways"`
		}
		h.api("GET", "/api/gateways", nil, &out)
		for _, g := range out.Gateways {
			if g.ID == gw && g.State == "online" {
				return nil
			}
		}
		return fmt.Errorf("hub never saw %s online: %+v", gw, out)
	})
}

// hubTrace is the hub's record of one trigger.
type hubTrace struct {
	Records []struct {
		Seq       uint64 `json:"seq"`
		Via       string `json:"via"`
		Outcome   string `json:"outcome"`
		Reason    string `json:"reason"`
		MissionID string `json:"mission_id"`
	} `json:"records"`
}

// waitTrace waits until the hub holds n records of a gateway's trigger.
func (h *hubProc) waitTrace(gw, requestID string, n int) hubTrace {
	h.t.Helper()
	var tr hubTrace
	testkit.Eventually(h.t, 30*time.Second, fmt.Sprintf("the hub's record of %s's trigger %s", gw, requestID), func() bool {
		tr = hubTrace{}
		return h.api("GET", "/api/gateways/"+gw+"/why/"+requestID, nil, &tr) == http.StatusOK && len(tr.Records) >= n
	})
	return tr
}

// hubMissionOf fetches one mission with its timeline.
func (h *hubProc) mission(gw, id string) (hubMission, bool) {
	var m hubMission
	code := h.api("GET", "/api/gateways/"+gw+"/missions/"+id, nil, &m)
	return m, code == http.StatusOK
}

// waitHubMission waits until the hub holds the mission with as many
// events as the agent's timeline and in state want.
func (h *hubProc) waitMission(gw, id string, want driver.State, events int) hubMission {
	h.t.Helper()
	var m hubMission
	testkit.Until(h.t, 30*time.Second, func() error { // the hub pushes no event to await here
		var ok bool
		if m, ok = h.mission(gw, id); !ok || m.Summary.State != want || m.Events < events {
			return fmt.Errorf("hub: mission %s/%s is %+v, want %s with %d events", gw, id, m.Summary, want, events)
		}
		return nil
	})
	return m
}

// metricsText fetches the agent's /metrics.
func (e *testEnv) metricsText() string {
	e.t.Helper()
	e.proc.mu.Lock()
	addr := e.proc.http
	e.proc.mu.Unlock()
	resp, err := httpClient.Get("http://" + addr + "/metrics")
	if err != nil {
		e.t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }() // read to the end: nothing left to report
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// agentTimeline reads a mission's timeline from the agent's API.
func (e *testEnv) timeline(id string) []driver.Event {
	e.t.Helper()
	var out struct {
		Timeline []driver.Event `json:"timeline"`
	}
	if code := e.get("/api/missions/"+id, &out); code != http.StatusOK {
		e.t.Fatalf("agent GET mission %s: %d", id, code)
	}
	return out.Timeline
}

// checkExactlyOnce: the hub holds every event of the agent's timeline,
// each once, in order.
func checkExactlyOnce(t *testing.T, hm hubMission, agent []driver.Event) {
	t.Helper()
	if len(hm.Timeline) != len(agent) {
		t.Errorf("mission %s: hub has %d events, agent %d", hm.ID, len(hm.Timeline), len(agent))
		return
	}
	for i := range agent {
		if hm.Timeline[i].Seq != uint64(i+1) || hm.Timeline[i].Input != agent[i].Input || hm.Timeline[i].To != agent[i].To {
			t.Errorf("mission %s event %d: hub %+v, agent %+v", hm.ID, i, hm.Timeline[i], agent[i])
		}
	}
	if len(hm.Gaps) != 0 {
		t.Errorf("mission %s: gaps %v", hm.ID, hm.Gaps)
	}
}

// TestHubThreeGateways runs a hub and three agents (each with its own
// simulated home) as real processes.
func TestHubThreeGateways(t *testing.T) {
	if testing.Short() {
		t.Skip("runs four processes")
	}
	gws := []string{"gw1", "gw2", "gw3"}
	passwords := map[string]string{}
	for _, gw := range gws {
		passwords[gw] = "pw-" + gw
	}
	h := startHubProc(t, passwords)
	envs := map[string]*testEnv{}
	for _, gw := range gws {
		e := newGatewayEnv(t, gw, fmt.Sprintf("[hub]\nurl = %q\npassword = %q\nheartbeat = \"1s\"\n", "tcp://"+h.broker, passwords[gw]))
		e.start()
		envs[gw] = e
	}

	// missions visible with final states
	t.Log("missions visible with final states")
	{
		for _, gw := range gws {
			e := envs[gw]
			id := e.trigger("go_home", "first-"+gw, nil)["mission_id"].(string)
			e.waitState(id, driver.StateSucceeded, 20*time.Second)
			tl := e.timeline(id)
			checkExactlyOnce(t, h.waitMission(gw, id, driver.StateSucceeded, len(tl)), tl)
		}
		var list struct {
			Missions []hubMission `json:"missions"`
		}
		h.api("GET", "/api/missions?state=SUCCEEDED", nil, &list)
		if len(list.Missions) != 3 {
			t.Errorf("hub lists %d succeeded missions, want 3", len(list.Missions))
		}
		// The gateway's sync shows in its metrics.
		metrics := envs["gw1"].metricsText()
		for _, want := range []string{"sortie_hub_connected 1", `sortie_hub_broker{broker="tcp://` + h.broker + `"} 1`, "sortie_outbox_entries", "sortie_hub_sync_lag_seconds", "sortie_outbox_compacted_total 0"} {
			if !strings.Contains(metrics, want) {
				t.Errorf("gw1 /metrics lacks %q", want)
			}
		}
		if promtool, err := exec.LookPath("promtool"); err == nil {
			cmd := exec.Command(promtool, "check", "metrics")
			cmd.Stdin = strings.NewReader(metrics)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("promtool: %v\n%s", err, out)
			}
		}
	}

	// trigger records reach the hub
	t.Log("trigger records reach the hub")
	{
		e := envs["gw1"]
		e.publish(`{"scene":"no_such_scene","request_id":"why-gw1","source":"test"}`)
		if r := e.reply("why-gw1"); r["reason"] != "unknown_scene" {
			t.Fatalf("reply = %v", r)
		}
		rec := h.waitTrace("gw1", "why-gw1", 1)
		if rec.Records[0].Outcome != "rejected" || rec.Records[0].Reason != "unknown_scene" || rec.Records[0].Via != "mqtt" {
			t.Errorf("hub's record of why-gw1 = %+v", rec)
		}
		if acc := h.waitTrace("gw1", "first-gw1", 1); acc.Records[0].Outcome != "accepted" || acc.Records[0].MissionID == "" {
			t.Errorf("hub's record of first-gw1 = %+v", acc)
		}
	}

	// hub down during missions
	t.Log("hub down during missions")
	{
		h.stop()
		ids := map[string]string{}
		for _, gw := range gws {
			e := envs[gw]
			ids[gw] = e.trigger("good_night", "night-"+gw, nil)["mission_id"].(string)
		}
		// A rejection while the hub is away reaches it when it is back.
		envs["gw3"].publish(`{"scene":"good_night","request_id":"night-gw3-again","params":{"x":1}}`)
		envs["gw3"].reply("night-gw3-again")
		for _, gw := range gws {
			envs[gw].waitState(ids[gw], driver.StateSucceeded, 30*time.Second)
		}
		h.start()
		for _, gw := range gws {
			tl := envs[gw].timeline(ids[gw])
			checkExactlyOnce(t, h.waitMission(gw, ids[gw], driver.StateSucceeded, len(tl)), tl)
		}
		if rec := h.waitTrace("gw3", "night-gw3-again", 1); rec.Records[0].Reason != "invalid_param" {
			t.Errorf("hub's record of night-gw3-again = %+v", rec)
		}
	}

	// agent killed with pending outbox
	t.Log("agent killed with pending outbox")
	{
		e := envs["gw2"]
		h.stop()
		id := e.trigger("leave_home", "leave-gw2", nil)["mission_id"].(string)
		e.waitState(id, driver.StateSucceeded, 30*time.Second)
		tl := e.timeline(id)
		e.proc.stop(t, syscall.SIGKILL)
		h.start()
		e.start()
		checkExactlyOnce(t, h.waitMission("gw2", id, driver.StateSucceeded, len(tl)), tl)
	}

	// remote cancel and retry act on the right gateway
	t.Log("remote cancel and retry act on the right gateway")
	{
		e1, e3 := envs["gw1"], envs["gw3"]
		for _, gw := range gws {
			h.waitOnline(gw)
		}
		// A mission on gw1 held up by a slow device, and one on gw3.
		e1.setFaults("living-ac", simulator.Faults{AckDelay: 1500 * time.Millisecond})
		m1 := e1.trigger("go_home", "slow-gw1", nil)["mission_id"].(string)
		e1.waitEvent(m1, func(ev agent.EventMessage) bool { return ev.Input == driver.InBeginStep && ev.Step == 1 }, 20*time.Second)
		var res struct {
			OK        bool         `json:"ok"`
			MissionID string       `json:"mission_id"`
			State     driver.State `json:"state"`
			Error     string       `json:"error"`
		}
		if code := h.api("POST", "/api/gateways/gw1/control", map[string]any{"action": "cancel", "mission_id": m1}, &res); code != http.StatusOK || !res.OK {
			t.Fatalf("hub cancel: %d %+v", code, res)
		}
		e1.waitState(m1, driver.StateCancelled, 30*time.Second)
		e1.setFaults("living-ac", simulator.Faults{})
		wantState(t, e1.device("living-light"), map[string]any{"power": "off"}) // compensated

		// Cancelling gw1's mission through gw3 finds nothing there.
		if code := h.api("POST", "/api/gateways/gw3/control", map[string]any{"action": "cancel", "mission_id": m1}, &res); code == http.StatusOK && res.OK {
			t.Errorf("gw3 cancelled gw1's mission: %+v", res)
		}

		// A failed mission on gw3, retried from the hub once fixed.
		e3.setFaults("front-door", simulator.Faults{Jammed: true})
		m3 := e3.trigger("movie_night", "movie-gw3", nil)["mission_id"].(string)
		e3.waitState(m3, driver.StateFailed, 60*time.Second)
		e3.setFaults("front-door", simulator.Faults{})
		if code := h.api("POST", "/api/gateways/gw3/control", map[string]any{"action": "retry", "mission_id": m3}, &res); code != http.StatusOK || !res.OK {
			t.Fatalf("hub retry: %d %+v", code, res)
		}
		e3.waitState(m3, driver.StateSucceeded, 60*time.Second)
		wantState(t, e3.device("front-door"), map[string]any{"locked": true})
		tl := e3.timeline(m3)
		checkExactlyOnce(t, h.waitMission("gw3", m3, driver.StateSucceeded, len(tl)), tl)

		// And a scene run from the hub.
		if code := h.api("POST", "/api/gateways/gw1/control", map[string]any{"action": "trigger", "scene": "go_home", "params": map[string]any{"temperature": 21}}, &res); code != http.StatusOK || !res.OK {
			t.Fatalf("hub trigger: %d %+v", code, res)
		}
		e1.waitState(res.MissionID, driver.StateSucceeded, 30*time.Second)
		wantState(t, e1.device("living-ac"), map[string]any{"target": 21})
	}

	// a gateway cannot speak for another
	t.Log("a gateway cannot speak for another")
	{
		c := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + h.broker).SetClientID("intruder").
			SetUsername("gw1").SetPassword(passwords["gw1"]).SetAutoReconnect(false))
		if tok := c.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Fatalf("connect as gw1: %v", tok.Error())
		}
		defer c.Disconnect(10)
		fake := `{"gateway":"gw2","entries":[{"seq":999999,"event":{"mission_id":"forged","seq":1,"input":"submit","to":"SUCCEEDED","step":-1,"time":"2026-01-01T00:00:00Z"},"mission":{"scene":"go_home","state":"SUCCEEDED"}}]}`
		c.Publish("sortie/hub/gateways/gw2/events", 1, false, fake).WaitTimeout(5 * time.Second)
		c.Publish("sortie/hub/gateways/gw2/control", 1, false, `{"id":"x1","action":"trigger","scene":"go_home"}`).WaitTimeout(5 * time.Second)
		// Let a legitimate round trip pass through the hub after them, so
		// the forged messages had every chance to land.
		e2 := envs["gw2"]
		id := e2.trigger("go_home", "after-intruder", nil)["mission_id"].(string)
		e2.waitState(id, driver.StateSucceeded, 20*time.Second)
		h.waitMission("gw2", id, driver.StateSucceeded, len(e2.timeline(id)))
		if _, ok := h.mission("gw2", "forged"); ok {
			t.Error("hub stored a mission gw1 forged under gw2's topic")
		}
		e2.mu.Lock()
		for _, ev := range e2.events {
			for _, x := range ev {
				if x.RequestID == "hub-x1" {
					t.Error("gw2 obeyed a control message sent by gw1")
				}
			}
		}
		e2.mu.Unlock()
	}
}
