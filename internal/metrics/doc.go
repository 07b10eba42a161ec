// Package metrics is the agent's Prometheus exporter: counters, gauges
// and histograms, with or without labels, values read at scrape time,
// the Go runtime's and the process's own metrics, and a Registry that
// writes them in the Prometheus text exposition format 0.0.4 and serves
// them over HTTP.
//
// # Why not client_golang
//
// prometheus/client_golang, with protobuf, prometheus/common, procfs and
// the rest it pulls in, cost 2.1 MB of an agent binary for ARM gateways
// whose budget is 10 MiB. The agent needs a small part of it: a few
// families, text format, one registry. This package is that part.
//
// # Use
//
// Make the metrics (NewCounterVec, NewHistogramVec, NewGauge, ...),
// register them on a Registry, and serve the Registry (it is an
// http.Handler) on /metrics. Values computed at scrape time come from a
// Collector: it describes its families once (Describe, NewDesc) and emits
// their samples at every scrape (Collect, Scrape.Emit).
//
// A vector's child is made by the first With for its label values and
// kept for good, so label values must come from a bounded set. Once
// made, With finds it again without allocating (a map keyed by the label
// values, read under a read lock); a caller on a hot path may also keep
// the *Counter it returned.
//
// # What the text looks like
//
// Families are written sorted by name, each with its # HELP and # TYPE
// lines; a family with no series (a vector nothing has counted yet) is
// left out. Within a family, series are sorted by their label values,
// taken in the order of the label names; labels are written sorted by
// name, with a histogram's le (or a summary's quantile) last. Values are
// written as strconv.FormatFloat(v, 'g', -1, 64) does (1, 0.25, 1e+06,
// +Inf, NaN). Label values are escaped (backslash, double quote,
// newline) and help texts too (backslash, newline); bytes that are not
// UTF-8 are replaced by U+FFFD (a run of them by one), since Prometheus
// refuses them. This is what client_golang wrote (it refused such bytes
// instead), so dashboards built on its output read ours.
//
// # Concurrency
//
// Metrics, vectors and Registries are safe for concurrent use. A
// Registry calls its collectors' Collect at every scrape, from the
// scraping request's goroutine, several at once if scrapes overlap.
package metrics
