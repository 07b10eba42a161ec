package metrics

import (
	"bytes"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// text returns what r writes.
func text(t testing.TB, r *Registry) string {
	t.Helper()
	var b strings.Builder
	if _, err := r.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func wantText(t *testing.T, r *Registry, want string) {
	t.Helper()
	want = strings.TrimPrefix(want, "\n")
	if got := text(t, r); got != want {
		t.Errorf("exposition:\n%s\nwant:\n%s", got, want)
	}
}

// TestCountersAndGaugesText: families sorted by name, each with its HELP
// and TYPE; labels written sorted by name whatever their declared order;
// series sorted by label values in that order; a vector with no series
// left out.
func TestCountersAndGaugesText(t *testing.T) {
	r := NewRegistry()
	finished := NewCounterVec("sortie_missions_finished_total", "Missions finished.", "scene", "outcome")
	r.MustRegister(
		finished,
		NewCounterVec("sortie_step_failures_total", "Nothing failed yet.", "class"),
		NewGauge("sortie_commands_in_flight", "In flight."),
		NewCounter("sortie_a_total", "First by name."),
	)
	finished.With("go_home", "succeeded").Add(3)
	finished.With("all_off", "succeeded").Inc()
	finished.With("go_home", "failed").Inc()
	finished.With("all_off", "succeeded").Inc()
	wantText(t, r, `
# HELP sortie_a_total First by name.
# TYPE sortie_a_total counter
sortie_a_total 0
# HELP sortie_commands_in_flight In flight.
# TYPE sortie_commands_in_flight gauge
sortie_commands_in_flight 0
# HELP sortie_missions_finished_total Missions finished.
# TYPE sortie_missions_finished_total counter
sortie_missions_finished_total{outcome="failed",scene="go_home"} 1
sortie_missions_finished_total{outcome="succeeded",scene="all_off"} 2
sortie_missions_finished_total{outcome="succeeded",scene="go_home"} 3
`)
}

func TestGaugeMoves(t *testing.T) {
	g := NewGauge("g", "A gauge.")
	g.Inc()
	g.Inc()
	g.Dec()
	g.Add(0.5)
	if v := g.Value(); v != 1.5 {
		t.Errorf("after inc, inc, dec, add 0.5: %v, want 1.5", v)
	}
	g.Set(-4)
	r := NewRegistry()
	r.MustRegister(g)
	wantText(t, r, `
# HELP g A gauge.
# TYPE g gauge
g -4
`)
}

// TestHistogramText: cumulative buckets, +Inf equal to the count, sum
// and count; le after the other labels, which are sorted.
func TestHistogramText(t *testing.T) {
	r := NewRegistry()
	h := NewHistogramVec("step_duration_seconds", "Step durations.", []float64{.005, .5, 1, 30}, "result", "action")
	r.MustRegister(h, NewHistogram("empty_seconds", "No observation.", []float64{1, math.Inf(+1)}))
	for _, v := range []float64{0.001, 0.005, 0.2, 1, 45} {
		h.With("ok", "turn_on").Observe(v)
	}
	h.With("error", "turn_on").Observe(0.25)
	wantText(t, r, `
# HELP empty_seconds No observation.
# TYPE empty_seconds histogram
empty_seconds_bucket{le="1"} 0
empty_seconds_bucket{le="+Inf"} 0
empty_seconds_sum 0
empty_seconds_count 0
# HELP step_duration_seconds Step durations.
# TYPE step_duration_seconds histogram
step_duration_seconds_bucket{action="turn_on",result="error",le="0.005"} 0
step_duration_seconds_bucket{action="turn_on",result="error",le="0.5"} 1
step_duration_seconds_bucket{action="turn_on",result="error",le="1"} 1
step_duration_seconds_bucket{action="turn_on",result="error",le="30"} 1
step_duration_seconds_bucket{action="turn_on",result="error",le="+Inf"} 1
step_duration_seconds_sum{action="turn_on",result="error"} 0.25
step_duration_seconds_count{action="turn_on",result="error"} 1
step_duration_seconds_bucket{action="turn_on",result="ok",le="0.005"} 2
step_duration_seconds_bucket{action="turn_on",result="ok",le="0.5"} 3
step_duration_seconds_bucket{action="turn_on",result="ok",le="1"} 4
step_duration_seconds_bucket{action="turn_on",result="ok",le="30"} 4
step_duration_seconds_bucket{action="turn_on",result="ok",le="+Inf"} 5
step_duration_seconds_sum{action="turn_on",result="ok"} 46.206
step_duration_seconds_count{action="turn_on",result="ok"} 5
`)
}

// TestEscaping: label values escape backslash, double quote and newline;
// help text backslash and newline only, as the format says.
func TestEscaping(t *testing.T) {
	r := NewRegistry()
	c := NewCounterVec("odd_total", "Help with \\ a backslash,\na newline and \"quotes\".", "v")
	r.MustRegister(c)
	c.With("a\\b\"c\nd").Inc()
	c.With("é ☃ \t\r").Inc()
	c.With("\xff\xfe").Inc()
	wantText(t, r, `
# HELP odd_total Help with \\ a backslash,\na newline and "quotes".
# TYPE odd_total counter
odd_total{v="a\\b\"c\nd"} 1
odd_total{v="é ☃ `+"\t\r"+`"} 1
odd_total{v="�"} 1
`)
}

func TestFloatFormat(t *testing.T) {
	for _, c := range []struct {
		v    float64
		want string
	}{
		{0, "0"}, {1, "1"}, {-1, "-1"}, {3, "3"}, {0.005, "0.005"}, {2.5, "2.5"},
		{123456, "123456"}, {1e6, "1e+06"}, {1234567, "1.234567e+06"}, {1.5e-7, "1.5e-07"},
		{math.Inf(+1), "+Inf"}, {math.Inf(-1), "-Inf"}, {math.NaN(), "NaN"},
		{float64(^uint64(0)), "1.8446744073709552e+19"},
	} {
		if got := string(appendFloat(nil, c.v)); got != c.want {
			t.Errorf("%v: %q, want %q", c.v, got, c.want)
		}
	}
}

// scrapeFunc is a Collector of the caller's.
type scrapeFunc struct {
	descs   []*Desc
	collect func(*Scrape)
}

func (c scrapeFunc) Describe() []*Desc { return c.descs }
func (c scrapeFunc) Collect(s *Scrape) { c.collect(s) }

// TestCollectorEmits: values computed at scrape time, sorted like the
// others; a series emitted twice is written once; a family with nothing
// emitted is left out.
func TestCollectorEmits(t *testing.T) {
	links := NewDesc("sortie_link_queued", "Queued, by link.", TypeGauge, "link")
	acks := NewDesc("sortie_hub_acked_entries_total", "Acked.", TypeCounter)
	never := NewDesc("sortie_never", "Never emitted.", TypeGauge)
	stored := 3.0
	r := NewRegistry()
	r.MustRegister(scrapeFunc{descs: []*Desc{links, acks, never}, collect: func(s *Scrape) {
		s.Emit(links, 2, "zigbee")
		s.Emit(links, 0, "none")
		s.Emit(links, 9, "none")
		s.Emit(acks, 1234567)
	}}, NewGaugeFunc("sortie_store_missions", "Stored.", func() float64 { return stored }),
		NewCounterFunc("sortie_compacted_total", "Compacted.", func() float64 { return 0 }))
	stored = 4
	wantText(t, r, `
# HELP sortie_compacted_total Compacted.
# TYPE sortie_compacted_total counter
sortie_compacted_total 0
# HELP sortie_hub_acked_entries_total Acked.
# TYPE sortie_hub_acked_entries_total counter
sortie_hub_acked_entries_total 1.234567e+06
# HELP sortie_link_queued Queued, by link.
# TYPE sortie_link_queued gauge
sortie_link_queued{link="none"} 0
sortie_link_queued{link="zigbee"} 2
# HELP sortie_store_missions Stored.
# TYPE sortie_store_missions gauge
sortie_store_missions 4
`)
}

func TestRegisterRefusesDuplicateNames(t *testing.T) {
	r := NewRegistry()
	r.MustRegister(NewCounter("a_total", "A."))
	err := r.Register(NewCounter("b_total", "B."), NewGauge("a_total", "A again."))
	if !errors.Is(err, ErrDuplicate) {
		t.Fatalf("register a_total twice: %v, want ErrDuplicate", err)
	}
	if err := r.Register(NewCounter("b_total", "B.")); err != nil {
		t.Errorf("b_total, refused with a_total before: %v; a failed Register adds nothing", err)
	}
}

func TestInvalidDefinitionsPanic(t *testing.T) {
	for name, f := range map[string]func(){
		"metric name":           func() { NewCounter("1abc", "") },
		"metric name with dash": func() { NewCounter("a-b", "") },
		"label name":            func() { NewCounterVec("a", "", "b:c") },
		"reserved label name":   func() { NewCounterVec("a", "", "__b") },
		"label twice":           func() { NewCounterVec("a", "", "b", "b") },
		"le in a histogram":     func() { NewHistogramVec("a", "", nil, "le") },
		"buckets not sorted":    func() { NewHistogram("a", "", []float64{1, 0.5}) },
		"too few label values":  func() { NewCounterVec("a", "", "b", "c").With("x") },
		"too many label values": func() { NewCounterVec("a", "", "b").With("x", "y") },
		"negative counter add":  func() { NewCounter("a", "").Add(-1) },
		"emit a histogram": func() {
			d := NewDesc("h", "", TypeHistogram)
			r := NewRegistry()
			r.MustRegister(scrapeFunc{descs: []*Desc{d}, collect: func(s *Scrape) { s.Emit(d, 1) }})
			_, _ = r.WriteTo(io.Discard) // panics before writing
		},
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("no panic")
				}
			}()
			f()
		})
	}
}

// TestWithDoesNotAllocate: a step's observation on a series that exists
// allocates nothing, with one label or several.
func TestWithDoesNotAllocate(t *testing.T) {
	c1 := NewCounterVec("c1_total", "", "scene")
	c2 := NewCounterVec("c2_total", "", "class", "code")
	h := NewHistogramVec("h_seconds", "", []float64{.001, .01, .1, 1, 10}, "device_type", "action", "result")
	scene, class, code := "go_home", "retryable", "ack_timeout"
	dev, action, result := "light", "turn_on", "ok"
	c1.With(scene).Inc()
	c2.With(class, code).Inc()
	h.With(dev, action, result).Observe(1)
	for name, f := range map[string]func(){
		"one label":  func() { c1.With(scene).Inc() },
		"two labels": func() { c2.With(class, code).Inc() },
		"histogram":  func() { h.With(dev, action, result).Observe(0.003) },
	} {
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s: %v allocations, want 0", name, n)
		}
	}
}

// TestLabelValuesAreKeyedUnambiguously: lists of label values that would
// join to the same string are different series.
func TestLabelValuesAreKeyedUnambiguously(t *testing.T) {
	c := NewCounterVec("c_total", "", "a", "b")
	c.With("ab", "").Inc()
	c.With("a", "b").Inc()
	c.With("", "ab").Inc()
	c.With("\x01a", "b").Inc()
	if v := c.With("a", "b").Value(); v != 1 {
		t.Errorf("a,b counted %v, want 1", v)
	}
	r := NewRegistry()
	r.MustRegister(c)
	if n := strings.Count(text(t, r), "\nc_total{"); n != 4 {
		t.Errorf("%d series, want 4", n)
	}
}

// TestInvalidUTF8ValuesShareASeries: two label values that differ only
// in bytes that are not UTF-8 are written alike, so they count in one
// series rather than write two with the same labels.
func TestInvalidUTF8ValuesShareASeries(t *testing.T) {
	c := NewCounterVec("c_total", "", "v")
	c.With("x\xff").Inc()
	c.With("x\xfe").Inc()
	r := NewRegistry()
	r.MustRegister(c)
	wantText(t, r, "\n# HELP c_total \n# TYPE c_total counter\nc_total{v=\"x\uFFFD\"} 2\n")
}

func TestServeHTTP(t *testing.T) {
	r := NewRegistry()
	r.MustRegister(NewCounter("a_total", "A."))
	srv := httptest.NewServer(r)
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close() // read to the end
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/plain; version=0.0.4; charset=utf-8" {
		t.Errorf("Content-Type %q", ct)
	}
	if want := "# HELP a_total A.\n# TYPE a_total counter\na_total 0\n"; string(body) != want {
		t.Errorf("body %q, want %q", body, want)
	}
}

// TestGoAndProcessMetrics: the runtime's and the process's metrics under
// their usual names, with plausible values, each line parsing.
func TestGoAndProcessMetrics(t *testing.T) {
	r := NewRegistry()
	r.MustRegister(NewGoCollector(), NewProcessCollector())
	got := parseText(t, text(t, r))
	for _, name := range []string{
		"go_goroutines", "go_threads", `go_info{version="` + runtime.Version() + `"}`,
		"go_sched_gomaxprocs_threads", "go_gc_gogc_percent", "go_gc_gomemlimit_bytes",
		`go_gc_duration_seconds{quantile="0"}`, `go_gc_duration_seconds{quantile="0.25"}`, `go_gc_duration_seconds{quantile="1"}`,
		"go_gc_duration_seconds_sum", "go_gc_duration_seconds_count",
		"go_memstats_heap_alloc_bytes", "go_memstats_alloc_bytes_total", "go_memstats_sys_bytes", "go_memstats_last_gc_time_seconds",
		"process_cpu_seconds_total", "process_resident_memory_bytes", "process_virtual_memory_bytes",
		"process_virtual_memory_max_bytes", "process_open_fds", "process_max_fds", "process_start_time_seconds",
	} {
		v, ok := got[name]
		if !ok {
			t.Errorf("no %s", name)
			continue
		}
		if v < 0 || math.IsNaN(v) {
			t.Errorf("%s = %v", name, v)
		}
	}
	if v := got["go_goroutines"]; v < 1 {
		t.Errorf("go_goroutines %v", v)
	}
	if v := got["process_resident_memory_bytes"]; v < 1<<20 {
		t.Errorf("process_resident_memory_bytes %v, want at least 1 MiB", v)
	}
	if v := got["process_open_fds"]; v < 3 {
		t.Errorf("process_open_fds %v, want at least 3", v)
	}
	start := time.Unix(int64(got["process_start_time_seconds"]), 0)
	if age := time.Since(start); age < 0 || age > time.Hour {
		t.Errorf("process_start_time_seconds %v: the process started %v ago", start, age)
	}
}

// TestPromtoolChecksTheText runs promtool's linter, when it is installed,
// on every kind of family with odd label values.
func TestPromtoolChecksTheText(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (package prometheus)")
	}
	r := NewRegistry()
	c := NewCounterVec("odd_values_total", "Counts with \\ odd\nlabel values.", "v", "a")
	h := NewHistogramVec("odd_duration_seconds", "A histogram.", []float64{.1, 1}, "v")
	g := NewGaugeVec("odd_level", "A gauge.", "v")
	r.MustRegister(c, h, g, NewGoCollector(), NewProcessCollector())
	for _, v := range []string{"", "\\", "\"", "\n", "a\\\"\nb", "\xff", "é", "{x=\"1\"} 2"} {
		c.With(v, "x").Inc()
		h.With(v).Observe(0.5)
		g.With(v).Set(-1.5)
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(text(t, r))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}

// TestConcurrentUseAndScrapes runs series being made, counted and
// scraped at once, for the race detector; the counts add up.
func TestConcurrentUseAndScrapes(t *testing.T) {
	r := NewRegistry()
	c := NewCounterVec("c_total", "", "k")
	h := NewHistogramVec("h_seconds", "", []float64{1}, "k")
	r.MustRegister(c, h)
	var wg sync.WaitGroup
	const workers, each = 4, 500
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				k := strconv.Itoa((w + i) % 7)
				c.With(k).Inc()
				h.With(k).Observe(float64(i % 3))
				if i%100 == 0 {
					_ = text(t, r)
				}
			}
		})
	}
	wg.Wait()
	got := parseText(t, text(t, r))
	var total, count float64
	for k := range 7 {
		total += got[`c_total{k="`+strconv.Itoa(k)+`"}`]
		count += got[`h_seconds_count{k="`+strconv.Itoa(k)+`"}`]
	}
	if total != workers*each || count != workers*each {
		t.Errorf("counted %v, observed %v, want %d", total, count, workers*each)
	}
}

// parseText parses an exposition with parseLine, failing t on a line
// that does not parse, and returns the values by series (name{labels}
// as written).
func parseText(t testing.TB, s string) map[string]float64 {
	t.Helper()
	if !strings.HasSuffix(s, "\n") {
		t.Fatalf("exposition does not end with a newline: %q", s)
	}
	out := map[string]float64{}
	for line := range strings.Lines(s) {
		line = strings.TrimSuffix(line, "\n")
		if strings.HasPrefix(line, "# HELP ") || strings.HasPrefix(line, "# TYPE ") {
			continue
		}
		_, _, v, err := parseLine(line)
		if err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		out[line[:strings.LastIndexByte(line, ' ')]] = v
	}
	return out
}

// parseLine parses one sample line of the text format: a name, labels in
// braces with quoted, escaped values, a space and a value.
func parseLine(line string) (name string, labels [][2]string, v float64, err error) {
	i := 0
	for i < len(line) && (line[i] == '_' || line[i] == ':' || 'a' <= line[i] && line[i] <= 'z' || 'A' <= line[i] && line[i] <= 'Z' || i > 0 && '0' <= line[i] && line[i] <= '9') {
		i++
	}
	if i == 0 {
		return "", nil, 0, errors.New("no name")
	}
	name = line[:i]
	if i < len(line) && line[i] == '{' {
		i++
		for {
			j := i
			for j < len(line) && (line[j] == '_' || 'a' <= line[j] && line[j] <= 'z' || 'A' <= line[j] && line[j] <= 'Z' || j > i && '0' <= line[j] && line[j] <= '9') {
				j++
			}
			if j == i || !strings.HasPrefix(line[j:], `="`) {
				return "", nil, 0, errors.New("bad label name")
			}
			lname := line[i:j]
			i = j + 2
			var val bytes.Buffer
			for {
				if i >= len(line) {
					return "", nil, 0, errors.New("unterminated label value")
				}
				c := line[i]
				i++
				if c == '"' {
					break
				}
				if c == '\\' {
					if i >= len(line) {
						return "", nil, 0, errors.New("escape at the end")
					}
					switch line[i] {
					case '\\', '"':
						val.WriteByte(line[i])
					case 'n':
						val.WriteByte('\n')
					default:
						return "", nil, 0, errors.New("bad escape")
					}
					i++
					continue
				}
				val.WriteByte(c)
			}
			labels = append(labels, [2]string{lname, val.String()})
			if i < len(line) && line[i] == ',' {
				i++
				continue
			}
			if i < len(line) && line[i] == '}' {
				i++
				break
			}
			return "", nil, 0, errors.New("bad label separator")
		}
	}
	if i >= len(line) || line[i] != ' ' {
		return "", nil, 0, errors.New("no space before the value")
	}
	v, err = strconv.ParseFloat(line[i+1:], 64)
	return name, labels, v, err
}

// BenchmarkObserve is a step's observation: a histogram series found by
// three label values, from several goroutines.
func BenchmarkObserve(b *testing.B) {
	h := NewHistogramVec("h_seconds", "", []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}, "device_type", "action", "result")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			h.With("light", "turn_on", "ok").Observe(0.003)
		}
	})
}

// BenchmarkScrape writes a registry of the agent's size.
func BenchmarkScrape(b *testing.B) {
	r := NewRegistry()
	h := NewHistogramVec("h_seconds", "", []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}, "device_type", "action", "result")
	c := NewCounterVec("c_total", "", "reason")
	r.MustRegister(h, c, NewGoCollector(), NewProcessCollector())
	for i := range 20 {
		h.With("light", strconv.Itoa(i), "ok").Observe(0.003)
		c.With(strconv.Itoa(i)).Inc()
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.WriteTo(io.Discard); err != nil {
			b.Fatal(err)
		}
	}
}
