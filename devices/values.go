package devices

import (
	"encoding/json"
	"math"
	"strconv"

	"github.com/sortie-edge/sortie/devices/adapter"
)

// normalize turns the json.Number values that the strict decoders produce
// into int64 (when integral) or float64, recursively, so cached state can
// be compared and re-encoded without callers knowing how it was decoded.
func normalize(v any) any {
	switch t := v.(type) {
	case json.Number:
		if i, err := strconv.ParseInt(string(t), 10, 64); err == nil {
			return i
		}
		if f, err := strconv.ParseFloat(string(t), 64); err == nil {
			return f
		}
		return string(t)
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, x := range t {
			out[k] = normalize(x)
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i, x := range t {
			out[i] = normalize(x)
		}
		return out
	}
	return v
}

// normalizeOwned is normalize done in place, for freshly decoded maps
// that nothing else holds: it replaces json.Number values, at any depth,
// without copying the maps and slices around them.
func normalizeOwned(m map[string]any) {
	for k, v := range m {
		if n, changed := normalizeValueOwned(v); changed {
			m[k] = n
		}
	}
}

func normalizeValueOwned(v any) (any, bool) {
	switch t := v.(type) {
	case json.Number:
		return normalize(t), true
	case map[string]any:
		normalizeOwned(t)
	case []any:
		for i, x := range t {
			if n, changed := normalizeValueOwned(x); changed {
				t[i] = n
			}
		}
	}
	return v, false
}

func normalizeMap(m map[string]any) map[string]any {
	if m == nil {
		return nil
	}
	return normalize(m).(map[string]any)
}

// cloneMap copies a normalized state map. Values are scalars or nested
// JSON shapes; nested ones are copied through normalize, which rebuilds
// them.
func cloneMap(m map[string]any) map[string]any {
	return normalizeMap(m)
}

// asFloat returns the numeric value of any JSON-ish number: the int and
// float kinds Go code passes, json.Number from our decoders, and float64
// from encoding/json round trips through the store.
func asFloat(v any) (float64, bool) {
	switch n := v.(type) {
	case int:
		return float64(n), true
	case int32:
		return float64(n), true
	case int64:
		return float64(n), true
	case uint:
		return float64(n), true
	case uint32:
		return float64(n), true
	case uint64:
		return float64(n), true
	case float32:
		return float64(n), true
	case float64:
		return n, true
	case json.Number:
		f, err := n.Float64()
		return f, err == nil
	}
	return 0, false
}

func isIntegral(f float64) bool {
	return !math.IsInf(f, 0) && !math.IsNaN(f) && f == math.Trunc(f)
}

// sameValue compares two state values the way a person would: 40, 40.0
// and json.Number("40") are equal; other kinds compare with ==.
func sameValue(a, b any) bool {
	fa, okA := asFloat(a)
	fb, okB := asFloat(b)
	if okA || okB {
		return okA && okB && fa == fb
	}
	switch a.(type) {
	case string, bool, nil:
		return a == b
	}
	return false
}

// matches reports whether every key of want has the same value in got.
func matches(got, want map[string]any) bool {
	for k, w := range want {
		g, ok := got[k]
		if !ok || !sameValue(g, w) {
			return false
		}
	}
	return true
}

// matchesWithin is matches with the rounding an ecosystem's units
// bring (adapter.Tolerance): a light asked for 2700 K reports 370
// mireds, which is 2703 K.
func matchesWithin(got, want map[string]any) bool {
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			return false
		}
		if sameValue(g, w) {
			continue
		}
		fg, okG := asFloat(g)
		fw, okW := asFloat(w)
		if !okG || !okW || math.Abs(fg-fw) > adapter.Tolerance(k, fw) {
			return false
		}
	}
	// A cover still travelling has not arrived, whatever it says now.
	if moving, _ := got["moving"].(bool); moving {
		if _, asked := want["moving"]; !asked {
			return false
		}
	}
	return true
}
