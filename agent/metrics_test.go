package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/devices/wire"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/store"
)

// scrape returns what h serves at /metrics to a scraper that asks for
// no format in particular: the text format 0.0.4.
func scrape(t testing.TB, h http.Handler) string {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d\n%s", rec.Code, rec.Body)
	}
	return rec.Body.String()
}

// familyText returns the lines of one family in what h serves at
// /metrics: its # HELP and # TYPE lines and its samples.
func familyText(t testing.TB, h http.Handler, name string) string {
	t.Helper()
	for block := range strings.SplitSeq(scrape(t, h), "# HELP ") {
		if strings.HasPrefix(block, name+" ") {
			return "# HELP " + block
		}
	}
	return ""
}

// seriesCount counts the series of a family in what reg writes (for a
// histogram, its _count lines).
func seriesCount(t testing.TB, reg http.Handler, name string) int {
	t.Helper()
	n := 0
	for line := range strings.Lines(familyText(t, reg, name)) {
		if rest, ok := strings.CutPrefix(line, name); ok && !strings.HasPrefix(line, "#") &&
			(strings.HasPrefix(rest, "{") || strings.HasPrefix(rest, " ") || strings.HasPrefix(rest, "_count")) {
			n++
		}
	}
	return n
}

// TestMetricsFromEvents checks the event-driven metrics as /metrics
// writes them, without a process: a retried step, a failure class and
// compensation.
func TestMetricsFromEvents(t *testing.T) {
	m := newInstruments()
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
		if got := familyText(t, m.reg, name); got != strings.TrimPrefix(want, "\n") {
			t.Errorf("%s:\n%s\nwant:\n%s", name, got, want)
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
	check("sortie_missions_finished_total", `
# HELP sortie_missions_finished_total Mission runs that ended, by scene and outcome (succeeded, failed, cancelled); a retried mission counts once per run.
# TYPE sortie_missions_finished_total counter
sortie_missions_finished_total{outcome="failed",scene="go_home"} 1
`)
	if n := seriesCount(t, m.reg, "sortie_step_duration_seconds"); n != 2 {
		t.Errorf("step duration series: %d, want 2 (error and ok)", n)
	}
}

// The class label of sortie_step_failures_total takes one value per
// error class, however the failures are retried (here with jitter).
// Found by review: the label is the step_error event's Detail, which the
// driver overwrote with text that varied from failure to failure (see
// driver's TestStepErrorEventDetailIsErrorClass).
func TestStepFailureClassLabelIsBounded(t *testing.T) {
	db, err := store.Open(filepath.Join(t.TempDir(), "m.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := db.Close(); err != nil {
			t.Errorf("close store: %v", err)
		}
	}()
	m := newInstruments()
	done := make(chan struct{}, 100)
	h := driver.HandlerFunc(func(ctx context.Context, req driver.StepRequest) (map[string]any, error) {
		return nil, driver.RetryableError("busy", errors.New("busy"))
	})
	d, err := driver.New(driver.Options{Store: db, Handlers: map[string]driver.Handler{"x": h},
		Observers: []driver.Observer{m, driver.ObserverFunc(func(ev driver.Event, _ *driver.Mission) {
			if ev.To.Terminal() {
				done <- struct{}{}
			}
		})}})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := d.Stop(context.Background()); err != nil {
			t.Errorf("stop driver: %v", err)
		}
	}()
	const n = 20
	for range n {
		if _, _, err := d.Submit(context.Background(), driver.Spec{Type: "s", Steps: []driver.Step{{ID: "a", Kind: "x",
			Retry: driver.RetryPolicy{MaxAttempts: 3, InitialBackoff: driver.Duration(5 * time.Millisecond), Jitter: 0.5}}}}); err != nil {
			t.Fatal(err)
		}
	}
	for range n {
		<-done
	}
	series := seriesCount(t, m.reg, "sortie_step_failures_total")
	t.Logf("sortie_step_failures_total series after %d missions with code=busy: %d", n, series)
	if series > 1 {
		t.Errorf("class label is not bounded: %d series for one class and one code", series)
	}
}

// TestUnmatchedAcksMetric: acks a device sends that match no command,
// malformed or for an ID never sent, show in
// sortie_device_unmatched_acks_total by reason, read from a real client
// on a real broker; both reasons are there from the first scrape.
func TestUnmatchedAcksMetric(t *testing.T) {
	b := brokertest.Start(t)
	stray := make(chan struct{}, 1)
	c, err := devices.Dial(t.Context(), devices.Options{
		Broker: b.URL(), ClientID: "metrics-acks", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnStrayAck: func(string, wire.Ack, bool) { stray <- struct{}{} },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	// The broker closes first, with the client idle: mochi v2.7.9 can
	// deadlock in Close when a client leaves at the same moment (see
	// devices' closeBrokerFirst).
	t.Cleanup(func() { _ = b.Close() })
	m := newInstruments()
	m.watch(stubQueue{}, c)
	check := func(malformed, unknown int) {
		t.Helper()
		want := fmt.Sprintf(`# HELP sortie_device_unmatched_acks_total Acks that matched no command, by reason: malformed (not JSON, over 64 KiB, no id, negative without an error code) or unknown_command (an ID the agent did not send, sent before a restart, or long forgotten).
# TYPE sortie_device_unmatched_acks_total counter
sortie_device_unmatched_acks_total{reason="malformed"} %d
sortie_device_unmatched_acks_total{reason="unknown_command"} %d
`, malformed, unknown)
		if got := familyText(t, m.reg, "sortie_device_unmatched_acks_total"); got != want {
			t.Errorf("got:\n%s\nwant:\n%s", got, want)
		}
	}
	check(0, 0)
	topic := c.Topics().Ack("lamp")
	for _, p := range []string{`{"ok":true`, `{"ok":true}`, `{"id":"x","ok":false}`} {
		if err := b.Publish(topic, []byte(p), false, 1); err != nil {
			t.Fatal(err)
		}
	}
	// In order after the malformed ones, from the same publisher.
	if err := b.Publish(topic, []byte(`{"id":"never-sent","ok":true}`), false, 1); err != nil {
		t.Fatal(err)
	}
	testkit.Receive(t, stray, 5*time.Second, "the unknown ack never arrived")
	check(3, 1)
}

// stubQueue is a driver with nothing queued.
type stubQueue struct{}

func (stubQueue) Queue() driver.QueueStats { return driver.QueueStats{} }

// TestMetricsNegotiateOpenMetrics: /metrics answers a scraper that asks
// for OpenMetrics in OpenMetrics (its counters' families named without
// _total, and # EOF last), and anything else in the text format 0.0.4,
// with the same series.
func TestMetricsNegotiateOpenMetrics(t *testing.T) {
	m := newInstruments()
	m.rejected("bad_json")
	for _, tc := range []struct {
		name, accept, contentType string
		want                      []string
	}{
		{"text", "", "text/plain; version=0.0.4", []string{
			"# TYPE sortie_trigger_rejections_total counter\n",
			"sortie_trigger_rejections_total{reason=\"bad_json\"} 1\n",
		}},
		{"openmetrics", "application/openmetrics-text; version=1.0.0", "application/openmetrics-text; version=1.0.0", []string{
			"# TYPE sortie_trigger_rejections counter\n",
			"sortie_trigger_rejections_total{reason=\"bad_json\"} 1.0\n",
			"# EOF\n",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest("GET", "/metrics", nil)
			if tc.accept != "" {
				req.Header.Set("Accept", tc.accept)
			}
			rec := httptest.NewRecorder()
			m.reg.ServeHTTP(rec, req)
			if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, tc.contentType) {
				t.Errorf("Content-Type %q, want %q", ct, tc.contentType)
			}
			body := rec.Body.String()
			for _, w := range tc.want {
				if !strings.Contains(body, w) {
					t.Errorf("the exposition lacks %q", w)
				}
			}
			if tc.accept != "" && !strings.HasSuffix(body, "# EOF\n") {
				t.Error("OpenMetrics does not end with # EOF")
			}
		})
	}
}

// TestMetricsTakeLabelValuesThatAreNotUTF8: a scene name or an action
// that is not UTF-8 (client_golang panics on such a label value) is
// counted under the value with U+FFFD in place of the bad bytes, and the
// agent goes on.
func TestMetricsTakeLabelValuesThatAreNotUTF8(t *testing.T) {
	m := newInstruments()
	ms := &driver.Mission{ID: "m", Type: "scene\xff", Steps: []driver.Step{{ID: "s", Kind: "device.command", Params: []byte(`{"device":"d","action":"on"}`)}}}
	now := time.Now()
	for _, ev := range []driver.Event{
		{Input: driver.InSubmit, To: driver.StatePending, Time: now},
		{Input: driver.InBeginStep, Step: 0, Attempt: 2, Time: now},
		{Input: driver.InStepError, Step: 0, Attempt: 2, Detail: "class\xfe", Code: "busy", Time: now},
		{Input: driver.InFail, To: driver.StateFailed, Time: now},
	} {
		m.Observe(ev, ms)
	}
	text := scrape(t, m.reg)
	for _, want := range []string{
		"sortie_missions_started_total{scene=\"scene\uFFFD\"} 1\n",
		"sortie_step_retries_total{scene=\"scene\uFFFD\"} 1\n",
		"sortie_step_failures_total{class=\"class\uFFFD\",code=\"busy\"} 1\n",
		"sortie_missions_finished_total{outcome=\"failed\",scene=\"scene\uFFFD\"} 1\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
