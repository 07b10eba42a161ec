package hub

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/uplink"
)

// TestMetricsCountTheFleetWithoutALabelPerGateway: /metrics, open like
// the agent's, counts stored and resent events, trigger records and
// control requests by result, and gateways by state; no series names a
// gateway; promtool finds nothing to fix.
func TestMetricsCountTheFleetWithoutALabelPerGateway(t *testing.T) {
	e := newEnv(t, "home", "attic")
	g := newGateway(t, e.broker.URL(), "home")
	g.online(t)
	e.waitOnline(t, "home")
	g.send(t, entry(1, "m1", 1, driver.StatePending), entry(2, "m1", 2, driver.StateRunning))
	g.waitAck(t, 2)
	g.send(t, entry(2, "m1", 2, driver.StateRunning)) // a resend
	g.waitAck(t, 2)
	g.publish(t, uplink.Topics{}.Traces("home"), false, uplink.TraceBatch{Gateway: "home", Traces: []uplink.TraceRecord{
		{Seq: 1, RequestID: "r-1", Outcome: uplink.OutcomeRejected, Reason: "unknown_scene"}}})
	if code := e.do(t, "POST", "/api/gateways/attic/control", `{"action":"cancel","mission_id":"m9"}`, nil); code != http.StatusServiceUnavailable {
		t.Fatalf("control to an offline gateway: %d", code)
	}
	// Wait for the record through the API: then every count above is in.
	deadline := time.Now().Add(wait)
	for e.do(t, "GET", "/api/gateways/home/why/r-1", "", nil) != http.StatusOK {
		if time.Now().After(deadline) {
			t.Fatal("the trigger record never arrived")
		}
		time.Sleep(5 * time.Millisecond) // polling the API: nothing signals a stored record to a client
	}

	res, err := http.Get(e.http.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(res.Body)
	_ = res.Body.Close() // read
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", res.StatusCode, err)
	}
	text := string(body)
	for _, want := range []string{
		"sortie_hub_events_stored_total 2",
		"sortie_hub_events_duplicate_total 1",
		"sortie_hub_trace_records_total 1",
		`sortie_hub_controls_total{action="cancel",result="offline"} 1`,
		`sortie_hub_gateways{state="online"} 1`,
		`sortie_hub_gateways{state="unknown"} 1`,
		"sortie_hub_broker_connected 1",
		"sortie_hub_ingest_lag_seconds_count",
		"sortie_hub_store_bytes",
		"go_goroutines",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(text, `"home"`) || strings.Contains(text, `"attic"`) {
		t.Error("/metrics names a gateway in a label")
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool not found; .ci/run should have installed Debian's prometheus package")
		}
		t.Skip("promtool not found (apt-get install prometheus)")
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(text)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}
