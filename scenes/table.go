package scenes

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// table reads one TOML table. It reports each problem as a FieldError at
// its own location and remembers the keys it read, so that done can
// report the rest as unknown. Reading TOML as maps rather than structs
// is what lets one bad value be reported without hiding the next one,
// and lets an unknown key name the scene and step it sits in (the keys
// MetaData.Undecoded returns carry no array index).
type table struct {
	p      *parser
	loc    FieldError // File, Scene, Step, StepName
	prefix string     // e.g. "retry." for the retry table of a step
	m      map[string]any
	seen   map[string]bool
}

func (p *parser) table(loc FieldError, prefix string, m map[string]any) *table {
	return &table{p: p, loc: loc, prefix: prefix, m: m, seen: make(map[string]bool, len(m))}
}

// fail records a problem with key; an empty key means the table itself.
func (t *table) fail(key, format string, args ...any) {
	fe := t.loc
	fe.Field = t.prefix + key
	if key == "" {
		fe.Field = strings.TrimSuffix(t.prefix, ".")
	}
	fe.Msg = fmt.Sprintf(format, args...)
	t.p.errs = append(t.p.errs, fe)
}

func (t *table) has(key string) bool {
	_, ok := t.m[key]
	return ok
}

func (t *table) get(key string) (any, bool) {
	t.seen[key] = true
	v, ok := t.m[key]
	return v, ok
}

// str returns a string key; ok is false when it is absent or invalid.
func (t *table) str(key string) (string, bool) {
	v, ok := t.get(key)
	if !ok {
		return "", false
	}
	s, ok := v.(string)
	if !ok {
		t.fail(key, "%s is not a string", describe(v))
	}
	return s, ok
}

// required is str that reports an absent key.
func (t *table) required(key string) (string, bool) {
	if !t.has(key) {
		t.get(key)
		t.fail(key, "missing")
		return "", false
	}
	return t.str(key)
}

func (t *table) boolean(key string) (bool, bool) {
	v, ok := t.get(key)
	if !ok {
		return false, false
	}
	b, ok := v.(bool)
	if !ok {
		t.fail(key, "%s is not a bool", describe(v))
	}
	return b, ok
}

func (t *table) integer(key string) (int64, bool) {
	v, ok := t.get(key)
	if !ok {
		return 0, false
	}
	i, ok := v.(int64)
	if !ok {
		t.fail(key, "%s is not an integer", describe(v))
	}
	return i, ok
}

func (t *table) number(key string) (float64, bool) {
	v, ok := t.get(key)
	if !ok {
		return 0, false
	}
	switch n := v.(type) {
	case int64:
		return float64(n), true
	case float64:
		return n, true
	}
	t.fail(key, "%s is not a number", describe(v))
	return 0, false
}

// duration reads Go duration text such as "500ms" or "2m". Explicit
// durations are positive: a zero would silently mean "the default".
func (t *table) duration(key string) (time.Duration, bool) {
	s, ok := t.str(key)
	if !ok {
		return 0, false
	}
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		t.fail(key, "%q is not a duration (want e.g. \"500ms\", \"30s\", \"2m\")", s)
	case d <= 0:
		t.fail(key, "%q must be positive", s)
	case d > MaxDuration:
		t.fail(key, "%q is longer than %s", s, MaxDuration)
	default:
		return d, true
	}
	return 0, false
}

// sub returns a nested table, or nil when it is absent or not a table.
func (t *table) sub(key string) *table {
	v, ok := t.get(key)
	if !ok {
		return nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		t.fail(key, "%s is not a table", describe(v))
		return nil
	}
	return t.p.table(t.loc, t.prefix+key+".", m)
}

// done reports the keys nobody read.
func (t *table) done() {
	for _, k := range slices.Sorted(maps.Keys(t.m)) {
		if !t.seen[k] {
			t.fail(k, "unknown key")
		}
	}
}

// describe renders a TOML or JSON value for an error message.
func describe(v any) string {
	switch t := v.(type) {
	case string:
		if len(t) > 32 {
			return fmt.Sprintf("%q...", t[:32])
		}
		return fmt.Sprintf("%q", t)
	case map[string]any:
		return "a table"
	case []any, []map[string]any:
		return "an array"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%v", v)
}
