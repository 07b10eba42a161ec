package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
)

// DefaultPrefix is the topic prefix used when none is configured.
const DefaultPrefix = "sortie"

// MaxPayload bounds every device payload we decode; anything larger is
// rejected before parsing so a broken device cannot make us allocate
// without bound.
const MaxPayload = 64 << 10

// MaxDeviceIDLen bounds device IDs, which appear in topics.
const MaxDeviceIDLen = 64

// Availability payloads, published retained by the device and as its
// last will.
const (
	Online  = "online"
	Offline = "offline"
)

// Topics builds the per-device topic names under a prefix:
//
//	{prefix}/devices/{id}/cmd           commands to the device (QoS 1)
//	{prefix}/devices/{id}/ack           acks from the device (QoS 1)
//	{prefix}/devices/{id}/state         reported state (QoS 1, retained)
//	{prefix}/devices/{id}/availability  "online"/"offline" (QoS 1, retained, last will)
type Topics struct{ Prefix string }

func (t Topics) base(id string) string {
	p := t.Prefix
	if p == "" {
		p = DefaultPrefix
	}
	return p + "/devices/" + id
}

// Command is the topic a device subscribes to for commands.
func (t Topics) Command(id string) string { return t.base(id) + "/cmd" }

// Ack is the topic a device publishes acks on.
func (t Topics) Ack(id string) string { return t.base(id) + "/ack" }

// State is the retained topic a device reports its state on.
func (t Topics) State(id string) string { return t.base(id) + "/state" }

// Availability is the retained topic of a device's online status.
func (t Topics) Availability(id string) string { return t.base(id) + "/availability" }

// Wildcard returns the subscription filter for one kind of device topic
// ("ack", "state", "availability") across all devices.
func (t Topics) Wildcard(kind string) string { return t.base("+") + "/" + kind }

// DeviceOf returns the device ID and kind ("ack", "state", ...) of a
// device topic, or ok false if topic is not one.
func (t Topics) DeviceOf(topic string) (id, kind string, ok bool) {
	prefix := t.base("")
	rest, found := strings.CutPrefix(topic, prefix)
	if !found {
		return "", "", false
	}
	id, kind, found = strings.Cut(rest, "/")
	if !found || id == "" || strings.Contains(kind, "/") {
		return "", "", false
	}
	return id, kind, true
}

// Command is what the agent publishes to a device.
type Command struct {
	// ID identifies the command and is its idempotency key: every retry of
	// the same step carries the same ID, and a device applies an ID once.
	ID      string         `json:"id"`
	Action  string         `json:"action"`
	Params  map[string]any `json:"params,omitempty"`
	Attempt int            `json:"attempt"`
	// Expires is when the sender stops waiting; a device should drop a
	// command it receives after this time (answering "expired").
	Expires time.Time `json:"expires"`
	TraceID string    `json:"trace_id,omitempty"`
}

// Error codes a device can answer with. Retryable ones may succeed on a
// later attempt; the others fail the step at once.
const (
	CodeBusy          = "busy"           // retryable: try again later
	CodeExpired       = "expired"        // retryable: the command arrived after Expires
	CodeInternal      = "internal"       // retryable: transient device fault
	CodeUnreachable   = "unreachable"    // retryable: the device did not answer its bridge or network in time
	CodeInvalidParam  = "invalid_param"  // permanent: a param is missing, of the wrong type, or out of range
	CodeUnknownAction = "unknown_action" // permanent: the device has no such action
	CodeJammed        = "jammed"         // permanent: hardware fault (e.g. a jammed lock)
	CodeUnsupported   = "unsupported"    // permanent: the device cannot do this in its mode
)

// RetryableCode reports whether a device error code may succeed on retry.
// Unknown codes are treated as permanent: retrying what we do not
// understand risks repeating a harmful effect.
func RetryableCode(code string) bool {
	switch code {
	case CodeBusy, CodeExpired, CodeInternal, CodeUnreachable:
		return true
	}
	return false
}

// Ack is a device's answer to a command.
type Ack struct {
	ID    string    `json:"id"`
	OK    bool      `json:"ok"`
	Error *AckError `json:"error,omitempty"`
	// State is the device's state after the command, if it reports it.
	State map[string]any `json:"state,omitempty"`
	// Prior is the device's state just before it first applied the
	// command, if it reports it. A device re-acking a repeated ID sends
	// the first Prior again, which lets the agent restore the true
	// previous state even when the first ack was lost.
	Prior map[string]any `json:"prior,omitempty"`
}

// AckError says why a command was not applied.
type AckError struct {
	Code    string `json:"code"`
	Message string `json:"message,omitempty"`
}

// StateReport is the retained state a device publishes.
type StateReport struct {
	State map[string]any `json:"state"`
	Time  time.Time      `json:"ts,omitzero"`
}

// Sentinel errors of the device protocol.
var (
	// ErrInvalidID means a device ID is unsafe in a topic.
	ErrInvalidID = errors.New("invalid device id")
	// ErrPayload means a payload could not be decoded.
	ErrPayload = errors.New("invalid payload")
)

// ValidateDeviceID rejects IDs that are empty, too long, or contain MQTT
// wildcards, '/', spaces or control characters (topic injection).
func ValidateDeviceID(id string) error {
	if id == "" {
		return fmt.Errorf("%w: empty", ErrInvalidID)
	}
	if len(id) > MaxDeviceIDLen {
		return fmt.Errorf("%w: %d bytes long (max %d)", ErrInvalidID, len(id), MaxDeviceIDLen)
	}
	for _, r := range id {
		if r == '/' || r == '+' || r == '#' || unicode.IsSpace(r) || unicode.IsControl(r) || r == unicode.ReplacementChar {
			return fmt.Errorf("%w: %q contains %q", ErrInvalidID, id, r)
		}
	}
	return nil
}

func decodeStrict(b []byte, v any) error {
	if len(b) > MaxPayload {
		return fmt.Errorf("%w: %d bytes (max %d)", ErrPayload, len(b), MaxPayload)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %w", ErrPayload, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: trailing data after JSON value", ErrPayload)
	}
	return nil
}

// DecodeCommand parses a command payload. Numbers in Params are
// json.Number so devices can check integer-ness exactly.
func DecodeCommand(b []byte) (Command, error) {
	c, ok := quickCommand(b)
	if !ok {
		if err := decodeStrict(b, &c); err != nil {
			return Command{}, err
		}
	}
	if c.ID == "" {
		return Command{}, fmt.Errorf("%w: command has no id", ErrPayload)
	}
	if c.Action == "" {
		return Command{}, fmt.Errorf("%w: command has no action", ErrPayload)
	}
	return c, nil
}

// DecodeAck parses an ack payload.
func DecodeAck(b []byte) (Ack, error) {
	a, ok := quickAck(b)
	if !ok {
		if err := decodeStrict(b, &a); err != nil {
			return Ack{}, err
		}
	}
	if a.ID == "" {
		return Ack{}, fmt.Errorf("%w: ack has no id", ErrPayload)
	}
	if !a.OK && (a.Error == nil || a.Error.Code == "") {
		return Ack{}, fmt.Errorf("%w: negative ack has no error code", ErrPayload)
	}
	return a, nil
}

// DecodeState parses a retained state report.
func DecodeState(b []byte) (StateReport, error) {
	s, ok := quickState(b)
	if !ok {
		if err := decodeStrict(b, &s); err != nil {
			return StateReport{}, err
		}
	}
	if s.State == nil {
		return StateReport{}, fmt.Errorf("%w: state report has no state object", ErrPayload)
	}
	return s, nil
}

// DecodeAvailability parses an availability payload. Besides the plain
// words it accepts the JSON strings "online"/"offline", since some
// firmware quotes them.
func DecodeAvailability(b []byte) (online bool, err error) {
	s := strings.TrimSpace(string(b))
	s = strings.Trim(s, `"`)
	switch strings.ToLower(s) {
	case Online:
		return true, nil
	case Offline:
		return false, nil
	}
	if len(s) > 32 {
		s = s[:32] + "..."
	}
	return false, fmt.Errorf("%w: availability %q is neither %q nor %q", ErrPayload, s, Online, Offline)
}
