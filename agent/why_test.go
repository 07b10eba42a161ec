package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/agent/agenttest"
	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/scenes"
)

// traceScenes have no devices: a delay step is all a mission needs here.
const traceScenes = `
[[scene]]
name = "quick"
mode = "parallel"
[[scene.step]]
delay = "1ms"

[[scene]]
name = "long"
deadline = "1h"
[[scene.step]]
delay = "30m"

[[scene]]
name = "dimmed"
mode = "parallel"
[[scene.step]]
device = "living-light"
action = "set"
params = { brightness = { from = "level" } }
`

// startAgent starts an agent of the scenes cat on the data directory
// dir, its traces flushed soon, and runs it until stopped.
func startAgent(t testing.TB, dir string, cat *scenes.Catalog, reg *devices.Registry, tune func(*agent.Options)) *agenttest.Agent {
	t.Helper()
	o := agent.Options{DataDir: dir, Registry: reg, Catalog: cat, QuietMissions: true,
		Traces: agent.TraceOptions{FlushInterval: 20 * time.Millisecond}}
	if tune != nil {
		tune(&o)
	}
	return agenttest.Start(t, o)
}

// TestWhyAnswersEveryTriggerAfterARestart: every trigger, accepted,
// resent or rejected for any reason, is answered by why with its outcome
// and reason after the agent was stopped and started again.
func TestWhyAnswersEveryTriggerAfterARestart(t *testing.T) {
	reg, cat := agenttest.Scenes(t, "configs/devices.toml", traceScenes)
	dir := t.TempDir()
	a := startAgent(t, dir, cat, reg, nil)
	ctx := context.Background()
	type want struct{ outcome, reason string }
	wants := map[string]want{}
	send := func(body map[string]any, w want) {
		id := body["request_id"].(string)
		_, err := a.API.Call(ctx, http.MethodPost, "/api/missions", body, nil)
		var ce *api.CallError
		if err != nil && !errors.As(err, &ce) {
			t.Fatalf("%s: %v", id, err)
		}
		wants[id] = w
	}
	for i := range 60 {
		id := fmt.Sprintf("r-%03d", i)
		switch i % 6 {
		case 0, 1:
			send(map[string]any{"scene": "quick", "request_id": id}, want{"accepted", ""})
		case 2:
			send(map[string]any{"scene": "nope", "request_id": id}, want{"rejected", scenes.ReasonUnknownScene})
		case 3:
			send(map[string]any{"scene": "dimmed", "request_id": id, "params": map[string]any{"level": 1000}}, want{"rejected", scenes.ReasonInvalidParam})
		case 4:
			send(map[string]any{"scene": "quick", "request_id": id, "not_after": time.Now().Add(-time.Minute).Format(time.RFC3339)}, want{"rejected", scenes.ReasonDeadlinePassed})
		case 5:
			send(map[string]any{"scene": "quick", "request_id": fmt.Sprintf("r-%03d", i-5)}, want{"duplicate", ""})
		}
	}
	send(map[string]any{"scene": "long", "request_id": "long-1"}, want{"accepted", ""})
	send(map[string]any{"scene": "long", "request_id": "long-2"}, want{"rejected", scenes.ReasonAlreadyRunning})
	send(map[string]any{"scene": "quick", "request_id": "bad", "params": map[string]any{"x": []int{1}}}, want{"rejected", scenes.ReasonInvalidParam})
	a.Stop()

	a = startAgent(t, dir, cat, reg, nil)
	for id, w := range wants {
		var ans api.Why
		if _, err := a.API.Call(ctx, http.MethodGet, "/api/why/"+id, nil, &ans); err != nil {
			t.Errorf("why %s: %v", id, err)
			continue
		}
		if ans.Outcome != w.outcome || ans.Reason != w.reason {
			t.Errorf("why %s: %s/%s, want %s/%s (%s)", id, ans.Outcome, ans.Reason, w.outcome, w.reason, ans.Explanation)
		}
		if w.outcome != "rejected" && (ans.Mission == nil || len(ans.Mission.Timeline) == 0) {
			t.Errorf("why %s: accepted, but no mission timeline in the answer", id)
		}
		if w.outcome == "rejected" && !strings.Contains(ans.Explanation, "Nothing was started") {
			t.Errorf("why %s: explanation %q does not say nothing was started", id, ans.Explanation)
		}
	}
	var dup api.Why
	if _, err := a.API.Call(ctx, http.MethodGet, "/api/why/r-000", nil, &dup); err != nil {
		t.Fatal(err)
	}
	if len(dup.Evaluations) != 2 || dup.Evaluations[0].Outcome != "accepted" || dup.Evaluations[1].Via != "api" {
		t.Errorf("r-000 evaluations = %+v, want accepted then duplicate, via api", dup.Evaluations)
	}
	_, err := a.API.Call(ctx, http.MethodGet, "/api/why/never-sent", nil, nil)
	var ce *api.CallError
	if !errors.As(err, &ce) || ce.Status != http.StatusNotFound {
		t.Errorf("why of an unknown request: %v, want a 404", err)
	}
	var list api.WhyList
	if _, err := a.API.Call(ctx, http.MethodGet, "/api/why?limit=5", nil, &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Traces) != 5 || list.Traces[0].Outcome != "rejected" {
		t.Errorf("latest failed: %d records, first %+v", len(list.Traces), list.Traces)
	}
}

// TestWhyIsAnsweredAtOnceAfterTheReply: the record of a trigger is
// readable as soon as its reply is, before the batch is written.
func TestWhyIsAnsweredAtOnceAfterTheReply(t *testing.T) {
	reg, cat := agenttest.Scenes(t, "configs/devices.toml", traceScenes)
	a := startAgent(t, t.TempDir(), cat, reg, func(o *agent.Options) { o.Traces.FlushInterval = time.Hour })
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			_, _ = a.API.Call(ctx, http.MethodPost, "/api/missions", map[string]any{"scene": "nope", "request_id": fmt.Sprintf("n-%d", i)}, nil) // rejected: that is the point
		})
	}
	wg.Wait()
	for i := range 20 {
		w, err := a.Why(ctx, fmt.Sprintf("n-%d", i))
		if err != nil || w.Reason != scenes.ReasonUnknownScene {
			t.Fatalf("why n-%d: %+v, %v", i, w, err)
		}
	}
}

// TestAPathThatIsNotCanonicalIsAJSONNotFound: "..", "." and "//" are not
// redirected in plain text, as the mux would, but refused in JSON, as
// every error of the API is.
func TestAPathThatIsNotCanonicalIsAJSONNotFound(t *testing.T) {
	reg, cat := agenttest.Scenes(t, "configs/devices.toml", traceScenes)
	a := startAgent(t, t.TempDir(), cat, reg, nil)
	for _, p := range []string{"/api/missions/../../etc/passwd", "/api//missions", "/api/./why/x"} {
		resp, err := http.Get(a.Addrs().API + p)
		if err != nil {
			t.Fatal(err)
		}
		var body struct {
			Error struct{ Code string } `json:"error"`
		}
		err = json.NewDecoder(resp.Body).Decode(&body)
		_ = resp.Body.Close() // read
		if resp.StatusCode != http.StatusNotFound || err != nil || body.Error.Code != "not_found" {
			t.Errorf("GET %s: %d, %v, %+v; want a JSON 404", p, resp.StatusCode, err, body)
		}
	}
}
