package metrics

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzLabelValues: whatever bytes label values hold, every series is one
// line that parses back to the values (bytes that are not UTF-8 read as
// U+FFFD), and series come sorted by their values.
func FuzzLabelValues(f *testing.F) {
	for _, seed := range [][2]string{
		{"", ""}, {"go_home", "light"}, {`a\b`, `"q"`}, {"line\nbreak", "\\n"},
		{"\xff\xfe", "\x00"}, {"} 1\nx{", `",b="`}, {"é☃", "\r\t"},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		r := NewRegistry()
		c := NewCounterVec("fuzz_total", "Fuzzed \\ help\n"+a, "z", "a")
		h := NewHistogramVec("fuzz_seconds", b, []float64{1}, "v")
		d := NewDesc("fuzz_emitted", a, TypeGauge, "v")
		r.MustRegister(c, h, scrapeFunc{descs: []*Desc{d}, collect: func(s *Scrape) {
			s.Emit(d, 1, a)
			s.Emit(d, 2, b)
		}})
		c.With(a, b).Inc()
		c.With(b, a).Inc()
		h.With(a).Observe(2)
		out := text(t, r)
		valid := func(s string) string { return strings.ToValidUTF8(s, string(utf8.RuneError)) }
		var emitted []string
		series := 0
		for line := range strings.Lines(out) {
			line = strings.TrimSuffix(line, "\n")
			if strings.HasPrefix(line, "# ") {
				if !strings.HasPrefix(line, "# HELP ") && !strings.HasPrefix(line, "# TYPE ") {
					t.Fatalf("comment line %q", line)
				}
				continue
			}
			name, labels, _, err := parseLine(line)
			if err != nil {
				t.Fatalf("line %q: %v\n%s", line, err, out)
			}
			series++
			for _, l := range labels {
				if l[0] != "le" && l[1] != valid(a) && l[1] != valid(b) {
					t.Errorf("line %q: label %s=%q is neither value", line, l[0], l[1])
				}
			}
			if name == "fuzz_emitted" {
				emitted = append(emitted, labels[0][1])
			}
		}
		for i := 1; i < len(emitted); i++ {
			if emitted[i-1] >= emitted[i] {
				t.Errorf("fuzz_emitted series not sorted or not unique: %q", emitted)
			}
		}
		// fuzz_total: 1 or 2 series; fuzz_seconds: 2 buckets, sum and
		// count; fuzz_emitted: 1 or 2 series.
		if min, max := 1+4+1, 2+4+2; series < min || series > max {
			t.Errorf("%d sample lines, want %d to %d:\n%s", series, min, max, out)
		}
	})
}
