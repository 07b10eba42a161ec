package agent

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sortie-edge/sortie/agent/hubsync"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/devices/wire"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/scenes"
	"github.com/sortie-edge/sortie/store"
)

// namespace prefixes every metric the agent exports.
const namespace = "sortie"

// metrics holds the agent's Prometheus metrics on its own registry. Label
// values are bounded: scene names, device types, actions, states, error
// classes and codes come from configuration or fixed sets, never from
// mission IDs.
type metrics struct {
	reg *prometheus.Registry

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

	mu       sync.Mutex
	begins   map[stepKey]time.Time // begin of each running attempt (several in a parallel group)
	kinds    map[string]string     // device ID -> type, for labels
	terminal map[driver.State]int  // finished missions kept in the store
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
}

func newMetrics() *metrics {
	m := &metrics{
		reg:      prometheus.NewRegistry(),
		begins:   map[stepKey]time.Time{},
		kinds:    map[string]string{},
		terminal: map[driver.State]int{},
	}
	m.started = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "missions_started_total", Help: "Missions accepted, by scene.",
	}, []string{"scene"})
	m.finished = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "missions_finished_total", Help: "Missions that reached a terminal state, by scene and outcome.",
	}, []string{"scene", "outcome"})
	m.stepDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Name: "step_duration_seconds", Help: "Duration of step attempts, by device type and action.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}, []string{"device_type", "action", "result"})
	m.ackLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Name: "device_ack_latency_seconds", Help: "Time from a device command's attempt (its wait for a turn on a busy device included) to its ack, by device type.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
	}, []string{"device_type"})
	m.turnWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Name: "link_wait_seconds", Help: "Time device commands waited for their turn on their device and link (link \"none\": devices on no link).",
		Buckets: []float64{.001, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}, []string{"link"})
	m.stepFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "step_failures_total", Help: "Failed step attempts, by error class and code.",
	}, []string{"class", "code"})
	m.retries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "step_retries_total", Help: "Step attempts after the first, by scene.",
	}, []string{"scene"})
	m.waits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "step_waits_total", Help: "Steps that waited because their target was not ready (offline device, delay), by code; no attempt is spent.",
	}, []string{"code"})
	m.compensation = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "compensations_total", Help: "Compensation attempts that finished, by result (succeeded, failed, retry).",
	}, []string{"result"})
	m.inFlight = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Name: "commands_in_flight", Help: "Device commands published and waiting for an ack.",
	})
	m.rejections = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "trigger_rejections_total", Help: "Triggers rejected, by reason.",
	}, []string{"reason"})
	m.reg.MustRegister(m.started, m.finished, m.stepDuration, m.ackLatency, m.turnWait, m.stepFailures, m.retries, m.waits,
		m.compensation, m.inFlight, m.rejections,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, r := range []string{"bad_json", "too_large", "missing_field", "invalid_field", "unknown_scene", "invalid_param", scenes.ReasonAlreadyRunning, scenes.ReasonOverloaded} {
		m.rejections.WithLabelValues(r)
	}
	return m
}

// rejected counts a trigger rejection. A nil *metrics is allowed so
// unit tests need not build one.
func (m *metrics) rejected(reason string) {
	if m != nil {
		m.rejections.WithLabelValues(reason).Inc()
	}
}

// watch registers the gauges read at scrape time.
func (m *metrics) watch(q queueSource, b brokerSource, stored func() (int, error)) {
	m.reg.MustRegister(&scrapeCollector{m: m, q: q, b: b, stored: stored})
}

// turn records a command's wait for its turn (devices.HandlerOptions.OnTurn).
func (m *metrics) turn(link string, waited time.Duration) {
	m.turnWait.WithLabelValues(linkLabel(link)).Observe(waited.Seconds())
}

// linkLabel names the devices on no link "none".
func linkLabel(link string) string {
	if link == "" {
		return "none"
	}
	return link
}

// watchLinks registers the links' admission gauges.
func (m *metrics) watchLinks(links func() map[string]devices.LinkStats) {
	m.reg.MustRegister(&linkCollector{links: links})
}

var (
	descLinkInFlight = prometheus.NewDesc(namespace+"_link_in_flight", "Device commands not yet acked, by link (\"none\": devices on no link).", []string{"link"}, nil)
	descLinkQueued   = prometheus.NewDesc(namespace+"_link_queued", "Device commands waiting for their turn on their device or link, by link.", []string{"link"}, nil)
)

// linkCollector reads the admission state at scrape time.
type linkCollector struct {
	links func() map[string]devices.LinkStats
}

func (c *linkCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descLinkInFlight
	ch <- descLinkQueued
}

func (c *linkCollector) Collect(ch chan<- prometheus.Metric) {
	for link, s := range c.links() {
		ch <- prometheus.MustNewConstMetric(descLinkInFlight, prometheus.GaugeValue, float64(s.InFlight), linkLabel(link))
		ch <- prometheus.MustNewConstMetric(descLinkQueued, prometheus.GaugeValue, float64(s.Queued), linkLabel(link))
	}
}

// watchSync registers the hub sync gauges.
func (m *metrics) watchSync(up syncSource, ob outboxSource) {
	m.reg.MustRegister(&syncCollector{up: up, ob: ob})
}

var (
	descOutbox     = prometheus.NewDesc(namespace+"_outbox_entries", "Mission events waiting for the hub's acknowledgement.", nil, nil)
	descCompacted  = prometheus.NewDesc(namespace+"_outbox_compacted_total", "Outbox events dropped by compaction (the outbox was full; each mission kept its latest).", nil, nil)
	descSyncLag    = prometheus.NewDesc(namespace+"_hub_sync_lag_seconds", "Age of the oldest event the hub has not acknowledged; 0 when in sync.", nil, nil)
	descHubUp      = prometheus.NewDesc(namespace+"_hub_connected", "1 when the connection to the hub is up.", nil, nil)
	descHubAcked   = prometheus.NewDesc(namespace+"_hub_acked_entries_total", "Outbox entries the hub acknowledged.", nil, nil)
	descHubResends = prometheus.NewDesc(namespace+"_hub_resends_total", "Times unacknowledged events were sent to the hub again.", nil, nil)
)

// syncCollector reads the uplink and outbox at scrape time.
type syncCollector struct {
	up syncSource
	ob outboxSource
}

func (c *syncCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descOutbox, descCompacted, descSyncLag, descHubUp, descHubAcked, descHubResends} {
		ch <- d
	}
}

func (c *syncCollector) Collect(ch chan<- prometheus.Metric) {
	ob := c.ob.OutboxStats()
	st := c.up.Stats()
	up := 0.0
	if st.Connected {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(descOutbox, prometheus.GaugeValue, float64(ob.Len))
	ch <- prometheus.MustNewConstMetric(descCompacted, prometheus.CounterValue, float64(ob.Compacted))
	ch <- prometheus.MustNewConstMetric(descSyncLag, prometheus.GaugeValue, st.Lag.Seconds())
	ch <- prometheus.MustNewConstMetric(descHubUp, prometheus.GaugeValue, up)
	ch <- prometheus.MustNewConstMetric(descHubAcked, prometheus.CounterValue, float64(st.Acked))
	ch <- prometheus.MustNewConstMetric(descHubResends, prometheus.CounterValue, float64(st.Resends))
}

// setDeviceTypes gives the metrics the device-type label of each device.
func (m *metrics) setDeviceTypes(types map[string]string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, v := range types {
		m.kinds[k] = v
	}
}

// stepKey names one step of one mission.
type stepKey struct {
	mission string
	step    int
}

// setTerminal replaces the counts of finished missions in the store: at
// start-up and after retention deletes some.
func (m *metrics) setTerminal(counts map[driver.State]int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.terminal = counts
}

// Observe derives the event-driven metrics from mission events.
func (m *metrics) Observe(ev driver.Event, ms *driver.Mission) {
	switch ev.Input {
	case driver.InSubmit:
		m.started.WithLabelValues(ms.Type).Inc()
	case driver.InBeginStep:
		m.mu.Lock()
		m.begins[stepKey{ms.ID, ev.Step}] = ev.Time
		m.mu.Unlock()
		if ev.Attempt > 1 {
			m.retries.WithLabelValues(ms.Type).Inc()
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
			m.stepFailures.WithLabelValues(ev.Detail, codeLabel(ev.Code)).Inc()
		}
		if ok && ev.Step >= 0 && ev.Step < len(ms.Steps) {
			var out map[string]any
			if ev.Step < len(ms.Results) {
				out = ms.Results[ev.Step].Outputs
			}
			dev, action := devices.RanTarget(ms.Steps[ev.Step], out)
			m.stepDuration.WithLabelValues(m.deviceType(dev, ms.Steps[ev.Step].Kind), action, result).Observe(ev.Time.Sub(began).Seconds())
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
		m.finished.WithLabelValues(ms.Type, string(ev.To)).Inc()
		m.mu.Lock()
		m.terminal[ev.To]++
		for i := range ms.Steps {
			delete(m.begins, stepKey{ms.ID, i})
		}
		m.mu.Unlock()
	}
	if ev.Input == driver.InRetry {
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

func (m *metrics) deviceType(device, kind string) string {
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
func (m *metrics) instrument(h driver.Handler) driver.Handler {
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
			m.ackLatency.WithLabelValues(m.deviceType(dev, req.Kind)).Observe(time.Since(start).Seconds())
		}
		return out, err
	})
}

// scrapeCollector computes gauges from live state at scrape time.
type scrapeCollector struct {
	m      *metrics
	q      queueSource
	b      brokerSource
	stored func() (int, error)
}

var (
	descMissions  = prometheus.NewDesc(namespace+"_missions", "Missions by state (active ones from the loop, finished ones stored).", []string{"state"}, nil)
	descRunnable  = prometheus.NewDesc(namespace+"_runnable_missions", "Missions due now and waiting for a worker.", nil, nil)
	descRunning   = prometheus.NewDesc(namespace+"_running_steps", "Steps executing now (holding a worker).", nil, nil)
	descParked    = prometheus.NewDesc(namespace+"_parked_steps", "Step attempts waiting for an ack, a state or their turn, holding no worker.", nil, nil)
	descZombies   = prometheus.NewDesc(namespace+"_abandoned_handlers", "Step handlers that ignored their timeout, were abandoned and have not returned.", nil, nil)
	descOldest    = prometheus.NewDesc(namespace+"_oldest_runnable_age_seconds", "How long the oldest due mission has waited for a worker.", nil, nil)
	descConnected = prometheus.NewDesc(namespace+"_broker_connected", "1 when the device connection to the broker is up.", nil, nil)
	descReconnect = prometheus.NewDesc(namespace+"_broker_reconnects_total", "Reconnections of the device connection.", nil, nil)
	descLateAcks  = prometheus.NewDesc(namespace+"_device_late_acks_total", "Acks that arrived after their command gave up waiting.", nil, nil)
	descDupAcks   = prometheus.NewDesc(namespace+"_device_duplicate_acks_total", "Acks for a command already completed.", nil, nil)
	descTimeouts  = prometheus.NewDesc(namespace+"_device_ack_timeouts_total", "Commands that got no ack in time.", nil, nil)
	descStored    = prometheus.NewDesc(namespace+"_store_missions", "Missions in the database, finished ones included.", nil, nil)
)

func (c *scrapeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descMissions, descRunnable, descRunning, descParked, descZombies, descOldest, descConnected, descReconnect, descLateAcks, descDupAcks, descTimeouts, descStored} {
		ch <- d
	}
}

func (c *scrapeCollector) Collect(ch chan<- prometheus.Metric) {
	q := c.q.Queue()
	c.m.mu.Lock()
	terminal := make(map[driver.State]int, len(c.m.terminal))
	for s, n := range c.m.terminal {
		terminal[s] = n
	}
	c.m.mu.Unlock()
	for _, s := range driver.States {
		n := q.ByState[s]
		if s.Terminal() {
			n = terminal[s]
		}
		ch <- prometheus.MustNewConstMetric(descMissions, prometheus.GaugeValue, float64(n), string(s))
	}
	ch <- prometheus.MustNewConstMetric(descRunnable, prometheus.GaugeValue, float64(q.Due))
	ch <- prometheus.MustNewConstMetric(descRunning, prometheus.GaugeValue, float64(q.Running))
	ch <- prometheus.MustNewConstMetric(descParked, prometheus.GaugeValue, float64(q.Parked))
	ch <- prometheus.MustNewConstMetric(descZombies, prometheus.GaugeValue, float64(q.Zombies))
	age := 0.0
	if !q.OldestDue.IsZero() {
		age = max(time.Since(q.OldestDue).Seconds(), 0)
	}
	ch <- prometheus.MustNewConstMetric(descOldest, prometheus.GaugeValue, age)
	if c.b != nil {
		st := c.b.Stats()
		up := 0.0
		if c.b.Connected() {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(descConnected, prometheus.GaugeValue, up)
		ch <- prometheus.MustNewConstMetric(descReconnect, prometheus.CounterValue, float64(st.Reconnects))
		ch <- prometheus.MustNewConstMetric(descLateAcks, prometheus.CounterValue, float64(st.LateAcks))
		ch <- prometheus.MustNewConstMetric(descDupAcks, prometheus.CounterValue, float64(st.Duplicates))
		ch <- prometheus.MustNewConstMetric(descTimeouts, prometheus.CounterValue, float64(st.Timeouts))
	}
	if c.stored != nil {
		if n, err := c.stored(); err == nil {
			ch <- prometheus.MustNewConstMetric(descStored, prometheus.GaugeValue, float64(n))
		}
	}
}
