package hub

import (
	"context"
	"errors"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// hubMetrics are the hub's /metrics: fleet aggregates only. A label per
// gateway would grow the series with the fleet; the API has each
// gateway's detail.
type hubMetrics struct {
	reg *prometheus.Registry
	// handler serves reg: the text format 0.0.4, or OpenMetrics to a
	// scraper that asks for it; a collector that fails leaves out its
	// families, not the scrape.
	handler http.Handler

	stored, duplicates, gaps, gapsFilled, rejected, traces, acks prometheus.Counter
	controlResends                                               prometheus.Counter
	lag                                                          prometheus.Histogram
	controls                                                     *prometheus.CounterVec
}

// Control results, the values of sortie_hub_controls_total's result.
const (
	controlOK      = "ok"      // the gateway carried it out
	controlFailed  = "failed"  // the gateway answered ok=false
	controlOffline = "offline" // not sent: the gateway is not online
	controlTimeout = "timeout" // no result in time (the gateway may still act)
	controlError   = "error"   // not sent: invalid, or the hub is disconnected
)

// scrapeWait bounds the store reads of one scrape.
const scrapeWait = 5 * time.Second

func newHubMetrics(s *Service) *hubMetrics {
	const ns = "sortie_hub"
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: ns + name, Help: help})
	}
	reg := prometheus.NewRegistry()
	m := &hubMetrics{
		reg: reg,
		handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{
			EnableOpenMetrics: true,
			ErrorHandling:     promhttp.ContinueOnError,
		}),
		stored:     counter("_events_stored_total", "Mission events stored (first copies)."),
		duplicates: counter("_events_duplicate_total", "Mission events received again and not stored (resends)."),
		gaps:       counter("_gaps_total", "Gaps found in a mission's events (compacted ones included)."),
		gapsFilled: counter("_gaps_filled_total", "Gaps the missing events filled later (they arrived out of order)."),
		rejected:   counter("_messages_rejected_total", "Gateway messages refused whole (bad IDs, a body naming another gateway)."),
		traces:     counter("_trace_records_total", "Gateways' trigger records stored (first copies)."),
		acks:       counter("_acks_total", "Acks published to gateways."),
		controlResends: counter("_control_resends_total",
			"Control requests sent again while waiting for their result (gateways of protocol 2 take them at QoS 0)."),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{Name: ns + "_ingest_lag_seconds",
			Help:    "From a mission's last change on its gateway (gateway clock) to the hub storing it (hub clock).",
			Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600}}),
		controls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: ns + "_controls_total",
			Help: "Control requests, by action and result (ok, failed, offline, timeout, error)."}, []string{"action", "result"}),
	}
	reg.MustRegister(m.stored, m.duplicates, m.gaps, m.gapsFilled, m.rejected, m.traces, m.acks, m.controlResends, m.lag, m.controls,
		gatewayStates{desc: prometheus.NewDesc(ns+"_gateways", "Gateways known, by state (online, offline, unknown).", []string{"state"}, nil), st: s.st},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: ns + "_store_bytes", Help: "Size of the hub's database (the bbolt file, or the PostgreSQL database)."}, func() float64 {
			if sz, ok := s.st.(interface{ size() int64 }); ok {
				return float64(sz.size())
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: ns + "_queue_depth", Help: "Gateway messages received and waiting to be stored."}, func() float64 { return float64(len(s.queue)) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: ns + "_broker_connected", Help: "1 while the hub's link to its gateways is up (its MQTT connection, or NATS in the cluster mode)."}, func() float64 {
			if s.Connected() {
				return 1
			}
			return 0
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: ns + "_nats_permission_denials_total",
			Help: "Permission violations NATS reported to the hub's user (the cluster mode; 0 otherwise): any is a misconfigured user, see docs/cluster.md."},
			func() float64 {
				if l, ok := s.link.(*natsLink); ok {
					return float64(l.violations.Load())
				}
				return 0
			}),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if s.fleet != nil {
		reg.MustRegister(s.fleet.metrics.collectors()...)
	}
	return m
}

// gatewayStates counts the gateways by state at each scrape.
type gatewayStates struct {
	desc *prometheus.Desc
	st   Reader
}

func (g gatewayStates) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }

func (g gatewayStates) Collect(ch chan<- prometheus.Metric) {
	// A scrape has no context of its own (client_golang's Collect
	// takes none): bounded, so a database that does not answer costs
	// this family, not a hung scrape.
	ctx, cancel := context.WithTimeout(context.Background(), scrapeWait)
	defer cancel()
	n := map[string]float64{StateOnline: 0, StateOffline: 0, StateUnknown: 0}
	gws, err := g.st.GatewayBriefs(ctx) // the briefs: a scrape of 10,000 gateways reads no record
	if err != nil {
		return // the family is left out of this scrape
	}
	for _, gw := range gws {
		n[gw.State]++
	}
	for _, state := range []string{StateOnline, StateOffline, StateUnknown} {
		ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, n[state], state)
	}
}

// observe counts what one commit stored.
func (m *hubMetrics) observe(res Result, now time.Time) {
	m.stored.Add(float64(res.Stored))
	m.duplicates.Add(float64(res.Duplicates))
	m.gaps.Add(float64(len(res.Gaps)))
	m.gapsFilled.Add(float64(res.GapsFilled))
	m.rejected.Add(float64(len(res.Rejected)))
	m.traces.Add(float64(res.TraceRecords))
	for _, ms := range res.Missions {
		if !ms.Summary.Updated.IsZero() {
			m.lag.Observe(max(now.Sub(ms.Summary.Updated).Seconds(), 0))
		}
	}
}

// control counts a control request by its result.
func (m *hubMetrics) control(action string, r bool, err error) {
	result := controlOK
	switch {
	case errors.Is(err, ErrOffline):
		result = controlOffline
	case errors.Is(err, ErrTimeout):
		result = controlTimeout
	case err != nil:
		result = controlError
	case !r:
		result = controlFailed
	}
	switch action {
	case "trigger", "pause", "resume", "cancel", "retry":
	default:
		action = "other" // bounded: actions are refused before this, but a label must not grow
	}
	m.controls.WithLabelValues(action, result).Inc()
}

// size is the database file's size, 0 when it cannot be read.
func (s *Store) size() int64 {
	fi, err := os.Stat(s.db.Path())
	if err != nil {
		return 0
	}
	return fi.Size()
}
