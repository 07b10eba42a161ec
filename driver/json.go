package driver

import (
	"bytes"
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// AppendJSON appends m's JSON encoding to dst: the bytes json.Marshal
// would produce, without reflection. A store encodes the whole mission at
// every commit, where reflection over its maps, times and nested structs
// was the largest CPU cost of a step. TestAppendJSONMatchesMarshal keeps
// the two encodings identical for every field, including ones added
// later.
func (m *Mission) AppendJSON(dst []byte) ([]byte, error) {
	e := jsonEnc{b: dst}
	e.raw(`{"id":`)
	e.str(m.ID)
	e.raw(`,"type":`)
	e.str(m.Type)
	e.raw(`,"priority":`)
	e.int(int64(m.Priority))
	e.raw(`,"context":{"schema":`)
	e.int(int64(m.Context.Schema))
	if len(m.Context.Values) > 0 {
		e.raw(`,"values":`)
		e.values(m.Context.Values)
	}
	e.raw(`},"steps":`)
	if m.Steps == nil {
		e.raw("null")
	} else {
		e.b = append(e.b, '[')
		for i := range m.Steps {
			if i > 0 {
				e.b = append(e.b, ',')
			}
			e.step(&m.Steps[i])
		}
		e.b = append(e.b, ']')
	}
	e.raw(`,"state":`)
	e.str(string(m.State))
	p := &m.Progress
	e.raw(`,"progress":{"step":`)
	e.int(int64(p.Step))
	e.raw(`,"attempt":`)
	e.int(int64(p.Attempt))
	e.raw(`,"undo":`)
	e.int(int64(p.Undo))
	if p.Cause != "" {
		e.raw(`,"cause":`)
		e.str(string(p.Cause))
	}
	if p.Gen != 0 {
		e.raw(`,"gen":`)
		e.int(int64(p.Gen))
	}
	e.raw(`},"results":`)
	e.results(m.Results)
	if len(m.Undo) > 0 {
		e.raw(`,"undo":`)
		e.results(m.Undo)
	}
	e.optStr(`,"error":`, m.Error)
	e.optStr(`,"reason":`, m.Reason)
	e.raw(`,"meta":`)
	e.meta(&m.Meta)
	e.raw(`,"version":`)
	e.uint(m.Version)
	e.raw(`,"seq":`)
	e.uint(m.Seq)
	e.raw(`,"lease":{`)
	start := len(e.b)
	if m.Lease.Owner != "" {
		e.member(start, `"owner":`)
		e.str(m.Lease.Owner)
	}
	if !m.Lease.Expires.IsZero() {
		e.member(start, `"expires":`)
		e.time(m.Lease.Expires)
	}
	e.raw(`},"due":`)
	e.time(m.Due)
	e.raw(`,"control":{`)
	c := &m.Control
	start = len(e.b)
	field := func(key string) { e.member(start, key) }
	if c.Pause {
		field(`"pause":true`)
	}
	if c.Cancel {
		field(`"cancel":true`)
	}
	if c.CancelReason != "" {
		field(`"cancel_reason":`)
		e.str(c.CancelReason)
	}
	if c.Wait {
		field(`"wait":true`)
	}
	if c.WaitFor != "" {
		field(`"wait_for":`)
		e.str(c.WaitFor)
	}
	e.raw("}}")
	return e.b, e.err
}

// jsonEnc appends JSON; the first error sticks.
type jsonEnc struct {
	b   []byte
	err error
}

// AppendJSON appends ev's JSON encoding to dst: what json.Marshal would
// produce, without reflection, since a store encodes every event of every
// commit. TestEventAppendJSONMatchesMarshal keeps the two identical.
func (ev *Event) AppendJSON(dst []byte) ([]byte, error) {
	e := jsonEnc{b: dst}
	e.raw(`{"mission_id":`)
	e.str(ev.MissionID)
	e.raw(`,"seq":`)
	e.uint(ev.Seq)
	e.raw(`,"type":`)
	e.str(ev.Type)
	e.optStr(`,"trace_id":`, ev.TraceID)
	e.raw(`,"input":`)
	e.str(string(ev.Input))
	e.raw(`,"from":`)
	e.str(string(ev.From))
	e.raw(`,"to":`)
	e.str(string(ev.To))
	e.raw(`,"step":`)
	e.int(int64(ev.Step))
	e.optStr(`,"step_id":`, ev.StepID)
	e.optInt(`,"attempt":`, ev.Attempt)
	e.optStr(`,"error":`, ev.Error)
	e.optStr(`,"code":`, ev.Code)
	e.raw(`,"time":`)
	e.time(ev.Time)
	e.optStr(`,"detail":`, ev.Detail)
	e.optDur(`,"backoff":`, ev.Backoff)
	e.b = append(e.b, '}')
	return e.b, e.err
}

// AppendJSONValue appends v's JSON encoding to dst, the bytes json.Marshal
// would produce. Values of the shapes encoding/json decodes into (maps,
// slices, strings, numbers, bools, nil) are written without reflection;
// anything else goes through json.Marshal. Device commands and acks carry
// such values on every step, and the devices and simulator packages
// encode them with it.
func AppendJSONValue(dst []byte, v any) ([]byte, error) {
	e := jsonEnc{b: dst}
	e.any(v)
	return e.b, e.err
}

// AppendJSONString appends s quoted as json.Marshal quotes a string.
func AppendJSONString(dst []byte, s string) []byte { return appendJSONString(dst, s) }

// AppendJSONTime appends t as json.Marshal writes a time.Time.
func AppendJSONTime(dst []byte, t time.Time) ([]byte, error) {
	e := jsonEnc{b: dst}
	e.time(t)
	return e.b, e.err
}

func (e *jsonEnc) raw(s string)   { e.b = append(e.b, s...) }
func (e *jsonEnc) int(v int64)    { e.b = strconv.AppendInt(e.b, v, 10) }
func (e *jsonEnc) uint(v uint64)  { e.b = strconv.AppendUint(e.b, v, 10) }
func (e *jsonEnc) str(s string)   { e.b = appendJSONString(e.b, s) }
func (e *jsonEnc) bool(v bool)    { e.b = strconv.AppendBool(e.b, v) }
func (e *jsonEnc) fail(err error) { e.err = cmpOr(e.err, err) }

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// member writes an object member's key, after a comma unless it is the
// first since start, the offset just past the object's '{'.
func (e *jsonEnc) member(start int, key string) {
	if len(e.b) > start {
		e.b = append(e.b, ',')
	}
	e.raw(key)
}

func (e *jsonEnc) optStr(key, v string) {
	if v != "" {
		e.raw(key)
		e.str(v)
	}
}

func (e *jsonEnc) optInt(key string, v int) {
	if v != 0 {
		e.raw(key)
		e.int(int64(v))
	}
}

func (e *jsonEnc) optDur(key string, d Duration) {
	if d != 0 {
		e.raw(key)
		e.str(time.Duration(d).String())
	}
}

func (e *jsonEnc) optTime(key string, t time.Time) {
	if !t.IsZero() {
		e.raw(key)
		e.time(t)
	}
}

// time writes what time.Time.MarshalJSON does, falling back to it for
// the years and zone offsets it refuses.
func (e *jsonEnc) time(t time.Time) {
	_, off := t.Zone()
	if y := t.Year(); y < 0 || y > 9999 || off <= -24*3600 || off >= 24*3600 {
		e.marshal(t)
		return
	}
	e.b = append(e.b, '"')
	e.b = t.AppendFormat(e.b, time.RFC3339Nano)
	e.b = append(e.b, '"')
}

func (e *jsonEnc) marshal(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		e.fail(err)
		return
	}
	e.b = append(e.b, b...)
}

func (e *jsonEnc) step(s *Step) {
	e.raw(`{"id":`)
	e.str(s.ID)
	e.raw(`,"kind":`)
	e.str(s.Kind)
	e.optStr(`,"name":`, s.Name)
	if len(s.Params) > 0 {
		e.raw(`,"params":`)
		e.rawJSON(s.Params)
	}
	e.optDur(`,"timeout":`, s.Timeout)
	e.raw(`,"retry":`)
	e.retry(&s.Retry)
	if c := s.Compensate; c != nil {
		e.raw(`,"compensate":{"kind":`)
		e.str(c.Kind)
		if len(c.Params) > 0 {
			e.raw(`,"params":`)
			e.rawJSON(c.Params)
		}
		e.optDur(`,"timeout":`, c.Timeout)
		e.raw(`,"retry":`)
		e.retry(&c.Retry)
		e.b = append(e.b, '}')
	}
	if s.ContinueOnError {
		e.raw(`,"continue_on_error":true`)
	}
	e.b = append(e.b, '}')
}

func (e *jsonEnc) retry(p *RetryPolicy) {
	e.b = append(e.b, '{')
	start := len(e.b)
	key := func(k string) { e.member(start, k) }
	if p.MaxAttempts != 0 {
		key(`"max_attempts":`)
		e.int(int64(p.MaxAttempts))
	}
	if p.InitialBackoff != 0 {
		key(`"initial_backoff":`)
		e.str(p.InitialBackoff.String())
	}
	if p.Multiplier != 0 {
		key(`"multiplier":`)
		e.float(p.Multiplier)
	}
	if p.MaxBackoff != 0 {
		key(`"max_backoff":`)
		e.str(p.MaxBackoff.String())
	}
	if p.Jitter != 0 {
		key(`"jitter":`)
		e.float(p.Jitter)
	}
	if p.MaxElapsed != 0 {
		key(`"max_elapsed":`)
		e.str(p.MaxElapsed.String())
	}
	e.b = append(e.b, '}')
}

func (e *jsonEnc) results(rs []StepResult) {
	if rs == nil {
		e.raw("null")
		return
	}
	e.b = append(e.b, '[')
	for i := range rs {
		if i > 0 {
			e.b = append(e.b, ',')
		}
		r := &rs[i]
		e.raw(`{"status":`)
		e.str(string(r.Status))
		e.raw(`,"attempts":`)
		e.int(int64(r.Attempts))
		e.optInt(`,"waits":`, r.Waits)
		if len(r.Outputs) > 0 {
			e.raw(`,"outputs":`)
			e.values(r.Outputs)
		}
		e.optStr(`,"error":`, r.Error)
		e.optStr(`,"code":`, r.Code)
		e.optTime(`,"started":`, r.Started)
		e.optTime(`,"finished":`, r.Finished)
		e.optDur(`,"duration":`, r.Duration)
		e.optInt(`,"late_acks":`, r.LateAcks)
		e.b = append(e.b, '}')
	}
	e.b = append(e.b, ']')
}

func (e *jsonEnc) meta(md *Metadata) {
	e.raw(`{"created":`)
	e.time(md.Created)
	e.optTime(`,"started":`, md.Started)
	e.raw(`,"updated":`)
	e.time(md.Updated)
	e.optTime(`,"finished":`, md.Finished)
	e.raw(`,"trace_id":`)
	e.str(md.TraceID)
	e.optStr(`,"request_key":`, md.RequestKey)
	e.optStr(`,"source":`, md.Source)
	e.optTime(`,"deadline":`, md.Deadline)
	e.optDur(`,"budget":`, md.Budget)
	if len(md.Labels) > 0 {
		e.raw(`,"labels":{`)
		for i, k := range sortedKeys(md.Labels) {
			if i > 0 {
				e.b = append(e.b, ',')
			}
			e.str(k)
			e.b = append(e.b, ':')
			e.str(md.Labels[k])
		}
		e.b = append(e.b, '}')
	}
	e.b = append(e.b, '}')
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// values writes JSON-shaped data as decoded by encoding/json (with or
// without UseNumber); anything else goes through json.Marshal.
func (e *jsonEnc) values(m map[string]any) {
	// A device's state or a step's outputs have a handful of keys: sorted
	// in place on the stack, with their values, rather than in an
	// allocated slice and looked up again.
	type member struct {
		k string
		v any
	}
	var small [16]member
	ms := small[:0]
	for k, v := range m {
		ms = append(ms, member{k, v})
	}
	slices.SortFunc(ms, func(a, b member) int { return strings.Compare(a.k, b.k) })
	e.b = append(e.b, '{')
	for i, kv := range ms {
		if i > 0 {
			e.b = append(e.b, ',')
		}
		e.str(kv.k)
		e.b = append(e.b, ':')
		e.any(kv.v)
	}
	e.b = append(e.b, '}')
}

func (e *jsonEnc) any(v any) {
	switch t := v.(type) {
	case nil:
		e.raw("null")
	case string:
		e.str(t)
	case bool:
		e.bool(t)
	case float64:
		e.float(t)
	case int:
		e.int(int64(t))
	case int64:
		e.int(t)
	case json.Number:
		if t != "" && isJSONNumber(string(t)) {
			e.raw(string(t))
		} else {
			e.marshal(t) // "" and malformed numbers: json.Marshal's answer
		}
	case map[string]any:
		if t == nil {
			e.raw("null")
			return
		}
		e.values(t)
	case []any:
		if t == nil {
			e.raw("null")
			return
		}
		e.b = append(e.b, '[')
		for i, x := range t {
			if i > 0 {
				e.b = append(e.b, ',')
			}
			e.any(x)
		}
		e.b = append(e.b, ']')
	default:
		e.marshal(v)
	}
}

// float writes a float64 as encoding/json does where that is plain
// 'f' formatting; exponents and non-finite values go through json.Marshal.
func (e *jsonEnc) float(f float64) {
	if a := math.Abs(f); math.IsInf(f, 0) || math.IsNaN(f) || a != 0 && (a < 1e-6 || a >= 1e21) {
		e.marshal(f)
		return
	}
	e.b = strconv.AppendFloat(e.b, f, 'f', -1, 64)
}

// rawJSON writes a json.RawMessage as encoding/json does: validated,
// compacted, with <, > and & escaped.
func (e *jsonEnc) rawJSON(r json.RawMessage) {
	if !json.Valid(r) {
		e.marshal(r) // the error json.Marshal reports
		return
	}
	if plain(r) {
		e.b = append(e.b, r...)
		return
	}
	var c bytes.Buffer
	_ = json.Compact(&c, r)
	var h bytes.Buffer
	json.HTMLEscape(&h, c.Bytes())
	e.b = append(e.b, h.Bytes()...)
}

// plain says whether valid JSON is already compact and has nothing to
// escape: ASCII without whitespace or <, >, &.
func plain(r []byte) bool {
	for _, c := range r {
		if c >= utf8.RuneSelf || c <= ' ' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// isJSONNumber reports whether s is a number in JSON's grammar.
func isJSONNumber(s string) bool {
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	digits := func() int {
		n := 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
			n++
		}
		return n
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case digits() == 0:
		return false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	return i == len(s)
}

const hexDigits = "0123456789abcdef"

// jsonPlain marks the ASCII bytes a JSON string carries as they are:
// json.Marshal escapes control characters, quote, backslash and (for
// HTML safety) <, > and &.
var jsonPlain = func() (t [utf8.RuneSelf]bool) {
	for c := ' '; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return t
}()

// appendJSONString quotes s as encoding/json does by default: HTML-safe,
// invalid UTF-8 replaced by U+FFFD, U+2028 and U+2029 escaped.
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if jsonPlain[c] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
