package simulator

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Device types of the catalogue. configs/devices.toml, shipped with the
// devices package, describes the same types, actions and state keys; the
// simulator carries its own copy because a real device validates with its
// own firmware, not with the agent's idea of it.
const (
	TypeLight   = "light"
	TypeAC      = "ac"
	TypeSpeaker = "speaker"
	TypeLock    = "lock"
	TypeCurtain = "curtain"
)

// Types lists the device types the simulator can play, sorted.
func Types() []string { return slices.Sorted(maps.Keys(catalogue)) }

type kind int

const (
	kindInt kind = iota + 1
	kindEnum
	kindString
	kindBool
)

// param is the domain of one param or state key.
type param struct {
	kind     kind
	min, max int      // kindInt
	enum     []string // kindEnum
	maxLen   int      // kindString; 0 means unbounded
	required bool
}

func intParam(lo, hi int) param    { return param{kind: kindInt, min: lo, max: hi} }
func enumParam(v ...string) param  { return param{kind: kindEnum, enum: v} }
func stringParam(maxLen int) param { return param{kind: kindString, maxLen: maxLen} }
func boolParam() param             { return param{kind: kindBool} }

func (p param) must() param { p.required = true; return p }

func (p param) String() string {
	switch p.kind {
	case kindInt:
		return fmt.Sprintf("integer %d..%d", p.min, p.max)
	case kindEnum:
		return "one of " + strings.Join(p.enum, ", ")
	case kindString:
		if p.maxLen > 0 {
			return fmt.Sprintf("string of at most %d bytes", p.maxLen)
		}
		return "string"
	case kindBool:
		return "boolean"
	}
	return "nothing"
}

// check converts a decoded JSON value (json.Number, string, bool, ...) to
// the Go value kept in state, or says why it does not fit.
func (p param) check(v any) (any, error) {
	switch p.kind {
	case kindInt:
		n, ok := v.(json.Number)
		if !ok {
			return nil, fmt.Errorf("want %s, got %s", p, describe(v))
		}
		i, err := exactInt(string(n), p.min, p.max)
		if err != nil {
			return nil, fmt.Errorf("want %s, got %s: %w", p, clip(string(n)), err)
		}
		return i, nil
	case kindEnum:
		s, ok := v.(string)
		if !ok || !slices.Contains(p.enum, s) {
			return nil, fmt.Errorf("want %s, got %s", p, describe(v))
		}
		return s, nil
	case kindString:
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("want %s, got %s", p, describe(v))
		}
		if p.maxLen > 0 && len(s) > p.maxLen {
			return nil, fmt.Errorf("want %s, got %d bytes", p, len(s))
		}
		return s, nil
	case kindBool:
		b, ok := v.(bool)
		if !ok {
			return nil, fmt.Errorf("want %s, got %s", p, describe(v))
		}
		return b, nil
	}
	return nil, fmt.Errorf("want %s", p)
}

// skew returns a valid value of the domain that differs from v, for the
// wrong-state fault.
func (p param) skew(v any) any {
	switch p.kind {
	case kindInt:
		i, _ := v.(int)
		span := max((p.max-p.min)/4, 1)
		if i-span >= p.min {
			return i - span
		}
		return min(i+span, p.max)
	case kindEnum:
		s, _ := v.(string)
		i := slices.Index(p.enum, s)
		return p.enum[(i+1)%len(p.enum)]
	case kindString:
		if s, _ := v.(string); s != "" {
			return ""
		}
		return "wrong"
	case kindBool:
		b, _ := v.(bool)
		return !b
	}
	return v
}

func describe(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case json.Number:
		return "number " + clip(string(v))
	case string:
		return "string " + strconv.Quote(clip(v))
	case bool:
		return "boolean " + strconv.FormatBool(v)
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}

func clip(s string) string {
	if len(s) > 24 {
		return s[:24] + "..."
	}
	return s
}

// exactInt parses a JSON number and accepts it only if its value is an
// integer in [lo, hi]. JSON has no integer type, so 25, 25.0 and 2.5e1 are
// the same integer while 25.5 is not one; the check is done on the digits,
// never through float64, so it is exact and cannot be fooled by rounding.
// lo and hi must lie within ±1e9.
func exactInt(s string, lo, hi int) (int, error) {
	if i, err := strconv.Atoi(s); err == nil {
		if i < lo || i > hi {
			return 0, fmt.Errorf("out of range")
		}
		return i, nil
	}
	neg := strings.HasPrefix(s, "-")
	mant, exp, hasExp := strings.Cut(strings.TrimPrefix(s, "-"), "e")
	if !hasExp {
		mant, exp, hasExp = strings.Cut(mant, "E")
	}
	if hasExp && exp == "" {
		return 0, fmt.Errorf("not a number")
	}
	whole, frac, _ := strings.Cut(mant, ".")
	digits := whole + frac
	if digits == "" || strings.Trim(digits, "0123456789") != "" {
		return 0, fmt.Errorf("not a number")
	}
	digits = strings.TrimLeft(digits, "0")
	if digits == "" {
		if lo > 0 || hi < 0 {
			return 0, fmt.Errorf("out of range")
		}
		return 0, nil
	}
	e := -len(frac)
	if exp != "" {
		x, err := strconv.Atoi(exp)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return 0, fmt.Errorf("not a number")
		}
		// Beyond ±2^20 every exponent acts the same on a mantissa of at
		// most MaxPayload digits; clamping keeps the arithmetic small.
		const clampExp = 1 << 20
		if err != nil || x > clampExp || x < -clampExp {
			x = clampExp
			if strings.HasPrefix(exp, "-") {
				x = -clampExp
			}
		}
		e += x
	}
	if e < 0 {
		if -e > len(digits) || strings.Trim(digits[len(digits)+e:], "0") != "" {
			return 0, fmt.Errorf("not an integer")
		}
		digits, e = digits[:len(digits)+e], 0
	}
	if len(digits)+e > 10 {
		return 0, fmt.Errorf("out of range")
	}
	i, err := strconv.Atoi(digits + strings.Repeat("0", e))
	if err != nil {
		return 0, fmt.Errorf("out of range")
	}
	if neg {
		i = -i
	}
	if i < lo || i > hi {
		return 0, fmt.Errorf("out of range")
	}
	return i, nil
}

// action is one command a device type understands: params it accepts and
// state keys it sets regardless of params. Every param names the state
// key it sets, which keeps the catalogue declarative.
type action struct {
	params map[string]param
	fixed  map[string]any
}

// model is a device type: its state domain, initial state and actions.
type model struct {
	// keys is the domain of every settable state key; the initial state
	// of a configured device is checked against it.
	keys    map[string]param
	initial map[string]any
	actions map[string]action
	// travels marks a type whose "position" moves over time.
	travels bool
}

const (
	powerOn  = "on"
	powerOff = "off"
)

var catalogue = map[string]*model{
	TypeLight: {
		keys: map[string]param{
			"power":      enumParam(powerOn, powerOff),
			"brightness": intParam(0, 100),
			"color_temp": intParam(2700, 6500),
		},
		initial: map[string]any{"power": powerOff, "brightness": 100, "color_temp": 4000},
		actions: map[string]action{
			"turn_on": {
				params: map[string]param{"brightness": intParam(1, 100), "color_temp": intParam(2700, 6500)},
				fixed:  map[string]any{"power": powerOn},
			},
			"turn_off": {fixed: map[string]any{"power": powerOff}},
			"set": {params: map[string]param{
				"power":      enumParam(powerOn, powerOff),
				"brightness": intParam(0, 100),
				"color_temp": intParam(2700, 6500),
			}},
		},
	},
	TypeAC: {
		keys: map[string]param{
			"power":  enumParam(powerOn, powerOff),
			"mode":   enumParam("cool", "heat", "dry", "fan", "auto"),
			"target": intParam(16, 30),
			"fan":    enumParam("auto", "low", "medium", "high"),
		},
		initial: map[string]any{"power": powerOff, "mode": "cool", "target": 24, "fan": "auto"},
		actions: map[string]action{
			"set": {params: map[string]param{
				"power":  enumParam(powerOn, powerOff),
				"mode":   enumParam("cool", "heat", "dry", "fan", "auto"),
				"target": intParam(16, 30),
				"fan":    enumParam("auto", "low", "medium", "high"),
			}},
			"turn_off": {fixed: map[string]any{"power": powerOff}},
		},
	},
	TypeSpeaker: {
		keys: map[string]param{
			"status":   enumParam("playing", "paused"),
			"volume":   intParam(0, 100),
			"playlist": stringParam(64),
		},
		initial: map[string]any{"status": "paused", "volume": 30, "playlist": ""},
		actions: map[string]action{
			"play": {
				params: map[string]param{"playlist": stringParam(64), "volume": intParam(0, 100)},
				fixed:  map[string]any{"status": "playing"},
			},
			"pause": {fixed: map[string]any{"status": "paused"}},
			"set": {params: map[string]param{
				"status":   enumParam("playing", "paused"),
				"volume":   intParam(0, 100),
				"playlist": stringParam(64),
			}},
		},
	},
	TypeLock: {
		keys:    map[string]param{"locked": boolParam()},
		initial: map[string]any{"locked": true},
		actions: map[string]action{
			"lock":   {fixed: map[string]any{"locked": true}},
			"unlock": {fixed: map[string]any{"locked": false}},
			"set":    {params: map[string]param{"locked": boolParam()}},
		},
	},
	TypeCurtain: {
		keys:    map[string]param{"position": intParam(0, 100)},
		initial: map[string]any{"position": 0, "moving": false},
		actions: map[string]action{
			"open":         {fixed: map[string]any{"position": 100}},
			"close":        {fixed: map[string]any{"position": 0}},
			"set_position": {params: map[string]param{"position": intParam(0, 100).must()}},
			"set":          {params: map[string]param{"position": intParam(0, 100)}},
		},
		travels: true,
	},
}

// paramError is a rejection with a protocol code.
type paramError struct {
	code string
	msg  string
}

func (e *paramError) Error() string { return e.code + ": " + e.msg }

// effect validates a command against the model and returns the state keys
// it sets. It never looks at the current state: validation is the same
// whatever the device is doing.
func (m *model) effect(act string, params map[string]any) (map[string]any, *paramError) {
	a, ok := m.actions[act]
	if !ok {
		return nil, &paramError{"unknown_action", fmt.Sprintf("no action %q (have %s)",
			clip(act), strings.Join(slices.Sorted(maps.Keys(m.actions)), ", "))}
	}
	// Sorted so that, with several bad params, the device always names
	// the same one.
	for _, k := range slices.Sorted(maps.Keys(params)) {
		if _, ok := a.params[k]; !ok {
			return nil, &paramError{"invalid_param", fmt.Sprintf("%s: unknown param for %s", clip(k), act)}
		}
	}
	out := maps.Clone(a.fixed)
	if out == nil {
		out = map[string]any{}
	}
	for _, k := range slices.Sorted(maps.Keys(a.params)) {
		v, ok := params[k]
		if !ok {
			if a.params[k].required {
				return nil, &paramError{"invalid_param", fmt.Sprintf("%s: required by %s", k, act)}
			}
			continue
		}
		got, err := a.params[k].check(v)
		if err != nil {
			return nil, &paramError{"invalid_param", fmt.Sprintf("%s: %v", k, err)}
		}
		out[k] = got
	}
	return out, nil
}

// checkState validates a configured initial state, which arrives in the
// same JSON shape as command params.
func (m *model) checkState(st map[string]any) (map[string]any, error) {
	out := make(map[string]any, len(st))
	for _, k := range slices.Sorted(maps.Keys(st)) {
		p, ok := m.keys[k]
		if !ok {
			return nil, fmt.Errorf("%s: not a settable state key (have %s)", k,
				strings.Join(slices.Sorted(maps.Keys(m.keys)), ", "))
		}
		v, err := p.check(st[k])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
		out[k] = v
	}
	return out, nil
}
