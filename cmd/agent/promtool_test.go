package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sortie-edge/sortie/driver"
)

// TestMetricsChangeAndPassPromtool runs a mission through the real agent,
// checks that the mission metrics moved, and lints /metrics with promtool.
func TestMetricsChangeAndPassPromtool(t *testing.T) {
	promtool := needTool(t, "promtool", "prometheus")
	e := newEnv(t, "")
	e.start()
	r := e.trigger("go_home", "m1", nil)
	e.waitState(r["mission_id"].(string), driver.StateSucceeded, 20*time.Second)
	e.proc.mu.Lock()
	addr := e.proc.http
	e.proc.mu.Unlock()
	resp, err := httpClient.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d", resp.StatusCode)
	}
	for _, want := range []string{
		`sortie_missions_started_total{scene="go_home"} 1`,
		`sortie_missions_finished_total{outcome="SUCCEEDED",scene="go_home"} 1`,
		`sortie_missions{state="SUCCEEDED"} 1`,
		`sortie_step_duration_seconds_count{action="turn_on",device_type="light",result="ok"} 1`,
		`sortie_device_ack_latency_seconds_count{device_type="ac"} 1`,
		`sortie_broker_connected 1`,
		`sortie_abandoned_handlers 0`,
		`sortie_trigger_rejections_total{reason="bad_json"} 0`,
		"go_goroutines", "process_resident_memory_bytes",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}

// TestMetricsFromEvents checks the event-driven metrics with testutil,
// without a process: a retried step, a failure class and compensation.
func TestMetricsFromEvents(t *testing.T) {
	m := newMetrics()
	m.setDeviceTypes(map[string]string{"living-light": "light"})
	ms := &driver.Mission{ID: "m", Type: "go_home", Steps: []driver.Step{{ID: "s", Kind: "device.command", Params: []byte(`{"device":"living-light","action":"turn_on"}`)}}}
	now := time.Now()
	for _, ev := range []driver.Event{
		{Input: driver.InSubmit, To: driver.StatePending, Time: now},
		{Input: driver.InBeginStep, Step: 0, Attempt: 1, Time: now},
		{Input: driver.InStepError, Step: 0, Attempt: 1, Detail: "retryable", Code: "ack_timeout", Time: now.Add(2 * time.Second)},
		{Input: driver.InBeginStep, Step: 0, Attempt: 2, Time: now.Add(3 * time.Second)},
		{Input: driver.InStepOK, Step: 0, Attempt: 2, Time: now.Add(3*time.Second + 5*time.Millisecond)},
		{Input: driver.InCompResult, Step: 0, Detail: "compensated", Time: now},
		{Input: driver.InCompResult, Step: 0, Detail: "compensation failed", Time: now},
		{Input: driver.InFail, To: driver.StateFailed, Time: now},
	} {
		m.Observe(ev, ms)
	}
	check := func(name, want string) {
		t.Helper()
		if err := testutil.CollectAndCompare(m.reg, strings.NewReader(want), name); err != nil {
			t.Error(err)
		}
	}
	check("sortie_step_retries_total", `
# HELP sortie_step_retries_total Step attempts after the first, by scene.
# TYPE sortie_step_retries_total counter
sortie_step_retries_total{scene="go_home"} 1
`)
	check("sortie_step_failures_total", `
# HELP sortie_step_failures_total Failed step attempts, by error class and code.
# TYPE sortie_step_failures_total counter
sortie_step_failures_total{class="retryable",code="ack_timeout"} 1
`)
	check("sortie_compensations_total", `
# HELP sortie_compensations_total Compensation attempts that finished, by result (succeeded, failed, retry).
# TYPE sortie_compensations_total counter
sortie_compensations_total{result="failed"} 1
sortie_compensations_total{result="succeeded"} 1
`)
	check("sortie_missions_finished_total", fmt.Sprintf(`
# HELP sortie_missions_finished_total Missions that reached a terminal state, by scene and outcome.
# TYPE sortie_missions_finished_total counter
sortie_missions_finished_total{outcome=%q,scene="go_home"} 1
`, "FAILED"))
	if n := testutil.CollectAndCount(m.reg, "sortie_step_duration_seconds"); n != 2 {
		t.Errorf("step duration series: %d, want 2 (error and ok)", n)
	}
}
