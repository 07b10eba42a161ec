package main

import (
	"bytes"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

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
	_ = resp.Body.Close() // read to the end: nothing left to report
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d", resp.StatusCode)
	}
	for _, want := range []string{
		`sortie_missions_started_total{scene="go_home"} 1`,
		`sortie_missions_finished_total{outcome="succeeded",scene="go_home"} 1`,
		`sortie_missions{state="succeeded"} 1`,
		`sortie_step_duration_seconds_count{action="turn_on",device_type="light",result="ok"} 1`,
		`sortie_device_ack_latency_seconds_count{device_type="ac"} 1`,
		`sortie_device_ack_timeouts_total{device_type="light"} 0`,
		`sortie_broker_connected 1`,
		`sortie_retention_pruned_total{kind="mission"} 0`,
		`sortie_store_commit_duration_seconds_count `,
		`sortie_store_bytes `,
		`sortie_store_wal_bytes `,
		`sortie_device_online{device="living-light",device_type="light"} 1`,
		`sortie_build_info{goversion="`,
		`sortie_abandoned_handlers 0`,
		`sortie_driver_refused_transitions_total 0`,
		`sortie_parked_steps 0`,
		`sortie_link_in_flight{link="none"} 0`,
		`sortie_link_queued{link="none"} 0`,
		`sortie_link_wait_seconds_count{link="none"} 3`,
		`sortie_trigger_rejections_total{reason="bad_json"} 0`,
		`sortie_device_unmatched_acks_total{reason="malformed"} 0`,
		`sortie_device_unmatched_acks_total{reason="unknown_command"} 0`,
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
