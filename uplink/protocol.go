package uplink

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sortie-edge/sortie/driver"
)

// Protocol is the version of the hub protocol this package speaks:
//
//	1  cumulative acks; ack and control subscribed at QoS 1
//	2  batches chained by After; ack and control subscribed at QoS 0, the
//	   hub re-sends a control until its result, and the gateway answers a
//	   repeated control ID from memory instead of acting twice
const Protocol = 2

// DefaultPrefix is the root of the hub topics.
const DefaultPrefix = "sortie"

// MaxMessage bounds every hub message we decode.
const MaxMessage = 1 << 20

// Topics builds the hub topic names for gateway gw under a prefix:
//
//	{prefix}/hub/gateways/{gw}/status           gateway -> hub, retained, last will "offline"
//	{prefix}/hub/gateways/{gw}/heartbeat        gateway -> hub, periodic
//	{prefix}/hub/gateways/{gw}/events           gateway -> hub, QoS 1, batches of outbox entries
//	{prefix}/hub/gateways/{gw}/ack              hub -> gateway, QoS 1, outbox entries stored
//	{prefix}/hub/gateways/{gw}/control          hub -> gateway, QoS 1, control requests
//	{prefix}/hub/gateways/{gw}/control/result   gateway -> hub, QoS 1, control results
//	{prefix}/hub/gateways/{gw}/traces           gateway -> hub, QoS 1, trigger records, once the hub's acks carry "traces"
//	{prefix}/hub/gateways/{gw}/bundle/status    gateway -> hub, QoS 1, what became of a bundle the hub offered
type Topics struct{ Prefix string }

func (t Topics) base(gw string) string {
	p := t.Prefix
	if p == "" {
		p = DefaultPrefix
	}
	return p + "/hub/gateways/" + gw
}

// Status is the retained presence topic of a gateway.
func (t Topics) Status(gw string) string { return t.base(gw) + "/status" }

// Heartbeat carries periodic gateway health.
func (t Topics) Heartbeat(gw string) string { return t.base(gw) + "/heartbeat" }

// Events carries batches of mission events.
func (t Topics) Events(gw string) string { return t.base(gw) + "/events" }

// Ack carries the hub's acknowledgement of stored events.
func (t Topics) Ack(gw string) string { return t.base(gw) + "/ack" }

// Control carries control requests from the hub.
func (t Topics) Control(gw string) string { return t.base(gw) + "/control" }

// ControlResult carries the answers to control requests.
func (t Topics) ControlResult(gw string) string { return t.base(gw) + "/control/result" }

// Traces carries batches of trigger records (what the gateway's "agent
// why" answers from).
func (t Topics) Traces(gw string) string { return t.base(gw) + "/traces" }

// BundleStatus carries what became of the bundles the hub offered
// (BundleStatus messages).
func (t Topics) BundleStatus(gw string) string { return t.base(gw) + "/bundle/status" }

// Wildcard is the filter for one topic kind across gateways ("status",
// "heartbeat", "events", "control/result", "traces").
func (t Topics) Wildcard(kind string) string { return t.base("+") + "/" + kind }

// Status payloads.
const (
	StateOnline  = "online"
	StateOffline = "offline"
)

// Status is a gateway's presence, published retained; its last will is
// the same message with State "offline".
type Status struct {
	Gateway string `json:"gateway"`
	State   string `json:"state"`
	// Protocol is the gateway's version of this protocol (Protocol);
	// absent (0) from gateways before version 2, which take a control
	// request once, at QoS 1, and are not sent it again.
	Protocol int       `json:"protocol,omitempty"`
	Version  string    `json:"version,omitempty"`
	Started  time.Time `json:"started,omitzero"`
	Time     time.Time `json:"time,omitzero"`
	// Broker, optional, is the address the gateway connected to, as its
	// config gives it (without a password): which node of a cluster it
	// is on.
	Broker string `json:"broker,omitempty"`
}

// Heartbeat is a gateway's periodic health report.
type Heartbeat struct {
	Gateway string        `json:"gateway"`
	Version string        `json:"version"`
	Uptime  float64       `json:"uptime_seconds"`
	Backlog int           `json:"backlog"` // outbox entries not yet acknowledged
	Active  int           `json:"active_missions"`
	Devices []DeviceState `json:"devices"`
	// Scenes are the scenes the gateway runs, for the hub's scene
	// picker; older gateways send none.
	Scenes []SceneInfo `json:"scenes,omitempty"`
	Time   time.Time   `json:"time"`
	// Broker is Status.Broker again: a status is sent once per
	// connection, and a cluster's stream can lose one while it elects a
	// leader; heartbeats repeat.
	Broker string `json:"broker,omitempty"`
	// Config is the configuration the gateway runs; absent from
	// gateways before bundles. A hub compares its Hash with the bundle it
	// expects there: a hand edit shows as another hash.
	Config *ConfigState `json:"config,omitempty"`
}

// SceneInfo is a scene in a heartbeat: its name and the trigger
// parameters it reads, sorted by name.
type SceneInfo struct {
	Name        string       `json:"name"`
	Description string       `json:"description,omitempty"`
	Params      []SceneParam `json:"params,omitempty"`
}

// SceneParam is a trigger parameter of a scene. A parameter that is not
// Required has a Default, whose JSON type (number, string, boolean) is
// the one the scene expects.
type SceneParam struct {
	Name     string `json:"name"`
	Required bool   `json:"required,omitempty"`
	Default  any    `json:"default,omitempty"`
}

// DeviceState is one device in a heartbeat's inventory.
type DeviceState struct {
	ID     string         `json:"id"`
	Type   string         `json:"type"`
	Name   string         `json:"name,omitempty"`
	Room   string         `json:"room,omitempty"`
	Online bool           `json:"online"`
	State  map[string]any `json:"state,omitempty"`
}

// Entry is one outbox entry: a mission event and the mission's summary
// after it. Seq is the gateway's outbox sequence (global, increasing),
// distinct from Event.Seq (per mission, without gaps unless Compacted).
type Entry struct {
	Seq     uint64         `json:"seq"`
	Event   driver.Event   `json:"event"`
	Mission driver.Summary `json:"mission"`
	// Compacted is set when the outbox overflowed and earlier events of
	// this mission were dropped in favour of this latest one; the hub
	// then records the gap as expected rather than as a fault.
	Compacted bool `json:"compacted,omitempty"`
}

// Batch is what the gateway publishes on its events topic.
type Batch struct {
	Gateway string  `json:"gateway"`
	Entries []Entry `json:"entries"`
	// After is the outbox seq the batch continues from: the gateway read
	// its entries as those after it. The hub advances its cursor only
	// along this chain, so an ack never covers a batch it did not store
	// (one lost between two it did, or still on its way to another
	// replica). Nil from gateways before protocol 2, whose batches the
	// hub acks cumulatively.
	After *uint64 `json:"after,omitempty"`
	// Acked is the highest seq the gateway holds acknowledged (and has
	// deleted): a hub whose cursor is behind it (its store restored, or
	// a gateway moved to it) starts from there.
	Acked uint64 `json:"acked,omitempty"`
	// Outbox names the gateway's outbox (protocol 2, optional). A store
	// replaced or restored from a backup starts another outbox whose
	// seqs are not the old one's: the hub keeps its cursor per name and,
	// on a new one, starts the chain from Acked. Empty from gateways
	// that do not name theirs.
	Outbox string `json:"outbox,omitempty"`
}

// Ack tells a gateway that every outbox entry up to and including Upto
// is stored by the hub and may be deleted. Traces, when present, is the
// same for its trigger records; its presence also says that the hub
// takes them, so a gateway sends none to a hub whose acks lack it (an
// older hub, whose broker would refuse the topic). Both count the store
// named Outbox.
type Ack struct {
	Upto   uint64  `json:"upto"`
	Traces *uint64 `json:"traces,omitempty"`
	// Outbox is the outbox Upto and Traces count, as the gateway's
	// batches named it: "" for a gateway that names none. Hubs that name
	// outboxes always send it; nil (absent) from hubs before them. A
	// gateway that names its outbox takes an ack only when it is absent
	// or its own name (see docs/protocol.md, Acks).
	Outbox *string `json:"outbox,omitempty"`
}

// TraceRecord is one evaluation of a trigger on the gateway: what it
// decided (accepted, duplicate, rejected, or skipped for a schedule's
// firing) and why. Seq is the gateway's trace sequence (increasing,
// never reused); RequestID is what "why" is asked with.
type TraceRecord struct {
	Seq       uint64    `json:"seq"`
	RequestID string    `json:"request_id"`
	At        time.Time `json:"at"`
	Via       string    `json:"via,omitempty"`
	Scene     string    `json:"scene,omitempty"`
	Source    string    `json:"source,omitempty"`
	Outcome   string    `json:"outcome"`
	Reason    string    `json:"reason,omitempty"`
	Message   string    `json:"message,omitempty"`
	MissionID string    `json:"mission_id,omitempty"`
}

// Trace outcomes.
const (
	OutcomeAccepted  = "accepted"
	OutcomeDuplicate = "duplicate"
	OutcomeRejected  = "rejected"
	OutcomeSkipped   = "skipped"
)

// TraceBatch is what the gateway publishes on its traces topic.
type TraceBatch struct {
	Gateway string        `json:"gateway"`
	Traces  []TraceRecord `json:"traces"`
	// Outbox names the store the records come from, as Batch.Outbox
	// does: their seqs start again with a new store too.
	Outbox string `json:"outbox,omitempty"`
	// Upto, set by DecodeTraceBatch, is the highest seq of the batch,
	// records it dropped included: the hub acks it, so that a record it
	// cannot take does not hold up the ones after it.
	Upto uint64 `json:"-"`
	// Dropped counts the records DecodeTraceBatch left out.
	Dropped int `json:"-"`
}

// maxTraceText bounds each text field of a record the hub keeps.
const maxTraceText = 1024

// Control actions the hub may send.
const (
	ActionTrigger = "trigger"
	ActionPause   = "pause"
	ActionResume  = "resume"
	ActionCancel  = "cancel"
	ActionRetry   = "retry"
	// ActionBundle offers a configuration bundle (Control.Bundle); the
	// gateway answers at once, and reports what became of it on its
	// bundle status topic (docs/protocol.md, Bundles).
	ActionBundle = "bundle"
)

// Control is a request from the hub to a gateway.
type Control struct {
	ID        string         `json:"id"` // echoed in the result
	Action    string         `json:"action"`
	MissionID string         `json:"mission_id,omitempty"` // pause, resume, cancel, retry
	Scene     string         `json:"scene,omitempty"`      // trigger
	Params    map[string]any `json:"params,omitempty"`     // trigger
	RequestID string         `json:"request_id,omitempty"` // trigger; idempotency key
	Bundle    *BundleOffer   `json:"bundle,omitempty"`     // bundle
}

// ControlResult answers a Control.
type ControlResult struct {
	ID        string       `json:"id"`
	OK        bool         `json:"ok"`
	MissionID string       `json:"mission_id,omitempty"`
	State     driver.State `json:"state,omitempty"`
	Error     string       `json:"error,omitempty"`
	Code      string       `json:"code,omitempty"`
}

// ErrMessage is wrapped by every decoding error.
var ErrMessage = errors.New("invalid hub message")

// DefaultClientID is a gateway's MQTT client ID on the hub's broker
// unless it is configured otherwise. The hub's broker reserves these IDs
// for the gateways they name, so it is part of the contract.
func DefaultClientID(gateway string) string { return "sortie-gw-" + gateway }

func decode(b []byte, v any) error {
	if len(b) > MaxMessage {
		return fmt.Errorf("%w: %d bytes (max %d)", ErrMessage, len(b), MaxMessage)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %w", ErrMessage, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: trailing data", ErrMessage)
	}
	return nil
}

// DecodeBatch parses and checks an events batch.
func DecodeBatch(b []byte) (Batch, error) {
	var v Batch
	if err := decode(b, &v); err != nil {
		return Batch{}, err
	}
	if err := driver.ValidateID("gateway", v.Gateway); err != nil {
		return Batch{}, fmt.Errorf("%w: %w", ErrMessage, err)
	}
	if err := ValidateOutbox(v.Outbox); err != nil {
		return Batch{}, err
	}
	for i, e := range v.Entries {
		if e.Seq == 0 || e.Event.Seq == 0 {
			return Batch{}, fmt.Errorf("%w: entry %d has no sequence number", ErrMessage, i)
		}
		if err := driver.ValidateID("mission id", e.Event.MissionID); err != nil {
			return Batch{}, fmt.Errorf("%w: entry %d: %w", ErrMessage, i, err)
		}
		CheckStepTable(&v.Entries[i].Mission)
	}
	return v, nil
}

// maxStepText bounds each name and target of a step table the hub keeps
// (scenes cut names at 80 bytes; device IDs are shorter).
const maxStepText = 256

// CheckStepTable makes a summary's step table one a reader can index
// without checking (docs/protocol.md, "The step table"): a column whose
// length is not StepIDs' is dropped, not the entry with it (a table is a
// label, never a reason to refuse events), and a name or target longer
// than 256 bytes is cut.
func CheckStepTable(s *driver.Summary) {
	n := len(s.StepIDs)
	if len(s.StepNames) != n {
		s.StepNames = nil
	}
	if len(s.StepTargets) != n {
		s.StepTargets = nil
	}
	if len(s.StepStatus) != n {
		s.StepStatus = nil
	}
	for _, col := range [...][]string{s.StepNames, s.StepTargets} {
		for i, v := range col {
			if len(v) > maxStepText {
				col[i] = strings.ToValidUTF8(v[:maxStepText], "")
			}
		}
	}
}

// ValidateOutbox checks a batch's outbox name: empty, or an ID.
func ValidateOutbox(name string) error {
	if name == "" {
		return nil
	}
	if err := driver.ValidateID("outbox", name); err != nil {
		return fmt.Errorf("%w: %w", ErrMessage, err)
	}
	return nil
}

// DecodeTraceBatch parses and checks a batch of trigger records.
func DecodeTraceBatch(b []byte) (TraceBatch, error) {
	var v TraceBatch
	if err := decode(b, &v); err != nil {
		return TraceBatch{}, err
	}
	if err := driver.ValidateID("gateway", v.Gateway); err != nil {
		return TraceBatch{}, fmt.Errorf("%w: %w", ErrMessage, err)
	}
	if err := ValidateOutbox(v.Outbox); err != nil {
		return TraceBatch{}, err
	}
	kept := v.Traces[:0]
	for i, r := range v.Traces {
		if r.Seq == 0 {
			return TraceBatch{}, fmt.Errorf("%w: trace %d has no sequence number", ErrMessage, i)
		}
		v.Upto = max(v.Upto, r.Seq)
		// One record a hub cannot take (an outcome of a later version, an
		// ID it refuses) is dropped, not the batch with it.
		if driver.ValidateID("request id", r.RequestID) != nil {
			v.Dropped++
			continue
		}
		switch r.Outcome {
		case OutcomeAccepted, OutcomeDuplicate, OutcomeRejected, OutcomeSkipped:
		default:
			v.Dropped++
			continue
		}
		for _, f := range [...]*string{&r.Via, &r.Scene, &r.Source, &r.Reason, &r.Message, &r.MissionID} {
			if len(*f) > maxTraceText {
				*f = strings.ToValidUTF8((*f)[:maxTraceText], "")
			}
		}
		kept = append(kept, r)
	}
	v.Traces = kept
	return v, nil
}

// DecodeControl parses and checks a control request.
func DecodeControl(b []byte) (Control, error) {
	var c Control
	if err := decode(b, &c); err != nil {
		return Control{}, err
	}
	if err := driver.ValidateID("control id", c.ID); err != nil {
		return Control{}, fmt.Errorf("%w: %w", ErrMessage, err)
	}
	switch c.Action {
	case ActionTrigger:
		if err := driver.ValidateID("scene", c.Scene); err != nil {
			return Control{}, fmt.Errorf("%w: %w", ErrMessage, err)
		}
	case ActionPause, ActionResume, ActionCancel, ActionRetry:
		if err := driver.ValidateID("mission id", c.MissionID); err != nil {
			return Control{}, fmt.Errorf("%w: %w", ErrMessage, err)
		}
	case ActionBundle:
		if c.Bundle == nil {
			return Control{}, fmt.Errorf("%w: a bundle control without its bundle", ErrMessage)
		}
		if err := c.Bundle.check(); err != nil {
			return Control{}, err
		}
	default:
		return Control{}, fmt.Errorf("%w: unknown action %q", ErrMessage, c.Action)
	}
	return c, nil
}

// ControlID reads a control request's ID without judging the rest of
// it, so that a request that does not decode is still answered by its
// ID, and a repeat is known by it; "" when it has no valid one.
func ControlID(b []byte) string {
	var loose struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(b, &loose) != nil || driver.ValidateID("control id", loose.ID) != nil {
		return ""
	}
	return loose.ID
}

// DecodeAck parses an ack.
func DecodeAck(b []byte) (Ack, error) {
	var a Ack
	err := decode(b, &a)
	return a, err
}

// DecodeStatus, DecodeHeartbeat and DecodeControlResult parse the
// gateway's other messages for the hub.
func DecodeStatus(b []byte) (Status, error) {
	var s Status
	if err := decode(b, &s); err != nil {
		return Status{}, err
	}
	if s.State != StateOnline && s.State != StateOffline {
		return Status{}, fmt.Errorf("%w: status state %q", ErrMessage, s.State)
	}
	return s, nil
}

// DecodeHeartbeat parses a heartbeat.
func DecodeHeartbeat(b []byte) (Heartbeat, error) {
	var h Heartbeat
	err := decode(b, &h)
	return h, err
}

// DecodeControlResult parses a control result.
func DecodeControlResult(b []byte) (ControlResult, error) {
	var r ControlResult
	if err := decode(b, &r); err != nil {
		return ControlResult{}, err
	}
	if r.ID == "" {
		return ControlResult{}, fmt.Errorf("%w: control result has no id", ErrMessage)
	}
	return r, nil
}
