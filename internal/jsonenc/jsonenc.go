package jsonenc

import (
	"bytes"
	"encoding/json"
	"math"
	"sort"
	"strconv"
	"time"
	"unicode/utf8"
)

// AppendValue appends v's JSON encoding to dst. Values of the shapes
// encoding/json decodes into (maps, slices, strings, numbers, bools,
// nil) are written without reflection; anything else goes through
// json.Marshal.
func AppendValue(dst []byte, v any) ([]byte, error) {
	e := Encoder{b: dst}
	e.Value(v)
	return e.Bytes()
}

// AppendString appends s quoted as json.Marshal quotes a string:
// HTML-safe, invalid UTF-8 replaced by U+FFFD, U+2028 and U+2029 escaped.
func AppendString(dst []byte, s string) []byte { return appendString(dst, s) }

// AppendTime appends t as json.Marshal writes a time.Time.
func AppendTime(dst []byte, t time.Time) ([]byte, error) {
	e := Encoder{b: dst}
	e.Time(t)
	return e.Bytes()
}

// Encoder appends JSON to a buffer. The first error sticks and the
// writes after it are wasted, so a caller checks once, in Bytes, rather
// than after every piece.
type Encoder struct {
	b   []byte
	err error
}

// New returns an Encoder that appends to dst.
func New(dst []byte) Encoder { return Encoder{b: dst} }

// Bytes returns the buffer and the first error met, if any.
func (e *Encoder) Bytes() ([]byte, error) { return e.b, e.err }

// Len is the length of the buffer so far, the start Member counts from.
func (e *Encoder) Len() int { return len(e.b) }

// Raw appends s as it is: punctuation, keys and literals the caller
// knows to be JSON already.
func (e *Encoder) Raw(s string) { e.b = append(e.b, s...) }

// Int appends v.
func (e *Encoder) Int(v int64) { e.b = strconv.AppendInt(e.b, v, 10) }

// Uint appends v.
func (e *Encoder) Uint(v uint64) { e.b = strconv.AppendUint(e.b, v, 10) }

// String appends s quoted, as AppendString does.
func (e *Encoder) String(s string) { e.b = appendString(e.b, s) }

// Bool appends v.
func (e *Encoder) Bool(v bool) { e.b = strconv.AppendBool(e.b, v) }

// Member appends an object member's key (given quoted, with its colon),
// after a comma unless it is the first since start, the offset (Len)
// just past the object's '{'. It is for objects whose members are all
// optional.
func (e *Encoder) Member(start int, key string) {
	if len(e.b) > start {
		e.b = append(e.b, ',')
	}
	e.Raw(key)
}

func (e *Encoder) fail(err error) {
	if e.err == nil {
		e.err = err
	}
}

// Time appends what time.Time.MarshalJSON does, and its error for the
// years and zone offsets it refuses.
func (e *Encoder) Time(t time.Time) {
	_, off := t.Zone()
	if y := t.Year(); y < 0 || y > 9999 || off <= -24*3600 || off >= 24*3600 {
		e.marshal(t)
		return
	}
	e.b = append(e.b, '"')
	e.b = t.AppendFormat(e.b, time.RFC3339Nano)
	e.b = append(e.b, '"')
}

func (e *Encoder) marshal(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		e.fail(err)
		return
	}
	e.b = append(e.b, b...)
}

// Object appends m with its keys sorted, as json.Marshal does; its
// values go through Value.
func (e *Encoder) Object(m map[string]any) {
	// A device's state or a step's outputs have a handful of keys: sorted
	// in place on the stack, with their values, rather than in an
	// allocated slice and looked up again.
	type member struct {
		k string
		v any
	}
	var small [16]member
	ms := small[:0]
	if len(m) > len(small) {
		// Many keys: sorted by sort.Slice in a slice of their own (ms
		// given to it would move small to the heap for every call).
		big := make([]member, 0, len(m))
		for k, v := range m {
			big = append(big, member{k, v})
		}
		sort.Slice(big, func(i, j int) bool { return big[i].k < big[j].k })
		ms = big
	} else {
		// A handful: an insertion sort, the fastest for so few, written
		// out because a generic sort made for member (slices.SortFunc)
		// is 6.6 KB of the agent's code, whose binary has a budget.
		for k, v := range m {
			ms = append(ms, member{k, v})
		}
		for i := 1; i < len(ms); i++ {
			for j := i; j > 0 && ms[j].k < ms[j-1].k; j-- {
				ms[j], ms[j-1] = ms[j-1], ms[j]
			}
		}
	}
	e.b = append(e.b, '{')
	for i, kv := range ms {
		if i > 0 {
			e.b = append(e.b, ',')
		}
		e.String(kv.k)
		e.b = append(e.b, ':')
		e.Value(kv.v)
	}
	e.b = append(e.b, '}')
}

// Value appends JSON-shaped data as decoded by encoding/json (with or
// without UseNumber), plus the int kinds Go code puts in such maps;
// anything else goes through json.Marshal.
func (e *Encoder) Value(v any) {
	switch t := v.(type) {
	case nil:
		e.Raw("null")
	case string:
		e.String(t)
	case bool:
		e.Bool(t)
	case float64:
		e.Float(t)
	case int:
		e.Int(int64(t))
	case int64:
		e.Int(t)
	case json.Number:
		if t != "" && isNumber(string(t)) {
			e.Raw(string(t))
		} else {
			e.marshal(t) // "" and malformed numbers: json.Marshal's answer
		}
	case map[string]any:
		if t == nil {
			e.Raw("null")
			return
		}
		e.Object(t)
	case []any:
		if t == nil {
			e.Raw("null")
			return
		}
		e.b = append(e.b, '[')
		for i, x := range t {
			if i > 0 {
				e.b = append(e.b, ',')
			}
			e.Value(x)
		}
		e.b = append(e.b, ']')
	default:
		e.marshal(v)
	}
}

// Float appends f as encoding/json does: plain 'f' formatting written
// here, exponents and non-finite values (an error) through json.Marshal.
func (e *Encoder) Float(f float64) {
	if a := math.Abs(f); math.IsInf(f, 0) || math.IsNaN(f) || a != 0 && (a < 1e-6 || a >= 1e21) {
		e.marshal(f)
		return
	}
	e.b = strconv.AppendFloat(e.b, f, 'f', -1, 64)
}

// RawMessage appends r as encoding/json does: validated, compacted, with
// <, > and & escaped.
func (e *Encoder) RawMessage(r json.RawMessage) {
	if !json.Valid(r) {
		e.marshal(r) // the error json.Marshal reports
		return
	}
	if plain(r) {
		e.b = append(e.b, r...)
		return
	}
	var c bytes.Buffer
	_ = json.Compact(&c, r) // cannot fail: r is valid
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

// isNumber reports whether s is a number in JSON's grammar.
func isNumber(s string) bool {
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

// stringPlain marks the ASCII bytes a JSON string carries as they are:
// json.Marshal escapes control characters, quote, backslash and (for
// HTML safety) <, > and &.
var stringPlain = func() (t [utf8.RuneSelf]bool) {
	for c := ' '; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return t
}()

func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if stringPlain[c] {
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
