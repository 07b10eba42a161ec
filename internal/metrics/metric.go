package metrics

import (
	"fmt"
	"math"
	"sort"
	"sync"
	"sync/atomic"
)

// Counter is a value that only goes up. A Counter made by NewCounter is
// a Collector of its own family; one returned by CounterVec.With is a
// series of the vector's. Safe for concurrent use.
type Counter struct {
	v    atomicFloat
	desc *Desc // nil in a vector's child
}

// NewCounter makes a counter without labels; NewDesc says which names
// are valid.
func NewCounter(name, help string) *Counter {
	return &Counter{desc: NewDesc(name, help, TypeCounter)}
}

// Inc adds one.
func (c *Counter) Inc() { c.v.add(1) }

// Add adds v, which must not be negative: a counter that went down would
// read as a restart. It panics if v < 0.
func (c *Counter) Add(v float64) {
	if v < 0 {
		panic(fmt.Sprintf("metrics: counter decreased by %v", -v))
	}
	c.v.add(v)
}

// Value returns the current count.
func (c *Counter) Value() float64 { return c.v.load() }

// Describe returns the counter's family.
func (c *Counter) Describe() []*Desc { return []*Desc{c.desc} }

// Collect emits the counter's value.
func (c *Counter) Collect(s *Scrape) { s.Emit(c.desc, c.Value()) }

func (c *Counter) fill(s *sample) { s.value = c.Value() }

// Gauge is a value that goes up and down. A Gauge made by NewGauge is a
// Collector of its own family; one returned by GaugeVec.With is a series
// of the vector's. Safe for concurrent use.
type Gauge struct {
	v    atomicFloat
	desc *Desc // nil in a vector's child
}

// NewGauge makes a gauge without labels.
func NewGauge(name, help string) *Gauge {
	return &Gauge{desc: NewDesc(name, help, TypeGauge)}
}

// Set sets the gauge to v.
func (g *Gauge) Set(v float64) { g.v.bits.Store(math.Float64bits(v)) }

// Add adds v (subtracts it when negative).
func (g *Gauge) Add(v float64) { g.v.add(v) }

// Inc adds one.
func (g *Gauge) Inc() { g.v.add(1) }

// Dec subtracts one.
func (g *Gauge) Dec() { g.v.add(-1) }

// Value returns the gauge's value.
func (g *Gauge) Value() float64 { return g.v.load() }

// Describe returns the gauge's family.
func (g *Gauge) Describe() []*Desc { return []*Desc{g.desc} }

// Collect emits the gauge's value.
func (g *Gauge) Collect(s *Scrape) { s.Emit(g.desc, g.Value()) }

func (g *Gauge) fill(s *sample) { s.value = g.Value() }

// Histogram counts observations in buckets by upper bound (each bucket
// counts the values less than or equal to its bound, and a last one,
// +Inf, all of them) and sums them. A Histogram made by NewHistogram is a
// Collector of its own family; one returned by HistogramVec.With is a
// series of the vector's. Safe for concurrent use.
type Histogram struct {
	desc   *Desc     // nil in a vector's child
	bounds []float64 // sorted upper bounds, +Inf excluded; shared by a vector's children

	mu     sync.Mutex
	counts []uint64 // per bucket, not cumulative; the last one is +Inf's
	sum    float64
}

// NewHistogram makes a histogram without labels. buckets are the upper
// bounds, in increasing order; +Inf is always added (and may be given
// last). It panics if the buckets are not increasing.
func NewHistogram(name, help string, buckets []float64) *Histogram {
	d := NewDesc(name, help, TypeHistogram)
	h := newHistogram(checkBuckets(name, buckets))
	h.desc = d
	return h
}

func newHistogram(bounds []float64) *Histogram {
	return &Histogram{bounds: bounds, counts: make([]uint64, len(bounds)+1)}
}

// checkBuckets returns the bounds without a last +Inf, and panics if they
// are not strictly increasing.
func checkBuckets(name string, buckets []float64) []float64 {
	if n := len(buckets); n > 0 && math.IsInf(buckets[n-1], +1) {
		buckets = buckets[:n-1]
	}
	for i, b := range buckets {
		if math.IsNaN(b) || math.IsInf(b, 0) || i > 0 && b <= buckets[i-1] {
			panic(fmt.Sprintf("metrics: %s: buckets not increasing: %v", name, buckets))
		}
	}
	return append([]float64(nil), buckets...)
}

// Observe counts v in its bucket and adds it to the sum. NaN counts in
// +Inf's bucket only (and makes the sum NaN).
func (h *Histogram) Observe(v float64) {
	i := sort.SearchFloat64s(h.bounds, v)
	h.mu.Lock()
	h.counts[i]++
	h.sum += v
	h.mu.Unlock()
}

// Describe returns the histogram's family.
func (h *Histogram) Describe() []*Desc { return []*Desc{h.desc} }

// Collect emits the histogram's buckets, sum and count.
func (h *Histogram) Collect(s *Scrape) {
	smp := sample{}
	h.fill(&smp)
	s.add(h.desc, smp)
}

// fill takes a consistent snapshot: the +Inf bucket equals the count,
// and the sum is of the same observations.
func (h *Histogram) fill(s *sample) {
	s.points = make([]point, len(h.bounds))
	h.mu.Lock()
	defer h.mu.Unlock()
	var cum uint64
	for i, b := range h.bounds {
		cum += h.counts[i]
		s.points[i] = point{at: b, v: float64(cum)}
	}
	s.count = cum + h.counts[len(h.bounds)]
	s.value = h.sum
}

// CounterVec is a family of counters told apart by label values.
type CounterVec struct{ v vec[*Counter] }

// NewCounterVec makes a counter family with the given label names.
func NewCounterVec(name, help string, labels ...string) *CounterVec {
	d := NewDesc(name, help, TypeCounter, labels...)
	return &CounterVec{v: newVec(d, func() *Counter { return new(Counter) })}
}

// With returns the counter for the label values, given in the order of
// the label names, making it at the first call. It panics if the number
// of values is wrong.
func (cv *CounterVec) With(values ...string) *Counter { return cv.v.with(values) }

// Describe returns the family.
func (cv *CounterVec) Describe() []*Desc { return []*Desc{cv.v.desc} }

// Collect emits one series per counter made.
func (cv *CounterVec) Collect(s *Scrape) { cv.v.collect(s) }

// GaugeVec is a family of gauges told apart by label values.
type GaugeVec struct{ v vec[*Gauge] }

// NewGaugeVec makes a gauge family with the given label names.
func NewGaugeVec(name, help string, labels ...string) *GaugeVec {
	d := NewDesc(name, help, TypeGauge, labels...)
	return &GaugeVec{v: newVec(d, func() *Gauge { return new(Gauge) })}
}

// With returns the gauge for the label values, as CounterVec.With does.
func (gv *GaugeVec) With(values ...string) *Gauge { return gv.v.with(values) }

// Describe returns the family.
func (gv *GaugeVec) Describe() []*Desc { return []*Desc{gv.v.desc} }

// Collect emits one series per gauge made.
func (gv *GaugeVec) Collect(s *Scrape) { gv.v.collect(s) }

// HistogramVec is a family of histograms, with the same buckets, told
// apart by label values.
type HistogramVec struct{ v vec[*Histogram] }

// NewHistogramVec makes a histogram family with the given buckets (as
// NewHistogram takes them) and label names.
func NewHistogramVec(name, help string, buckets []float64, labels ...string) *HistogramVec {
	d := NewDesc(name, help, TypeHistogram, labels...)
	bounds := checkBuckets(name, buckets)
	return &HistogramVec{v: newVec(d, func() *Histogram { return newHistogram(bounds) })}
}

// With returns the histogram for the label values, as CounterVec.With
// does.
func (hv *HistogramVec) With(values ...string) *Histogram { return hv.v.with(values) }

// Describe returns the family.
func (hv *HistogramVec) Describe() []*Desc { return []*Desc{hv.v.desc} }

// Collect emits one series per histogram made.
func (hv *HistogramVec) Collect(s *Scrape) { hv.v.collect(s) }

// NewGaugeFunc returns a Collector of a gauge without labels whose value
// f returns at each scrape. f may be called from several goroutines at
// once.
func NewGaugeFunc(name, help string, f func() float64) Collector {
	return &funcCollector{desc: NewDesc(name, help, TypeGauge), f: f}
}

// NewCounterFunc is NewGaugeFunc for a counter: f returns a total that
// only goes up.
func NewCounterFunc(name, help string, f func() float64) Collector {
	return &funcCollector{desc: NewDesc(name, help, TypeCounter), f: f}
}

type funcCollector struct {
	desc *Desc
	f    func() float64
}

func (c *funcCollector) Describe() []*Desc { return []*Desc{c.desc} }
func (c *funcCollector) Collect(s *Scrape) { s.Emit(c.desc, c.f()) }

// atomicFloat is a float64 updated with compare-and-swap.
type atomicFloat struct{ bits atomic.Uint64 }

func (f *atomicFloat) load() float64 { return math.Float64frombits(f.bits.Load()) }

func (f *atomicFloat) add(v float64) {
	for {
		old := f.bits.Load()
		if f.bits.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}
