package metrics

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// ContentType is the media type of the text exposition format 0.0.4,
// which Registry writes.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// ErrDuplicate is returned by Register for a family whose name is
// registered already.
var ErrDuplicate = errors.New("metrics: family registered twice")

// Collector provides families of samples to a Registry. Every metric of
// this package is one; a type of the caller's implements it to compute
// values at scrape time.
type Collector interface {
	// Describe returns the families Collect emits. A Registry calls it
	// once, in Register.
	Describe() []*Desc
	// Collect emits the current samples of the families Describe
	// returned, with Scrape.Emit. A Registry calls it at every scrape,
	// from several goroutines at once if scrapes overlap.
	Collect(s *Scrape)
}

// Registry holds collectors and writes their samples in the text
// exposition format. It is an http.Handler serving that text. The zero
// value is not usable; make one with NewRegistry. Safe for concurrent
// use: collectors may be registered while it is scraped.
type Registry struct {
	mu         sync.RWMutex
	collectors []Collector
	descs      []*Desc // sorted by name
}

// NewRegistry returns an empty Registry.
func NewRegistry() *Registry { return &Registry{} }

// Register adds collectors. It fails, and adds none of them, if one
// describes a family whose name is already registered (ErrDuplicate).
func (r *Registry) Register(cs ...Collector) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	descs := slices.Clone(r.descs)
	for _, c := range cs {
		for _, d := range c.Describe() {
			if d == nil {
				return fmt.Errorf("metrics: %T describes a nil family", c)
			}
			i, found := slices.BinarySearchFunc(descs, d.name, func(e *Desc, name string) int { return strings.Compare(e.name, name) })
			if found {
				return fmt.Errorf("%w: %s", ErrDuplicate, d.name)
			}
			descs = slices.Insert(descs, i, d)
		}
	}
	r.descs = descs
	r.collectors = append(r.collectors, cs...)
	return nil
}

// MustRegister is Register for collectors fixed in the code: it panics
// if Register fails.
func (r *Registry) MustRegister(cs ...Collector) {
	if err := r.Register(cs...); err != nil {
		panic(err)
	}
}

// Scrape collects the samples of one scrape: a Registry hands it to each
// of its collectors' Collect. It is valid only during that call.
type Scrape struct {
	fams map[*Desc][]sample
}

// Emit adds one sample of a counter or gauge family that the collector
// described, with its label values in the order the Desc declared them.
// It panics if the family is a histogram or a summary, or if the number
// of label values is wrong. A series emitted twice in one scrape is
// written once, with the first value; the samples of a family that is
// not registered are not written.
func (s *Scrape) Emit(d *Desc, v float64, labelValues ...string) {
	if d.typ != TypeCounter && d.typ != TypeGauge {
		panic(fmt.Sprintf("metrics: %s: Emit of a %s", d.name, d.typ))
	}
	key, text := d.series(labelValues)
	s.add(d, sample{key: key, labels: text, value: v})
}

func (s *Scrape) add(d *Desc, smp sample) {
	s.fams[d] = append(s.fams[d], smp)
}

// sample is one series of a family at one scrape.
type sample struct {
	key    []string // label values in the order of the label names
	labels string   // name="value",... as written, without braces
	value  float64  // a counter's or gauge's value; a histogram's or summary's sum
	count  uint64   // histogram and summary: observations
	// points are a histogram's cumulative counts by upper bound (+Inf
	// excluded: its count is count), or a summary's values by quantile.
	points []point
}

type point struct{ at, v float64 }

// WriteTo collects every registered collector and writes the samples to
// w in the text exposition format.
func (r *Registry) WriteTo(w io.Writer) (int64, error) {
	n, err := w.Write(r.appendText(nil))
	return int64(n), err
}

// ServeHTTP answers a scrape with the text exposition format.
func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	b := r.appendText(nil)
	h := w.Header()
	h.Set("Content-Type", ContentType)
	h.Set("Content-Length", strconv.Itoa(len(b)))
	if req.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(b) // the scraper hung up: there is no one left to tell
}

// appendText collects and appends the exposition to b.
func (r *Registry) appendText(b []byte) []byte {
	s := &Scrape{fams: map[*Desc][]sample{}}
	r.mu.RLock()
	for _, c := range r.collectors {
		c.Collect(s)
	}
	descs := r.descs
	r.mu.RUnlock()
	for _, d := range descs {
		samples := s.fams[d]
		if len(samples) == 0 {
			continue
		}
		slices.SortStableFunc(samples, func(a, b sample) int { return slices.Compare(a.key, b.key) })
		samples = slices.CompactFunc(samples, func(a, b sample) bool { return slices.Equal(a.key, b.key) })
		b = appendFamily(b, d, samples)
	}
	return b
}

// appendFamily writes one family: its # HELP and # TYPE lines, then its
// samples in order.
func appendFamily(b []byte, d *Desc, samples []sample) []byte {
	b = append(b, "# HELP "...)
	b = append(b, d.name...)
	b = append(b, ' ')
	b = appendEscaped(b, strings.ToValidUTF8(d.help, string(utf8.RuneError)), false)
	b = append(b, "\n# TYPE "...)
	b = append(b, d.name...)
	b = append(b, ' ')
	b = append(b, d.typ.String()...)
	b = append(b, '\n')
	for _, s := range samples {
		switch d.typ {
		case TypeHistogram:
			for _, p := range s.points {
				b = appendLine(b, d.name, "_bucket", s.labels, "le", p.at, p.v)
			}
			b = appendLine(b, d.name, "_bucket", s.labels, "le", math.Inf(+1), float64(s.count))
			b = appendLine(b, d.name, "_sum", s.labels, "", 0, s.value)
			b = appendLine(b, d.name, "_count", s.labels, "", 0, float64(s.count))
		case TypeSummary:
			for _, p := range s.points {
				b = appendLine(b, d.name, "", s.labels, "quantile", p.at, p.v)
			}
			b = appendLine(b, d.name, "_sum", s.labels, "", 0, s.value)
			b = appendLine(b, d.name, "_count", s.labels, "", 0, float64(s.count))
		default:
			b = appendLine(b, d.name, "", s.labels, "", 0, s.value)
		}
	}
	return b
}

// appendLine writes one sample line: the name and suffix, the labels
// with an extra one last (a bucket's le, a quantile) if extra is set,
// and the value.
func appendLine(b []byte, name, suffix, labels, extra string, extraValue, v float64) []byte {
	b = append(b, name...)
	b = append(b, suffix...)
	if labels != "" || extra != "" {
		b = append(b, '{')
		b = append(b, labels...)
		if extra != "" {
			if labels != "" {
				b = append(b, ',')
			}
			b = append(b, extra...)
			b = append(b, `="`...)
			b = appendFloat(b, extraValue)
			b = append(b, '"')
		}
		b = append(b, '}')
	}
	b = append(b, ' ')
	b = appendFloat(b, v)
	return append(b, '\n')
}

// appendFloat writes v as Prometheus clients do: the shortest 'g' form,
// so 1, 0.005, 1.5e+06, +Inf, -Inf and NaN.
func appendFloat(b []byte, v float64) []byte {
	return strconv.AppendFloat(b, v, 'g', -1, 64)
}
