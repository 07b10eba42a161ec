package agent

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/agent/hubsync"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/devices/wire"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/scenes"
	"github.com/sortie-edge/sortie/store"
	"github.com/sortie-edge/sortie/uplink"
)

// namespace prefixes every metric the agent exports.
const namespace = "sortie"

// registry is the agent's own Prometheus registry and the handler that
// serves it on /metrics: the text format 0.0.4, or OpenMetrics to a
// scraper that asks for it. A scrape in which a collector fails still
// serves every other family.
type registry struct {
	*prometheus.Registry
	http.Handler
}

func newRegistry() *registry {
	r := prometheus.NewRegistry()
	return &registry{Registry: r, Handler: promhttp.HandlerFor(r, promhttp.HandlerOpts{
		EnableOpenMetrics: true,
		ErrorHandling:     promhttp.ContinueOnError,
	})}
}

// family describes a family whose samples a collector makes at scrape
// time.
type family struct {
	desc *prometheus.Desc
	typ  prometheus.ValueType
}

func newFamily(name, help string, typ prometheus.ValueType, labels ...string) family {
	return family{desc: prometheus.NewDesc(name, help, labels, nil), typ: typ}
}

// describe sends the families' descriptions (prometheus.Collector's
// Describe).
func describe(ch chan<- *prometheus.Desc, fams ...family) {
	for _, f := range fams {
		ch <- f.desc
	}
}

// emitter sends a collector's samples to the registry.
type emitter chan<- prometheus.Metric

// emit sends one sample of f with its label values in the order f
// declared them.
func (e emitter) emit(f family, v float64, labelValues ...string) {
	for i, l := range labelValues {
		labelValues[i] = label(l)
	}
	e <- prometheus.MustNewConstMetric(f.desc, f.typ, v, labelValues...)
}

// label makes a label value valid UTF-8, as client_golang requires (it
// panics on anything else): bytes that are not are replaced by U+FFFD.
// Values from the configuration and from JSON always are; this keeps a
// stray byte from taking the agent down. Valid values are returned as
// they are, without allocating.
func label(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// instruments holds the agent's Prometheus metrics on its own registry.
// Label values are bounded: scene names, device types, actions, states,
// error classes and codes come from configuration or fixed sets, never
// from mission IDs.
type instruments struct {
	reg *registry

	started      *prometheus.CounterVec
	finished     *prometheus.CounterVec
	stepDuration *prometheus.HistogramVec
	ackLatency   *prometheus.HistogramVec
	// turnWait is how long commands waited for their turn on their
	// device and link.
	turnWait     *prometheus.HistogramVec
	stepFailures *prometheus.CounterVec
	retries      *prometheus.CounterVec
	waits        *prometheus.CounterVec
	compensation *prometheus.CounterVec
	inFlight     prometheus.Gauge
	rejections   *prometheus.CounterVec
	ackTimeouts  *prometheus.CounterVec
	// commits and checkpoints time the store's writes: its group commits
	// (log appends) and the bbolt transactions applying them.
	commits     prometheus.Histogram
	checkpoints prometheus.Histogram
	pruned      *prometheus.CounterVec
	// bundles counts configuration bundles' outcomes.
	bundles *prometheus.CounterVec

	mu       sync.Mutex
	begins   map[stepKey]time.Time // begin of each running attempt (several in a parallel group)
	kinds    map[string]string     // device ID -> type, for labels
	terminal map[driver.State]int  // finished missions kept in the store
}

// stateLabels are the states as label values: lower case, as every label
// value the agent exports.
var stateLabels = func() map[driver.State]string {
	l := make(map[driver.State]string, len(driver.States))
	for _, s := range driver.States {
		l[s] = strings.ToLower(string(s))
	}
	return l
}()

// stateLabel returns a state's label value.
func stateLabel(s driver.State) string {
	if l, ok := stateLabels[s]; ok {
		return l
	}
	return strings.ToLower(string(s))
}

// restStates are the states a mission is stored in between two commits,
// the series of sortie_missions: STEP_SUCCEEDED is always followed by
// the next transition in the same commit. Another state is exported only
// while a mission is in it.
var restStates = []driver.State{
	driver.StatePending, driver.StateRunning, driver.StatePaused, driver.StateStepRunning,
	driver.StateStepFailed, driver.StateCompensating, driver.StateSucceeded, driver.StateFailed, driver.StateCancelled,
}

// syncSource feeds the hub sync gauges; nil when no hub is configured.
type syncSource interface {
	Stats() hubsync.Stats
}

// outboxSource reports the store's outbox.
type outboxSource interface {
	OutboxStats() store.OutboxStats
}

// queueSource and brokerSource feed the gauges computed at scrape time.
type queueSource interface{ Queue() driver.QueueStats }
type brokerSource interface {
	Stats() devices.Stats
	Connected() bool
	// Available reports whether a device is online, as its last
	// availability message said (true before it sent any).
	Available(deviceID string) bool
}

func newInstruments() *instruments {
	m := &instruments{
		reg:      newRegistry(),
		begins:   map[stepKey]time.Time{},
		kinds:    map[string]string{},
		terminal: map[driver.State]int{},
	}
	m.started = prometheus.NewCounterVec(prometheus.CounterOpts{Name: namespace + "_missions_started_total",
		Help: "Missions this process set running, by scene: accepted, resumed from the store at start, or restarted by an operator's retry. Each run that ends counts in sortie_missions_finished_total, so started >= finished for every scene."}, []string{"scene"})
	m.finished = prometheus.NewCounterVec(prometheus.CounterOpts{Name: namespace + "_missions_finished_total",
		Help: "Mission runs that ended, by scene and outcome (succeeded, failed, cancelled); a retried mission counts once per run."}, []string{"scene", "outcome"})
	m.stepDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: namespace + "_step_duration_seconds",
		Help:    "Duration of step attempts, by device type (the step kind for steps not on a device; delays are left out), action and result (ok, error, superseded, skipped).",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}, []string{"device_type", "action", "result"})
	m.ackLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: namespace + "_device_ack_latency_seconds",
		Help:    "Time from a device command's attempt (its wait for a turn on a busy device included) to its ack, by device type.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}}, []string{"device_type"})
	m.turnWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: namespace + "_link_wait_seconds",
		Help:    "Time device commands waited for their turn on their device and link (link \"none\": devices on no link).",
		Buckets: []float64{.001, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}, []string{"link"})
	m.bundles = prometheus.NewCounterVec(prometheus.CounterOpts{Name: namespace + "_bundle_outcomes_total",
		Help: "Configuration bundles' outcomes on this gateway (docs/fleet.md), by status (rejected, applied, healthy, reverted) and reason (for rejected and reverted)."},
		[]string{"status", "reason"})
	m.stepFailures = prometheus.NewCounterVec(prometheus.CounterOpts{Name: namespace + "_step_failures_total",
		Help: "Failed step attempts, by error class and code."}, []string{"class", "code"})
	m.retries = prometheus.NewCounterVec(prometheus.CounterOpts{Name: namespace + "_step_retries_total",
		Help: "Step attempts after the first, by scene."}, []string{"scene"})
	m.waits = prometheus.NewCounterVec(prometheus.CounterOpts{Name: namespace + "_step_waits_total",
		Help: "Steps that waited because their target was not ready (offline device, delay), by code; no attempt is spent."}, []string{"code"})
	m.compensation = prometheus.NewCounterVec(prometheus.CounterOpts{Name: namespace + "_compensations_total",
		Help: "Compensation attempts that finished, by result (succeeded, failed, retry)."}, []string{"result"})
	m.inFlight = prometheus.NewGauge(prometheus.GaugeOpts{Name: namespace + "_commands_in_flight", Help: "Device commands published and waiting for an ack."})
	m.rejections = prometheus.NewCounterVec(prometheus.CounterOpts{Name: namespace + "_trigger_rejections_total",
		Help: "Triggers rejected, by reason."}, []string{"reason"})
	m.ackTimeouts = prometheus.NewCounterVec(prometheus.CounterOpts{Name: namespace + "_device_ack_timeouts_total",
		Help: "Device commands that got no ack in time, by device type."}, []string{"device_type"})
	m.commits = prometheus.NewHistogram(prometheus.HistogramOpts{Name: namespace + "_store_commit_duration_seconds",
		Help:    "Duration of the store's group commits: checking a batch of mission writes and appending it to the write-ahead log, its sync included; what each transition of a mission waits for.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}})
	m.checkpoints = prometheus.NewHistogram(prometheus.HistogramOpts{Name: namespace + "_store_checkpoint_duration_seconds",
		Help:    "Duration of the store's checkpoints: the bbolt transaction (and its syncs) applying logged writes to the database file, in the background.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}})
	m.pruned = prometheus.NewCounterVec(prometheus.CounterOpts{Name: namespace + "_retention_pruned_total",
		Help: "Records deleted by retention, by kind: mission (finished missions, with their timelines) or trace (trigger records)."}, []string{"kind"})
	m.reg.MustRegister(m.started, m.finished, m.stepDuration, m.ackLatency, m.turnWait, m.stepFailures, m.retries, m.waits,
		m.compensation, m.inFlight, m.rejections, m.ackTimeouts, m.commits, m.checkpoints, m.pruned, m.bundles,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.pruned.WithLabelValues(prunedMission)
	m.pruned.WithLabelValues(prunedTrace)
	for _, r := range []string{"bad_json", "too_large", "missing_field", "invalid_field", "unknown_scene", "invalid_param", scenes.ReasonAlreadyRunning, scenes.ReasonOverloaded} {
		m.rejections.WithLabelValues(r)
	}
	return m
}

// The kinds of sortie_retention_pruned_total.
const (
	prunedMission = "mission"
	prunedTrace   = "trace"
)

// commit times a group commit of the store (store.Options.OnCommit).
func (m *instruments) commit(took time.Duration) { m.commits.Observe(took.Seconds()) }

// checkpoint times a checkpoint of the store (store.Options.OnCheckpoint).
func (m *instruments) checkpoint(took time.Duration) { m.checkpoints.Observe(took.Seconds()) }

// prunedMissions counts finished missions in state that retention
// deleted, and takes them out of the stored ones (store.Options.OnPrune).
func (m *instruments) prunedMissions(state driver.State, n int) {
	m.pruned.WithLabelValues(prunedMission).Add(float64(n))
	m.mu.Lock()
	m.terminal[state] -= n
	m.mu.Unlock()
}

// prunedTraces counts trigger records that retention deleted.
func (m *instruments) prunedTraces(n int) { m.pruned.WithLabelValues(prunedTrace).Add(float64(n)) }

// fileSizer reports the store's files.
type fileSizer interface {
	FileSizes() (file, log int64, err error)
}

// watchStore registers the sizes of the store's files, read at scrape
// time.
func (m *instruments) watchStore(db fileSizer) {
	m.reg.MustRegister(&storeCollector{db: db})
}

var (
	descStoreBytes = newFamily(namespace+"_store_bytes",
		"Size of the store's database file (bbolt) on disk, free pages included.", prometheus.GaugeValue)
	descWALBytes = newFamily(namespace+"_store_wal_bytes",
		"Size of the store's write-ahead log on disk (preallocated: 4 MiB, more while checkpoints fall behind).", prometheus.GaugeValue)
)

// storeCollector reads the store's file sizes at scrape time.
type storeCollector struct{ db fileSizer }

func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	describe(ch, descStoreBytes, descWALBytes)
}

func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	sc := emitter(ch)
	file, log, err := c.db.FileSizes()
	if err != nil {
		return // a family without samples is left out; /readyz reports the store
	}
	sc.emit(descStoreBytes, float64(file))
	sc.emit(descWALBytes, float64(log))
}

// setBuild exports the build's identity as sortie_build_info. The
// revision comes from the build's -ldflags (Options.Revision), not from
// runtime/debug.ReadBuildInfo: its parser costs the arm64 binary more
// than it is worth.
func (m *instruments) setBuild(version, revision string) {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: namespace + "_build_info",
		Help: "Always 1; its labels say what runs: the agent's version, the VCS revision it was built from (unknown when the build did not record one) and the Go version."},
		[]string{"version", "revision", "goversion"})
	g.WithLabelValues(label(version), label(cmp.Or(revision, "unknown")), runtime.Version()).Set(1)
	m.reg.MustRegister(g)
}

// rejected counts a trigger rejection. A nil *instruments is allowed so
// unit tests need not build one.
func (m *instruments) rejected(reason string) {
	if m != nil {
		m.rejections.WithLabelValues(reason).Inc()
	}
}

// watch registers the gauges read at scrape time.
func (m *instruments) watch(q queueSource, b brokerSource) {
	m.reg.MustRegister(&scrapeCollector{m: m, q: q, b: b})
}

// resumed counts the missions loaded from the store at start as started:
// they end in this process, and count in finished then.
func (m *instruments) resumed(active []*driver.Mission) {
	for _, ms := range active {
		m.started.WithLabelValues(label(ms.Type)).Inc()
	}
}

// turn records a command's wait for its turn (devices.HandlerOptions.OnTurn).
func (m *instruments) turn(link string, waited time.Duration) {
	m.turnWait.WithLabelValues(label(linkLabel(link))).Observe(waited.Seconds())
}

// linkLabel names the devices on no link "none".
func linkLabel(link string) string {
	if link == "" {
		return "none"
	}
	return link
}

// watchLinks registers the links' admission gauges.
func (m *instruments) watchLinks(links func() map[string]devices.LinkStats) {
	m.reg.MustRegister(&linkCollector{links: links})
}

var (
	descLinkInFlight = newFamily(namespace+"_link_in_flight", "Device commands not yet acked, by link (\"none\": devices on no link).", prometheus.GaugeValue, "link")
	descLinkQueued   = newFamily(namespace+"_link_queued", "Device commands waiting for their turn on their device or link, by link.", prometheus.GaugeValue, "link")
)

// linkCollector reads the admission state at scrape time.
type linkCollector struct {
	links func() map[string]devices.LinkStats
}

func (c *linkCollector) Describe(ch chan<- *prometheus.Desc) {
	describe(ch, descLinkInFlight, descLinkQueued)
}

func (c *linkCollector) Collect(ch chan<- prometheus.Metric) {
	sc := emitter(ch)
	for link, s := range c.links() {
		sc.emit(descLinkInFlight, float64(s.InFlight), linkLabel(link))
		sc.emit(descLinkQueued, float64(s.Queued), linkLabel(link))
	}
}

// watchSync registers the hub sync gauges.
func (m *instruments) watchSync(up syncSource, ob outboxSource) {
	m.reg.MustRegister(&syncCollector{up: up, ob: ob})
}

var (
	descOutbox     = newFamily(namespace+"_outbox_entries", "Mission events waiting for the hub's acknowledgement.", prometheus.GaugeValue)
	descCompacted  = newFamily(namespace+"_outbox_compacted_total", "Outbox events dropped by compaction (the outbox was full; each mission kept its latest).", prometheus.CounterValue)
	descSyncLag    = newFamily(namespace+"_hub_sync_lag_seconds", "Age of the oldest event the hub has not acknowledged; 0 when in sync.", prometheus.GaugeValue)
	descHubUp      = newFamily(namespace+"_hub_connected", "1 when the connection to the hub is up.", prometheus.GaugeValue)
	descHubBroker  = newFamily(namespace+"_hub_broker", "1 for the hub address the connection is up to (one of [hub] urls); absent while down.", prometheus.GaugeValue, "broker")
	descHubAcked   = newFamily(namespace+"_hub_acked_entries_total", "Outbox entries the hub acknowledged.", prometheus.CounterValue)
	descHubResends = newFamily(namespace+"_hub_resends_total", "Times unacknowledged events were sent to the hub again.", prometheus.CounterValue)
)

// syncCollector reads the uplink and outbox at scrape time.
type syncCollector struct {
	up syncSource
	ob outboxSource
}

func (c *syncCollector) Describe(ch chan<- *prometheus.Desc) {
	describe(ch, descOutbox, descCompacted, descSyncLag, descHubUp, descHubBroker, descHubAcked, descHubResends)
}

func (c *syncCollector) Collect(ch chan<- prometheus.Metric) {
	sc := emitter(ch)
	ob := c.ob.OutboxStats()
	st := c.up.Stats()
	up := 0.0
	if st.Connected {
		up = 1
	}
	sc.emit(descOutbox, float64(ob.Len))
	sc.emit(descCompacted, float64(ob.Compacted))
	sc.emit(descSyncLag, st.Lag.Seconds())
	sc.emit(descHubUp, up)
	if st.Connected && st.Broker != "" {
		sc.emit(descHubBroker, 1, st.Broker)
	}
	sc.emit(descHubAcked, float64(st.Acked))
	sc.emit(descHubResends, float64(st.Resends))
}

// setDeviceTypes gives the metrics the device-type label of each device.
// The per-type counters start at 0 for every type in use.
func (m *instruments) setDeviceTypes(types map[string]string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, v := range types {
		m.kinds[k] = v
		m.ackTimeouts.WithLabelValues(label(v))
	}
}

// ackTimeout counts a command to device that got no ack in time
// (devices.Options.OnAckTimeout).
func (m *instruments) ackTimeout(device string) {
	m.ackTimeouts.WithLabelValues(label(m.deviceType(device, "unknown"))).Inc()
}

// stepKey names one step of one mission.
type stepKey struct {
	mission string
	step    int
}

// setTerminal sets the counts of finished missions in the store, at
// start-up; events and prunes keep them since.
func (m *instruments) setTerminal(counts map[driver.State]int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.terminal = counts
}

// Observe derives the event-driven metrics from mission events.
func (m *instruments) Observe(ev driver.Event, ms *driver.Mission) {
	switch ev.Input {
	case driver.InSubmit:
		m.started.WithLabelValues(label(ms.Type)).Inc()
	case driver.InBeginStep:
		// A delay does no work and waits its time out: it is not timed as a
		// step (sortie_step_waits_total{code="delay"} counts its waits).
		if ev.Step < 0 || ev.Step >= len(ms.Steps) || ms.Steps[ev.Step].Kind != scenes.DelayKind {
			m.mu.Lock()
			m.begins[stepKey{ms.ID, ev.Step}] = ev.Time
			m.mu.Unlock()
		}
		if ev.Attempt > 1 {
			m.retries.WithLabelValues(label(ms.Type)).Inc()
		}
	case driver.InStepWait:
		m.mu.Lock()
		delete(m.begins, stepKey{ms.ID, ev.Step})
		m.mu.Unlock()
		m.waits.WithLabelValues(codeLabel(ev.Code)).Inc()
	case driver.InStepOK, driver.InStepError:
		m.mu.Lock()
		began, ok := m.begins[stepKey{ms.ID, ev.Step}]
		delete(m.begins, stepKey{ms.ID, ev.Step})
		m.mu.Unlock()
		result := "ok"
		switch {
		case ev.Input == driver.InStepError && ev.Detail == driver.GaveWay.String():
			result = ev.Code // superseded or skipped: not a failure
		case ev.Input == driver.InStepError:
			result = "error"
			m.stepFailures.WithLabelValues(label(ev.Detail), codeLabel(ev.Code)).Inc()
		}
		if ok && ev.Step >= 0 && ev.Step < len(ms.Steps) {
			var out map[string]any
			if ev.Step < len(ms.Results) {
				out = ms.Results[ev.Step].Outputs
			}
			dev, action := devices.RanTarget(ms.Steps[ev.Step], out)
			m.stepDuration.WithLabelValues(label(m.deviceType(dev, ms.Steps[ev.Step].Kind)), label(action), result).Observe(ev.Time.Sub(began).Seconds())
		}
	case driver.InCompResult:
		result := "succeeded"
		switch {
		case ev.Detail == "compensation failed":
			result = "failed"
		case ev.Detail != "compensated":
			result = "retry"
		}
		m.compensation.WithLabelValues(result).Inc()
	}
	if ev.To.Terminal() && ev.Input != driver.InSubmit {
		m.finished.WithLabelValues(label(ms.Type), stateLabel(ev.To)).Inc()
		m.mu.Lock()
		m.terminal[ev.To]++
		for i := range ms.Steps {
			delete(m.begins, stepKey{ms.ID, i})
		}
		m.mu.Unlock()
	}
	if ev.Input == driver.InRetry {
		// A run again: started, and out of the stored FAILED missions.
		m.started.WithLabelValues(label(ms.Type)).Inc()
		m.mu.Lock()
		m.terminal[driver.StateFailed]--
		m.mu.Unlock()
	}
}

// codeLabel bounds the code label: device codes are a fixed set, but a
// third-party device could invent its own.
func codeLabel(code string) string {
	switch code {
	case "", "timeout", "ack_timeout", "panic", "not_ready_timeout", "device_offline", "verify_failed", "wait_timeout", "delay", "deadline",
		wire.CodeBusy, wire.CodeExpired, wire.CodeInternal, wire.CodeInvalidParam,
		wire.CodeUnknownAction, wire.CodeJammed, wire.CodeUnsupported:
		return code
	}
	return "other"
}

func (m *instruments) deviceType(device, kind string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if t, ok := m.kinds[device]; ok {
		return t
	}
	return kind // delay and other non-device steps
}

// instrument wraps the device.command handler to time acks and count
// commands in flight. A command's attempt parks while it waits for its
// turn (driver.Pending) and then its ack (driver.InFlight), so it spans
// calls: it is in flight from the call that sends it to the call that
// ends it, and its latency runs from the attempt's start (Resume.Since).
func (m *instruments) instrument(h driver.Handler) driver.Handler {
	return driver.HandlerFunc(func(ctx context.Context, req driver.StepRequest) (map[string]any, error) {
		start := time.Now()
		out, err := h.Execute(ctx, req)
		var pe *driver.PendingError
		before := req.Resume != nil && req.Resume.InFlight
		after := errors.As(err, &pe) && pe.InFlight
		switch {
		case !before && after: // sent: waiting for its ack
			m.inFlight.Inc()
		case before && !after:
			m.inFlight.Dec()
			start = req.Resume.Since
		}
		if err == nil {
			dev, _ := out["device"].(string) // the command handler's outputs name it
			if dev == "" {
				dev, _ = devices.ParamsTarget(req.Params)
			}
			m.ackLatency.WithLabelValues(label(m.deviceType(dev, req.Kind))).Observe(time.Since(start).Seconds())
		}
		return out, err
	})
}

// scrapeCollector computes gauges from live state at scrape time.
type scrapeCollector struct {
	m *instruments
	q queueSource
	b brokerSource
}

var (
	descMissions = newFamily(namespace+"_missions",
		"Missions in the store, by the state they rest in: live ones (pending, running, paused, step_running: a step attempt executing or waiting for its ack, step_failed: waiting for a retry, compensating) as the loop holds them now, finished ones (succeeded, failed, cancelled) until retention deletes them.",
		prometheus.GaugeValue, "state")
	descRunnable  = newFamily(namespace+"_runnable_missions", "Missions due now and waiting for a worker.", prometheus.GaugeValue)
	descRunning   = newFamily(namespace+"_running_steps", "Steps executing now (holding a worker).", prometheus.GaugeValue)
	descParked    = newFamily(namespace+"_parked_steps", "Step attempts waiting for an ack, a state or their turn, holding no worker.", prometheus.GaugeValue)
	descZombies   = newFamily(namespace+"_abandoned_handlers", "Step handlers that ignored their timeout, were abandoned and have not returned.", prometheus.GaugeValue)
	descRefused   = newFamily(namespace+"_driver_refused_transitions_total", "Transitions the mission state table refused (a bug to report: each is logged at error level, and nothing of it was written).", prometheus.CounterValue)
	descOldest    = newFamily(namespace+"_oldest_runnable_age_seconds", "How long the oldest due mission has waited for a worker.", prometheus.GaugeValue)
	descConnected = newFamily(namespace+"_broker_connected", "1 when the device connection to the broker is up.", prometheus.GaugeValue)
	descReconnect = newFamily(namespace+"_broker_reconnects_total", "Reconnections of the device connection.", prometheus.CounterValue)
	descLateAcks  = newFamily(namespace+"_device_late_acks_total", "Acks that arrived after their command gave up waiting.", prometheus.CounterValue)
	descDupAcks   = newFamily(namespace+"_device_duplicate_acks_total", "Acks for a command already completed.", prometheus.CounterValue)
	descStored    = newFamily(namespace+"_store_missions", "Missions in the store, live and finished: the sum of sortie_missions.", prometheus.GaugeValue)

	descOnline = newFamily(namespace+"_device_online",
		"1 when the device is online as its last availability message said (also before it sent any: such a device is tried), 0 when offline; one series per device of the registry, so bounded by the configuration.",
		prometheus.GaugeValue, "device", "device_type")

	// descUnmatched's reason label has two values, both emitted from the
	// first scrape.
	descUnmatched = newFamily(namespace+"_device_unmatched_acks_total",
		"Acks that matched no command, by reason: malformed (not JSON, over 64 KiB, no id, negative without an error code) or unknown_command (an ID the agent did not send, sent before a restart, or long forgotten).",
		prometheus.CounterValue, "reason")
)

func (c *scrapeCollector) Describe(ch chan<- *prometheus.Desc) {
	describe(ch, descMissions, descRunnable, descRunning, descParked, descZombies, descRefused, descOldest, descConnected, descReconnect, descLateAcks, descDupAcks, descUnmatched, descOnline, descStored)
}

func (c *scrapeCollector) Collect(ch chan<- prometheus.Metric) {
	sc := emitter(ch)
	q := c.q.Queue()
	c.m.mu.Lock()
	terminal := make(map[driver.State]int, len(c.m.terminal))
	for s, n := range c.m.terminal {
		terminal[s] = n
	}
	c.m.mu.Unlock()
	total := 0
	for _, s := range driver.States {
		n := q.ByState[s]
		if s.Terminal() {
			n = terminal[s]
		}
		total += n
		if n != 0 || slices.Contains(restStates, s) {
			sc.emit(descMissions, float64(n), stateLabel(s))
		}
	}
	sc.emit(descStored, float64(total))
	sc.emit(descRunnable, float64(q.Due))
	sc.emit(descRunning, float64(q.Running))
	sc.emit(descParked, float64(q.Parked))
	sc.emit(descZombies, float64(q.Zombies))
	sc.emit(descRefused, float64(q.Refused))
	age := 0.0
	if !q.OldestDue.IsZero() {
		age = max(time.Since(q.OldestDue).Seconds(), 0)
	}
	sc.emit(descOldest, age)
	if c.b != nil {
		st := c.b.Stats()
		up := 0.0
		if c.b.Connected() {
			up = 1
		}
		sc.emit(descConnected, up)
		sc.emit(descReconnect, float64(st.Reconnects))
		sc.emit(descLateAcks, float64(st.LateAcks))
		sc.emit(descDupAcks, float64(st.Duplicates))
		sc.emit(descUnmatched, float64(st.MalformedAcks), "malformed")
		sc.emit(descUnmatched, float64(st.UnknownAcks), "unknown_command")
		c.m.mu.Lock()
		kinds := maps.Clone(c.m.kinds)
		c.m.mu.Unlock()
		for dev, typ := range kinds {
			online := 0.0
			if c.b.Available(dev) {
				online = 1
			}
			sc.emit(descOnline, online, dev, typ)
		}
	}
}

// bundleOutcome counts a configuration bundle's outcome
// (configs.onOutcome). Received is not an outcome: every bundle has one.
func (m *instruments) bundleOutcome(o api.BundleOutcome) {
	if o.Status == uplink.BundleReceived {
		return
	}
	m.bundles.WithLabelValues(string(o.Status), string(o.Reason)).Inc()
}

// watchTrial registers sortie_bundle_on_trial, read at scrape time: an
// alert on a gateway whose trial never ends, or a dashboard of the
// gateways a rollout has on trial now.
func (m *instruments) watchTrial(onTrial func() bool) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: namespace + "_bundle_on_trial",
		Help: "1 while a configuration bundle is on trial on this gateway (applied, not yet kept or reverted; docs/fleet.md), else 0."},
		func() float64 {
			if onTrial() {
				return 1
			}
			return 0
		}))
}
