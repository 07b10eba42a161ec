package hub

import (
	"github.com/prometheus/client_golang/prometheus"
)

// fleetMetrics are the rollout engine's: counters it updates, and
// gauges read from its state at each scrape. No label per gateway or
// per rollout: the API has those.
type fleetMetrics struct {
	offers, statuses, drift *prometheus.CounterVec
	aborts                  prometheus.Counter
	f                       *Fleet
	rollouts, targets       *prometheus.Desc
	drifted                 *prometheus.Desc
}

func newFleetMetrics(f *Fleet) *fleetMetrics {
	const ns = "sortie_hub"
	return &fleetMetrics{
		f: f,
		offers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: ns + "_bundle_offers_total",
			Help: "Bundle offers published to gateways, by kind (rollout, resend, rollback, revert)."}, []string{"kind"}),
		statuses: prometheus.NewCounterVec(prometheus.CounterOpts{Name: ns + "_bundle_statuses_total",
			Help: "Bundle statuses received, by result: new, repeat (same gateway, version and step), old (an older version or step: changes nothing), invalid."}, []string{"result"}),
		drift: prometheus.NewCounterVec(prometheus.CounterOpts{Name: ns + "_drift_actions_total",
			Help: "What the drift policy did: adopt (took what a gateway runs), revert (offered it the bundle it should run)."}, []string{"action"}),
		aborts: prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "_rollout_aborts_total",
			Help: "Rollouts aborted (by the failure threshold or an operator)."}),
		rollouts: prometheus.NewDesc(ns+"_rollouts", "Rollouts, by state (running, paused, aborting, aborted, completed, superseded).", []string{"state"}, nil),
		targets: prometheus.NewDesc(ns+"_rollout_gateways",
			"Gateways of the active rollouts (running, paused, aborting), by status (pending, notified, received, applied, healthy, failed, unreachable, skipped, not_sent, superseded).", []string{"status"}, nil),
		drifted: prometheus.NewDesc(ns+"_gateways_drifted", "Gateways whose running configuration is not the bundle the hub expects there.", nil, nil),
	}
}

func (m *fleetMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.offers, m.statuses, m.drift, m.aborts, m}
}

// Describe implements prometheus.Collector.
func (m *fleetMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.rollouts
	ch <- m.targets
	ch <- m.drifted
}

// Collect implements prometheus.Collector.
func (m *fleetMetrics) Collect(ch chan<- prometheus.Metric) {
	f := m.f
	f.mu.Lock()
	states := map[string]float64{RolloutRunning: 0, RolloutPaused: 0, RolloutAborting: 0, RolloutAborted: 0, RolloutCompleted: 0, RolloutSuperseded: 0}
	statuses := map[string]float64{}
	for _, s := range []string{TargetPending, TargetNotified, TargetReceived, TargetApplied, TargetHealthy, TargetFailed, TargetUnreachable, TargetSkipped, TargetNotSent, TargetSuperseded} {
		statuses[s] = 0
	}
	for _, run := range f.order {
		states[run.r.State]++
		if run.r.active() {
			for _, t := range run.targets {
				statuses[t.Status]++
			}
		}
	}
	drifted := 0.0
	for _, g := range f.gws {
		if g.Drifted {
			drifted++
		}
	}
	f.mu.Unlock()
	for s, n := range states {
		ch <- prometheus.MustNewConstMetric(m.rollouts, prometheus.GaugeValue, n, s)
	}
	for s, n := range statuses {
		ch <- prometheus.MustNewConstMetric(m.targets, prometheus.GaugeValue, n, s)
	}
	ch <- prometheus.MustNewConstMetric(m.drifted, prometheus.GaugeValue, drifted)
}
