package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/driver/drivertest"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/scenes"
	"github.com/sortie-edge/sortie/simulator"
)

// metricsScenes are the scenes of the metrics tests: one device step
// that gives up at its first failure, and a delay before a device step.
const metricsScenes = `
[[scene]]
name = "lamp"
mode = "parallel"
[[scene.step]]
device = "living-light"
action = "turn_on"
ack_timeout = "150ms"
retry = { max_attempts = 1 }

[[scene]]
name = "later"
mode = "parallel"
[[scene.step]]
delay = "20ms"
[[scene.step]]
device = "kitchen-light"
action = "turn_on"
`

// metricsRig is a whole agent for the metrics tests: its embedded
// broker, a real bbolt store in a temporary directory, and a simulated
// home of two lights and the AC.
type metricsRig struct {
	t     *testing.T
	a     *Agent
	watch *drivertest.Watcher
	stop  func() // stops and closes the agent; also run by the cleanup
}

func startMetricsRig(t *testing.T, dir string, tune func(*Options)) *metricsRig {
	t.Helper()
	reg, cat := parseScenes(t, metricsScenes, "metrics.toml")
	r := &metricsRig{t: t, watch: drivertest.NewWatcher()}
	o := Options{
		Gateway: "home", DataDir: dir, Registry: reg, Catalog: cat, QuietMissions: true, Version: "test-1",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Broker: BrokerOptions{Embedded: true, Listen: "127.0.0.1:0"},
		Driver: DriverOptions{StopGrace: time.Second},
		Home: &simulator.HomeConfig{Devices: []simulator.DeviceConfig{
			{ID: "living-light", Type: simulator.TypeLight},
			{ID: "kitchen-light", Type: simulator.TypeLight},
			{ID: "living-ac", Type: simulator.TypeAC},
		}},
		Observers: []driver.Observer{r.watch},
	}
	if tune != nil {
		tune(&o)
	}
	a, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	r.a, r.stop = a, testkit.Run(t, a)
	return r
}

// trigger starts a mission of scene and returns its ID.
func (r *metricsRig) trigger(scene, requestID string) string {
	r.t.Helper()
	rep, err := r.a.trig.Call(context.Background(), scenes.Trigger{Scene: scene, RequestID: requestID})
	if err != nil || rep.Status != scenes.StatusAccepted {
		r.t.Fatalf("trigger %s: %+v, %v", scene, rep, err)
	}
	return rep.MissionID
}

// wait waits until mission id is in state want.
func (r *metricsRig) wait(id string, want driver.State) {
	r.t.Helper()
	r.watch.Wait(r.t, id, want)
}

// device returns a simulated device of the rig's home.
func (r *metricsRig) device(id string) *simulator.Device {
	r.t.Helper()
	d := r.a.home.Device(id)
	if d == nil {
		r.t.Fatalf("no simulated device %s", id)
	}
	return d
}

// value returns the value of one series as /metrics writes it (its name
// and labels, exactly), and whether it is there.
func (r *metricsRig) value(series string) (float64, bool) {
	r.t.Helper()
	return seriesValue(r.t, scrape(r.t, r.a.metrics.reg), series)
}

// seriesValue finds one series in an exposition.
func seriesValue(t testing.TB, text, series string) (float64, bool) {
	t.Helper()
	for line := range strings.Lines(text) {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return v, true
		}
	}
	return 0, false
}

// want checks series' values.
func (r *metricsRig) want(values map[string]float64) {
	r.t.Helper()
	for series, want := range values {
		got, ok := r.value(series)
		switch {
		case !ok:
			r.t.Errorf("/metrics lacks %s", series)
		case got != want:
			r.t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
}

// absent checks that /metrics has no series of family name whose labels
// contain label.
func (r *metricsRig) absent(name, label string) {
	r.t.Helper()
	for line := range strings.Lines(familyText(r.t, r.a.metrics.reg, name)) {
		if !strings.HasPrefix(line, "#") && strings.Contains(line, label) {
			r.t.Errorf("unexpected series %s", strings.TrimSpace(line))
		}
	}
}

// TestRetriedMissionCountsAsStartedAgain: a mission that fails and is
// retried by an operator counts two starts and two ends, started is
// never behind finished for its scene at any event, and the gauge of
// stored missions moves it from failed to succeeded. Reported in issue
// 18: after a retry, started was 1 and finished 2.
func TestRetriedMissionCountsAsStartedAgain(t *testing.T) {
	var instr atomic.Pointer[instruments]
	var behind []string
	var mu sync.Mutex
	r := startMetricsRig(t, t.TempDir(), func(o *Options) {
		o.Observers = append(o.Observers, driver.ObserverFunc(func(ev driver.Event, ms *driver.Mission) {
			m := instr.Load()
			if m == nil || ms.Type != "lamp" {
				return
			}
			started := testutil.ToFloat64(m.started.WithLabelValues("lamp"))
			finished := 0.0
			for _, s := range []driver.State{driver.StateSucceeded, driver.StateFailed, driver.StateCancelled} {
				finished += testutil.ToFloat64(m.finished.WithLabelValues("lamp", stateLabel(s)))
			}
			if started < finished {
				mu.Lock()
				behind = append(behind, fmt.Sprintf("after %s: started %v, finished %v", ev.Input, started, finished))
				mu.Unlock()
			}
		}))
	})
	instr.Store(r.a.metrics)
	light := r.device("living-light")
	if err := light.SetFaults(simulator.Faults{Reject: "unsupported"}); err != nil {
		t.Fatal(err)
	}
	id := r.trigger("lamp", "retry-1")
	r.wait(id, driver.StateFailed)
	r.want(map[string]float64{
		`sortie_missions_started_total{scene="lamp"}`:                   1,
		`sortie_missions_finished_total{outcome="failed",scene="lamp"}`: 1,
		`sortie_missions{state="failed"}`:                               1,
		`sortie_missions{state="succeeded"}`:                            0,
		`sortie_store_missions`:                                         1,
	})
	if err := light.SetFaults(simulator.Faults{}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.a.drv.Retry(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	r.wait(id, driver.StateSucceeded)
	r.want(map[string]float64{
		`sortie_missions_started_total{scene="lamp"}`:                      2,
		`sortie_missions_finished_total{outcome="failed",scene="lamp"}`:    1,
		`sortie_missions_finished_total{outcome="succeeded",scene="lamp"}`: 1,
		`sortie_missions{state="failed"}`:                                  0,
		`sortie_missions{state="succeeded"}`:                               1,
		`sortie_missions{state="step_failed"}`:                             0,
		`sortie_store_missions`:                                            1,
	})
	// Only the states a mission rests in between commits, in lower case.
	r.absent("sortie_missions", `state="step_succeeded"`)
	r.absent("sortie_missions", `state="SUCCEEDED"`)
	mu.Lock()
	defer mu.Unlock()
	for _, b := range behind {
		t.Error(b)
	}
}

// TestResumedMissionsCountAsStarted: a mission the previous run left
// live counts as started in the process that finishes it, so that
// started is not behind finished after a restart.
func TestResumedMissionsCountAsStarted(t *testing.T) {
	dir := t.TempDir()
	r := startMetricsRig(t, dir, nil)
	// The mission waits for the light, live, across the restart.
	r.device("kitchen-light").SetOnline(false)
	testkit.Eventually(t, 10*time.Second, "the agent sees kitchen-light offline", func() bool { return !r.a.dev.Available("kitchen-light") })
	id := r.trigger("later", "resume-1")
	testkit.Eventually(t, 10*time.Second, "the mission waits for its device", func() bool {
		n, _ := r.value(`sortie_step_waits_total{code="device_offline"}`)
		return n > 0
	})
	r.stop()

	r = startMetricsRig(t, dir, nil)
	r.want(map[string]float64{
		`sortie_missions_started_total{scene="later"}`: 1,
		`sortie_missions{state="running"}`:             1,
	})
	r.wait(id, driver.StateSucceeded)
	r.want(map[string]float64{
		`sortie_missions_started_total{scene="later"}`:                      1,
		`sortie_missions_finished_total{outcome="succeeded",scene="later"}`: 1,
		`sortie_missions{state="running"}`:                                  0,
		`sortie_missions{state="succeeded"}`:                                1,
	})
}

// TestAckTimeoutsCountedByDeviceType: a command whose ack never comes
// counts in sortie_device_ack_timeouts_total under its device's type;
// every type of the registry's devices is there from the first scrape.
func TestAckTimeoutsCountedByDeviceType(t *testing.T) {
	r := startMetricsRig(t, t.TempDir(), nil)
	r.want(map[string]float64{
		`sortie_device_ack_timeouts_total{device_type="light"}`: 0,
		`sortie_device_ack_timeouts_total{device_type="lock"}`:  0,
	})
	if err := r.device("living-light").SetFaults(simulator.Faults{AckLoss: 1}); err != nil {
		t.Fatal(err)
	}
	id := r.trigger("lamp", "timeout-1")
	r.wait(id, driver.StateFailed)
	r.want(map[string]float64{
		`sortie_device_ack_timeouts_total{device_type="light"}`:            1,
		`sortie_device_ack_timeouts_total{device_type="ac"}`:               0,
		`sortie_step_failures_total{class="retryable",code="ack_timeout"}`: 1,
	})
}

// TestDelaysAreNotTimedAsSteps: a scene's delay waits its time without
// a series in sortie_step_duration_seconds (it was device_type="delay");
// its device step is there.
func TestDelaysAreNotTimedAsSteps(t *testing.T) {
	delay := &delayFromFirstAttempt{started: map[string]time.Time{}}
	r := startMetricsRig(t, t.TempDir(), func(o *Options) {
		o.Handlers = map[string]driver.Handler{scenes.DelayKind: delay}
	})
	id := r.trigger("later", "delay-1")
	r.wait(id, driver.StateSucceeded)
	r.want(map[string]float64{
		`sortie_step_duration_seconds_count{action="turn_on",device_type="light",result="ok"}`: 1,
		`sortie_step_waits_total{code="delay"}`:                                                1,
	})
	r.absent("sortie_step_duration_seconds", `device_type="delay"`)
	if n := seriesCount(t, r.a.metrics.reg, "sortie_step_duration_seconds"); n != 1 {
		t.Errorf("step duration series: %d, want 1", n)
	}
}

// delayFromFirstAttempt is the real delay handler, its wait counted from
// its first attempt rather than from the step's start: on a loaded
// machine that attempt may come 20 ms after the start, and the delay
// would then not wait at all (the test failed so once).
type delayFromFirstAttempt struct {
	mu      sync.Mutex
	started map[string]time.Time
}

func (d *delayFromFirstAttempt) Execute(ctx context.Context, req driver.StepRequest) (map[string]any, error) {
	d.mu.Lock()
	if _, ok := d.started[req.MissionID]; !ok {
		d.started[req.MissionID] = time.Now()
	}
	req.Started = d.started[req.MissionID]
	d.mu.Unlock()
	return scenes.DelayHandler{}.Execute(ctx, req)
}

// TestBuildInfoNamesTheBuild: sortie_build_info is one series, 1, with
// the agent's version, the revision and the Go version.
func TestBuildInfoNamesTheBuild(t *testing.T) {
	r := startMetricsRig(t, t.TempDir(), nil)
	r.want(map[string]float64{
		fmt.Sprintf(`sortie_build_info{goversion=%q,revision="unknown",version="test-1"}`, runtime.Version()): 1,
	})
	if n := seriesCount(t, r.a.metrics.reg, "sortie_build_info"); n != 1 {
		t.Errorf("sortie_build_info has %d series, want 1", n)
	}
}

// TestDeviceOnlineFollowsAvailability: sortie_device_online has one
// series per device of the registry, and follows a simulated device
// going offline and coming back; a device that never reported (not in
// the simulated home) counts as online.
func TestDeviceOnlineFollowsAvailability(t *testing.T) {
	r := startMetricsRig(t, t.TempDir(), nil)
	online := func(dev, typ string) float64 {
		v, ok := r.value(fmt.Sprintf(`sortie_device_online{device=%q,device_type=%q}`, dev, typ))
		if !ok {
			t.Fatalf("no sortie_device_online series for %s", dev)
		}
		return v
	}
	if got := online("front-door", "lock"); got != 1 {
		t.Errorf("front-door (never reported): %v, want 1", got)
	}
	if n, want := seriesCount(t, r.a.metrics.reg, "sortie_device_online"), len(r.a.reg.Devices); n != want {
		t.Errorf("%d series, want one per device (%d)", n, want)
	}
	ac := r.device("living-ac")
	ac.SetOnline(false)
	testkit.Eventually(t, 10*time.Second, "living-ac offline in /metrics", func() bool { return online("living-ac", "ac") == 0 })
	if got := online("living-light", "light"); got != 1 {
		t.Errorf("living-light: %v, want 1", got)
	}
	ac.SetOnline(true)
	testkit.Eventually(t, 10*time.Second, "living-ac online again in /metrics", func() bool { return online("living-ac", "ac") == 1 })
}

// TestStoreMetricsFollowTheStore: the sizes of the store's files are
// those on disk at the scrape, and the commit and checkpoint histograms
// count every group commit and checkpoint the store made.
func TestStoreMetricsFollowTheStore(t *testing.T) {
	dir := t.TempDir()
	r := startMetricsRig(t, dir, nil)
	for i := range 3 {
		r.wait(r.trigger("lamp", fmt.Sprintf("store-%d", i)), driver.StateSucceeded)
	}
	// A read that scans the file checkpoints first: nothing is left in
	// the log for the background checkpointer.
	if _, _, err := r.a.db.List(context.Background(), driver.Filter{Limit: 10}); err != nil {
		t.Fatal(err)
	}
	st, err := r.a.db.Stats()
	if err != nil {
		t.Fatal(err)
	}
	file, err := os.Stat(filepath.Join(dir, "missions.db"))
	if err != nil {
		t.Fatal(err)
	}
	log, err := os.Stat(filepath.Join(dir, "missions.db-wal"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Commits < 3 || st.Checkpoints < 1 {
		t.Fatalf("the store made %d commits and %d checkpoints, want some", st.Commits, st.Checkpoints)
	}
	r.want(map[string]float64{
		`sortie_store_bytes`:                             float64(file.Size()),
		`sortie_store_wal_bytes`:                         float64(log.Size()),
		`sortie_store_commit_duration_seconds_count`:     float64(st.Commits),
		`sortie_store_checkpoint_duration_seconds_count`: float64(st.Checkpoints),
	})
	if sum, _ := r.value(`sortie_store_commit_duration_seconds_sum`); sum <= 0 {
		t.Errorf("sortie_store_commit_duration_seconds_sum = %v, want > 0", sum)
	}
}

// TestRetentionCountsWhatItPrunes: retention's deletions, missions by
// count and trigger records by age, show in
// sortie_retention_pruned_total by kind, and the pruned missions leave
// sortie_missions at once.
func TestRetentionCountsWhatItPrunes(t *testing.T) {
	clock := testkit.NewClock(time.Now()) // the trigger records' age
	r := startMetricsRig(t, t.TempDir(), func(o *Options) {
		o.Clock = clock
		// The loop prunes once as it starts, maybe after the first
		// mission ended, then not within the test: the test prunes once
		// more when all three ended, and counts what both deleted.
		o.Retention = RetentionOptions{MaxCount: 1, Interval: time.Hour}
		o.Traces = TraceOptions{MaxAge: 5 * time.Millisecond, FailedMaxAge: 5 * time.Millisecond}
	})
	r.want(map[string]float64{
		`sortie_retention_pruned_total{kind="mission"}`: 0,
		`sortie_retention_pruned_total{kind="trace"}`:   0,
	})
	for i := range 3 {
		r.wait(r.trigger("lamp", fmt.Sprintf("prune-%d", i)), driver.StateSucceeded)
	}
	if err := r.a.traces.flush(); err != nil {
		t.Fatal(err)
	}
	clock.Advance(20 * time.Millisecond) // the three trigger records are past their age
	r.a.pruneOnce(context.Background())
	r.want(map[string]float64{
		`sortie_retention_pruned_total{kind="mission"}`: 2,
		`sortie_retention_pruned_total{kind="trace"}`:   3,
		`sortie_missions{state="succeeded"}`:            1,
		`sortie_store_missions`:                         1,
	})
}
