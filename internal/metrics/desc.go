package metrics

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// Type is a metric family's type, as its # TYPE line names it.
type Type uint8

// The family types. Collectors emit counters and gauges; histograms and
// summaries come from Histogram and the Go collector.
const (
	TypeCounter Type = iota + 1
	TypeGauge
	TypeHistogram
	TypeSummary
)

// String returns the type's name in the exposition format.
func (t Type) String() string {
	switch t {
	case TypeCounter:
		return "counter"
	case TypeGauge:
		return "gauge"
	case TypeHistogram:
		return "histogram"
	case TypeSummary:
		return "summary"
	}
	return "untyped"
}

// Desc describes one metric family: its name, help text, type and label
// names. It is immutable once made, and identifies its family: a
// Registry takes one Desc per name.
type Desc struct {
	name, help string
	typ        Type
	// labels are the label names as declared: the order in which label
	// values are passed to With and Scrape.Emit.
	labels []string
	// order holds the indices of labels sorted by name: the order in
	// which labels are written and series sorted.
	order []int
}

// NewDesc describes a family. It panics if the name, a label name or the
// type is not valid, like regexp.MustCompile: descriptions are fixed in
// the code. Metric names match [a-zA-Z_:][a-zA-Z0-9_:]*, label names
// [a-zA-Z_][a-zA-Z0-9_]* without a leading "__"; a histogram may not
// declare le, nor a summary quantile.
func NewDesc(name, help string, typ Type, labels ...string) *Desc {
	if !validName(name, true) {
		panic(fmt.Sprintf("metrics: invalid metric name %q", name))
	}
	if typ < TypeCounter || typ > TypeSummary {
		panic(fmt.Sprintf("metrics: %s: invalid type %d", name, typ))
	}
	for i, l := range labels {
		switch {
		case !validName(l, false) || strings.HasPrefix(l, "__"):
			panic(fmt.Sprintf("metrics: %s: invalid label name %q", name, l))
		case slices.Contains(labels[:i], l):
			panic(fmt.Sprintf("metrics: %s: label %q declared twice", name, l))
		case typ == TypeHistogram && l == "le", typ == TypeSummary && l == "quantile":
			panic(fmt.Sprintf("metrics: %s: label %q is reserved for the %s's own", name, l, typ))
		}
	}
	d := &Desc{name: name, help: help, typ: typ, labels: slices.Clone(labels), order: make([]int, len(labels))}
	for i := range d.order {
		d.order[i] = i
	}
	slices.SortFunc(d.order, func(a, b int) int { return strings.Compare(labels[a], labels[b]) })
	return d
}

// Name returns the family's name.
func (d *Desc) Name() string { return d.name }

// validName reports whether s is a metric name (colons allowed) or a
// label name.
func validName(s string, metric bool) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' ||
			i > 0 && '0' <= c && c <= '9' || metric && c == ':'
		if !ok {
			return false
		}
	}
	return true
}

// series renders one series' labels from its label values, given in
// declared order: its sort key (the values in the order of the label
// names) and its label text (name="value" pairs sorted by name, escaped,
// without braces). It panics if the number of values is wrong, as
// indexing out of range would.
func (d *Desc) series(values []string) (key []string, text string) {
	d.check(values)
	if len(values) == 0 {
		return nil, ""
	}
	key = make([]string, len(values))
	var b []byte
	for i, j := range d.order {
		key[i] = strings.ToValidUTF8(values[j], string(utf8.RuneError))
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, d.labels[j]...)
		b = append(b, `="`...)
		b = appendEscaped(b, key[i], true)
		b = append(b, '"')
	}
	return key, string(b)
}

// check panics if values has not one value per label.
func (d *Desc) check(values []string) {
	if len(values) != len(d.labels) {
		panic(fmt.Sprintf("metrics: %s: %d label values for the labels %q", d.name, len(values), d.labels))
	}
}

// appendEscaped appends s with backslashes and newlines escaped, and
// double quotes too when quoted (a label value, as opposed to help
// text). s is valid UTF-8, in which these bytes only stand for
// themselves.
func appendEscaped(b []byte, s string, quoted bool) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			b = append(b, `\\`...)
		case c == '\n':
			b = append(b, `\n`...)
		case c == '"' && quoted:
			b = append(b, `\"`...)
		default:
			b = append(b, c)
		}
	}
	return b
}
