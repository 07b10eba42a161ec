package wire

import (
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"
)

// A device message is decoded on every step, on both sides of the wire,
// and encoding/json's reflection over its maps cost more than the rest of
// the device's work. quick reads the shape devices and the agent actually
// send: known keys, each once, spelled as documented, strings without
// escapes, objects nested at most maxQuickDepth deep. Anything else
// (escapes, unknown or repeated keys, a key in another case, null where a
// value is expected, wrong types, trailing bytes) makes it give up, and
// the message goes to encoding/json, whose answer, value or error, is then
// the answer. So quick never accepts what encoding/json refuses and never
// decodes differently (FuzzQuickMatchesJSON).
type quick struct {
	b   []byte
	i   int
	bad bool // gave up: use encoding/json
}

const maxQuickDepth = 32

func (q *quick) ws() {
	for q.i < len(q.b) {
		switch q.b[q.i] {
		case ' ', '\t', '\n', '\r':
			q.i++
		default:
			return
		}
	}
}

// next skips whitespace and consumes c, or gives up.
func (q *quick) next(c byte) bool {
	q.ws()
	if q.bad || q.i >= len(q.b) || q.b[q.i] != c {
		q.bad = true
		return false
	}
	q.i++
	return true
}

// peek skips whitespace and reports the next byte (0 at the end).
func (q *quick) peek() byte {
	q.ws()
	if q.i >= len(q.b) {
		return 0
	}
	return q.b[q.i]
}

// raw returns the bytes of a string without escapes, quotes excluded.
func (q *quick) raw() []byte {
	if !q.next('"') {
		return nil
	}
	start := q.i
	for q.i < len(q.b) {
		c := q.b[q.i]
		switch {
		case c == '"':
			s := q.b[start:q.i]
			q.i++
			if !utf8.Valid(s) { // encoding/json replaces bad bytes with U+FFFD
				q.bad = true
				return nil
			}
			return s
		case c == '\\' || c < ' ':
			q.bad = true
			return nil
		}
		q.i++
	}
	q.bad = true
	return nil
}

func (q *quick) str() string {
	s := q.raw()
	if q.bad {
		return ""
	}
	return string(s)
}

// number consumes a number in JSON's grammar and returns its text.
func (q *quick) number() string {
	q.ws()
	start := q.i
	if q.i < len(q.b) && q.b[q.i] == '-' {
		q.i++
	}
	digits := func() int {
		n := 0
		for q.i < len(q.b) && q.b[q.i] >= '0' && q.b[q.i] <= '9' {
			q.i++
			n++
		}
		return n
	}
	switch {
	case q.i < len(q.b) && q.b[q.i] == '0':
		q.i++
	case digits() == 0:
		q.bad = true
		return ""
	}
	if q.i < len(q.b) && q.b[q.i] == '.' {
		q.i++
		if digits() == 0 {
			q.bad = true
			return ""
		}
	}
	if q.i < len(q.b) && (q.b[q.i] == 'e' || q.b[q.i] == 'E') {
		q.i++
		if q.i < len(q.b) && (q.b[q.i] == '+' || q.b[q.i] == '-') {
			q.i++
		}
		if digits() == 0 {
			q.bad = true
			return ""
		}
	}
	return string(q.b[start:q.i])
}

// word consumes a literal (true, false, null).
func (q *quick) word(w string) bool {
	if q.i+len(w) > len(q.b) || string(q.b[q.i:q.i+len(w)]) != w {
		q.bad = true
		return false
	}
	q.i += len(w)
	return true
}

// value reads any JSON value as encoding/json decodes it into an any with
// UseNumber.
func (q *quick) value(depth int) any {
	if depth > maxQuickDepth {
		q.bad = true
		return nil
	}
	switch q.peek() {
	case '{':
		return q.object(depth + 1)
	case '[':
		q.i++
		out := []any{}
		if q.peek() == ']' {
			q.i++
			return out
		}
		for !q.bad {
			out = append(out, q.value(depth+1))
			if q.peek() == ',' {
				q.i++
				continue
			}
			q.next(']')
			break
		}
		return out
	case '"':
		return q.str()
	case 't':
		q.word("true")
		return true
	case 'f':
		q.word("false")
		return false
	case 'n':
		q.word("null")
		return nil
	default:
		return json.Number(q.number())
	}
}

// object reads an object of any values. A repeated key is left to
// encoding/json, which keeps the last.
func (q *quick) object(depth int) map[string]any {
	if !q.next('{') {
		return nil
	}
	m := map[string]any{}
	if q.peek() == '}' {
		q.i++
		return m
	}
	for !q.bad {
		k := q.str()
		q.next(':')
		if q.bad {
			return nil
		}
		if _, dup := m[k]; dup {
			q.bad = true
			return nil
		}
		m[k] = q.value(depth)
		if q.peek() == ',' {
			q.i++
			continue
		}
		q.next('}')
		break
	}
	return m
}

// members reads an object whose keys are among keys, each at most once,
// calling f with a key's index to read its value.
func (q *quick) members(keys []string, f func(key int)) bool {
	if !q.next('{') {
		return false
	}
	if q.peek() == '}' {
		q.i++
		return true
	}
	var seen uint64
	for !q.bad {
		k := q.raw()
		q.next(':')
		if q.bad {
			return false
		}
		i := 0
		for i < len(keys) && keys[i] != string(k) {
			i++
		}
		if i == len(keys) || seen&(1<<i) != 0 {
			q.bad = true
			return false
		}
		seen |= 1 << i
		f(i)
		if q.peek() == ',' {
			q.i++
			continue
		}
		q.next('}')
		break
	}
	return !q.bad
}

// end reports whether only whitespace is left and nothing gave up.
func (q *quick) end() bool {
	q.ws()
	return !q.bad && q.i == len(q.b)
}

// objectValue reads a non-null object member value.
func (q *quick) objectValue() map[string]any {
	if q.peek() != '{' {
		q.bad = true
		return nil
	}
	return q.object(1)
}

func (q *quick) boolean() bool {
	switch q.peek() {
	case 't':
		return q.word("true")
	case 'f':
		q.word("false")
		return false
	}
	q.bad = true
	return false
}

// int reads an integer without fraction or exponent, as encoding/json
// stores into an int.
func (q *quick) int() int {
	n, err := strconv.Atoi(q.number())
	if err != nil {
		q.bad = true
	}
	return n
}

// time reads what time.Time's UnmarshalJSON accepts.
func (q *quick) time() time.Time {
	q.ws()
	start := q.i
	q.raw()
	var t time.Time
	if q.bad || t.UnmarshalJSON(q.b[start:q.i]) != nil {
		q.bad = true
	}
	return t
}

var (
	commandKeys  = []string{"id", "action", "params", "attempt", "expires", "trace_id"}
	ackKeys      = []string{"id", "ok", "error", "state", "prior"}
	ackErrorKeys = []string{"code", "message"}
	stateKeys    = []string{"state", "ts"}
)

// quickCommand decodes b as DecodeCommand's encoding/json decoding would,
// or reports false.
func quickCommand(b []byte) (Command, bool) {
	var c Command
	if len(b) > MaxPayload {
		return c, false
	}
	q := quick{b: b}
	q.members(commandKeys, func(k int) {
		switch k {
		case 0:
			c.ID = q.str()
		case 1:
			c.Action = q.str()
		case 2:
			c.Params = q.objectValue()
		case 3:
			c.Attempt = q.int()
		case 4:
			c.Expires = q.time()
		case 5:
			c.TraceID = q.str()
		}
	})
	if !q.end() {
		return Command{}, false
	}
	return c, true
}

// quickAck is quickCommand for an ack.
func quickAck(b []byte) (Ack, bool) {
	var a Ack
	if len(b) > MaxPayload {
		return a, false
	}
	q := quick{b: b}
	q.members(ackKeys, func(k int) {
		switch k {
		case 0:
			a.ID = q.str()
		case 1:
			a.OK = q.boolean()
		case 2:
			e := &AckError{}
			q.members(ackErrorKeys, func(k int) {
				if k == 0 {
					e.Code = q.str()
				} else {
					e.Message = q.str()
				}
			})
			a.Error = e
		case 3:
			a.State = q.objectValue()
		case 4:
			a.Prior = q.objectValue()
		}
	})
	if !q.end() {
		return Ack{}, false
	}
	return a, true
}

// quickState is quickCommand for a state report.
func quickState(b []byte) (StateReport, bool) {
	var s StateReport
	if len(b) > MaxPayload {
		return s, false
	}
	q := quick{b: b}
	q.members(stateKeys, func(k int) {
		if k == 0 {
			s.State = q.objectValue()
		} else {
			s.Time = q.time()
		}
	})
	if !q.end() {
		return StateReport{}, false
	}
	return s, true
}
