package scenes

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sortie-edge/sortie/driver"
)

// Trigger limits. A trigger arrives over MQTT from outside the gateway,
// so everything in it is bounded before it is looked at.
const (
	MaxTriggerSize   = 16 << 10
	MaxTriggerParams = 32
	MaxParamString   = 1024
)

// Trigger asks for a run of a scene. It is what a voice assistant or an
// app publishes:
//
//	{"scene": "go_home", "request_id": "r-123", "source": "alexa",
//	 "params": {"temperature": 23}}
//
// RequestID makes the request idempotent: the agent uses it as the
// mission's request key, so a redelivered trigger starts nothing new.
type Trigger struct {
	Scene     string `json:"scene"`
	RequestID string `json:"request_id"`
	Source    string `json:"source,omitempty"`
	// Params are scalars only: string, bool, and numbers decoded as int64
	// when integral, else float64.
	Params map[string]any `json:"params,omitempty"`
	// NotAfter, when set (RFC 3339), is when the trigger goes stale: one
	// that reaches the agent later (it waited in a broker's session while
	// the agent was away, say) is rejected as deadline_passed rather than
	// run late. A request ID already accepted still gets its mission.
	NotAfter time.Time `json:"not_after,omitzero"`
}

// DecodeTrigger reads and validates a trigger payload. Unknown top-level
// fields are rejected: a misspelt "request_id" must not pass as a trigger
// without one. Errors are *TriggerError with reason bad_json, too_large,
// missing_field, invalid_field or invalid_param.
func DecodeTrigger(b []byte) (Trigger, error) {
	var t Trigger
	if len(b) > MaxTriggerSize {
		return t, triggerErr(ReasonTooLarge, "payload is %d bytes (max %d)", len(b), MaxTriggerSize)
	}
	// encoding/json keeps the last of two equal keys; a trigger whose
	// "scene" says one thing to a proxy that reads the first and another
	// to the agent is refused instead.
	if k, dup := duplicateKey(b); dup {
		return t, triggerErr(ReasonInvalidField, "key %.70q appears twice in one object", k)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		return Trigger{}, jsonError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Trigger{}, triggerErr(ReasonBadJSON, "data after the JSON object")
	}
	for _, f := range []struct{ name, v string }{{"scene", t.Scene}, {"request_id", t.RequestID}} {
		if f.v == "" {
			return Trigger{}, triggerErr(ReasonMissingField, "%s is missing or empty", f.name)
		}
		if err := driver.ValidateID(f.name, f.v); err != nil {
			return Trigger{}, triggerErr(ReasonInvalidField, "%s", idReason(err))
		}
	}
	if strings.HasPrefix(t.RequestID, FiringPrefix) {
		return Trigger{}, triggerErr(ReasonInvalidField, "request_id %q: the prefix %q is the schedules' own", t.RequestID, FiringPrefix)
	}
	if t.Source != "" {
		if err := driver.ValidateID("source", t.Source); err != nil {
			return Trigger{}, triggerErr(ReasonInvalidField, "%s", idReason(err))
		}
	}
	params, err := normalizeParams(t.Params)
	if err != nil {
		return Trigger{}, err
	}
	t.Params = params
	return t, nil
}

// duplicateKey finds a key given twice in one object of b. It reads b
// as a token stream, keeping the keys of each open object; b is bounded
// by MaxTriggerSize. Malformed JSON is left to the decoder to report.
func duplicateKey(b []byte) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	type frame struct {
		keys      map[string]bool // nil in an array
		expectKey bool
	}
	var stack []frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		top := len(stack) - 1
		if d, ok := tok.(json.Delim); ok {
			switch d {
			case '{':
				if top >= 0 && stack[top].keys != nil {
					stack[top].expectKey = true // this object was the value
				}
				stack = append(stack, frame{keys: map[string]bool{}, expectKey: true})
			case '[':
				if top >= 0 && stack[top].keys != nil {
					stack[top].expectKey = true
				}
				stack = append(stack, frame{})
			default:
				stack = stack[:top]
			}
			continue
		}
		if top < 0 || stack[top].keys == nil {
			continue
		}
		if stack[top].expectKey {
			k, _ := tok.(string)
			if stack[top].keys[k] {
				return k, true
			}
			stack[top].keys[k] = true
			stack[top].expectKey = false
			continue
		}
		stack[top].expectKey = true // a scalar value
	}
}

// jsonError maps a decoding error to a TriggerError.
func jsonError(err error) *TriggerError {
	var typeErr *json.UnmarshalTypeError
	var timeErr *time.ParseError
	switch {
	case errors.As(err, &timeErr):
		return triggerErr(ReasonInvalidField, "not_after: %q is not an RFC 3339 time (such as \"2026-12-02T07:05:00Z\")", timeErr.Value)
	case errors.As(err, &typeErr):
		if strings.HasPrefix(typeErr.Field, "params.") {
			return triggerErr(ReasonInvalidParam, "%s: a %s is not a string, number or bool", typeErr.Field, typeErr.Value)
		}
		if typeErr.Field == "" {
			return triggerErr(ReasonBadJSON, "a %s is not a JSON object", typeErr.Value)
		}
		return triggerErr(ReasonInvalidField, "%s: a %s is not a %s", typeErr.Field, typeErr.Value, jsonKind(typeErr.Type.Kind().String()))
	case strings.Contains(err.Error(), "Time.UnmarshalJSON"):
		return triggerErr(ReasonInvalidField, "not_after: not an RFC 3339 time string (such as \"2026-12-02T07:05:00Z\")")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return triggerErr(ReasonInvalidField, "unknown field %s", strings.TrimPrefix(err.Error(), "json: unknown field "))
	}
	return triggerErr(ReasonBadJSON, "%s", strings.TrimPrefix(err.Error(), "json: "))
}

func jsonKind(k string) string {
	if k == "map" {
		return "object"
	}
	return k
}

// normalizeParams validates trigger parameters and returns a copy with
// numbers as int64 (integral) or float64, the kinds the registry and the
// JSON round trip through the store agree on.
func normalizeParams(in map[string]any) (map[string]any, error) {
	if len(in) == 0 {
		return nil, nil
	}
	if len(in) > MaxTriggerParams {
		return nil, triggerErr(ReasonInvalidParam, "%d params (max %d)", len(in), MaxTriggerParams)
	}
	out := make(map[string]any, len(in))
	for _, k := range slices.Sorted(maps.Keys(in)) {
		if !validName(k) {
			return nil, triggerErr(ReasonInvalidParam, "param name %.70q: use letters, digits, '_' and '-', at most %d bytes", k, MaxParamName)
		}
		v, err := normalizeScalar(in[k])
		if err != nil {
			return nil, triggerErr(ReasonInvalidParam, "param %q: %v", k, err)
		}
		out[k] = v
	}
	return out, nil
}

func normalizeScalar(v any) (any, error) {
	switch n := v.(type) {
	case string:
		if len(n) > MaxParamString {
			return nil, fmt.Errorf("string is %d bytes long (max %d)", len(n), MaxParamString)
		}
		return n, nil
	case bool:
		return n, nil
	case json.Number:
		if i, err := strconv.ParseInt(string(n), 10, 64); err == nil {
			return i, nil
		}
		f, err := strconv.ParseFloat(string(n), 64)
		if err != nil {
			return nil, errors.New("is not a finite number") // the text is not quoted: it may be a secret's
		}
		return normalizeFloat(f)
	case int:
		return int64(n), nil
	case int32:
		return int64(n), nil
	case int64:
		return n, nil
	case float32:
		return normalizeFloat(float64(n))
	case float64:
		return normalizeFloat(n)
	}
	return nil, fmt.Errorf("%s is not a string, number or bool", describe(v))
}

// normalizeFloat keeps integral floats as int64, so 23 and 23.0 are the
// same parameter whichever way they were decoded.
func normalizeFloat(f float64) (any, error) {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return nil, errors.New("is not a finite number")
	}
	if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
		return int64(f), nil
	}
	return f, nil
}

// Reply statuses.
const (
	StatusAccepted = "accepted"
	StatusRejected = "rejected"
)

// Reply is the agent's answer to a trigger.
type Reply struct {
	RequestID string `json:"request_id"`
	// Status is StatusAccepted or StatusRejected.
	Status    string `json:"status"`
	MissionID string `json:"mission_id,omitempty"`
	Scene     string `json:"scene,omitempty"`
	// State is the mission's state when the reply was made.
	State driver.State `json:"state,omitempty"`
	// Duplicate is true when the request ID was seen before and the reply
	// describes the mission the first request started.
	Duplicate bool `json:"duplicate,omitempty"`
	// Reason is machine-readable (one of the Reason constants, or the
	// agent's own such as "busy"); Message is for people.
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// Rejection returns the reply rejecting a trigger because of err, taking
// the reason from a *TriggerError when there is one and fallback
// otherwise.
func Rejection(requestID, scene string, err error, fallback string) Reply {
	r := Reply{RequestID: requestID, Status: StatusRejected, Scene: scene, Reason: fallback, Message: err.Error()}
	var te *TriggerError
	if errors.As(err, &te) {
		r.Reason, r.Message = te.Reason, te.Msg
	}
	return r
}
