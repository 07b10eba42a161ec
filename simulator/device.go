package simulator

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/sortie-edge/sortie/devices/wire"
)

// DedupSize is how many command IDs a device remembers with their first
// ack. A repeat of a remembered ID is re-acked and not applied again; a
// repeat of an ID pushed out of the window would be applied again, as on
// a real device with bounded memory.
const DedupSize = 1024

// appliedSize bounds the per-command-ID effect counts kept for tests.
const appliedSize = 16 * DedupSize

// Counters are a device's running totals since the home started.
type Counters struct {
	Received    int // command payloads delivered to the device
	Applied     int // commands whose effect was applied
	Replayed    int // repeated command IDs answered with the first ack
	Rejected    int // commands answered with an error, or dropped as undecodable
	AcksSent    int // acks published, each duplicate counted
	AcksDropped int // acks withheld by the ack-loss fault
	Overflowed  int // commands lost or refused because their bridge was full
}

// Device is one virtual device with its own MQTT connection. Its methods
// are safe for concurrent use. A Device belongs to a Home and lives as
// long as it.
type Device struct {
	id     string
	typ    string
	m      *model
	travel time.Duration
	topics wire.Topics
	log    *slog.Logger
	// broker and clientID are where and as whom the device connects,
	// with username and password when set.
	broker             string
	clientID           string
	username, password string
	tls                *tls.Config

	// emitMu keeps a command's outputs and a curtain's arrival report
	// from interleaving: each decision is published whole, in order.
	emitMu sync.Mutex
	// settling hands a command's delayed outputs from the MQTT handler,
	// which must not wait, to the device's worker, which starts them.
	settling chan emitted
	// unsettled are publishes whose PUBACK had not come when last looked
	// at, and sweeping says a look is due (see watch).
	unsettledMu sync.Mutex
	unsettled   []sent
	sweeping    bool
	// wake tells the connection loop that the wish to be online or the
	// outage schedule changed.
	wake chan struct{}

	mu           sync.Mutex
	state        map[string]any
	faults       Faults
	dice         dice
	acks         fifoMap[[]byte]
	applied      fifoMap[int]
	history      []string // IDs of the last historySize commands applied, oldest first
	counters     Counters
	move         *move
	forcedOff    bool
	offlineUntil time.Time
	conn         *session // current connection, nil while offline
	sessions     int      // sessions opened, for unique client IDs
	onlineWait   chan struct{}
	// announced is set once conn's "online" is out (Online, onlineWait);
	// conn takes outputs from just before.
	announced  bool
	connectErr error // the last failed connection's, for WaitOnline
	// bridge is the bridge its commands come through, if any.
	bridge *bridge
}

// move is a curtain travelling from one position to another.
type move struct {
	from, to   int
	start, end time.Time
}

func (mv *move) at(now time.Time) int {
	if !now.Before(mv.end) {
		return mv.to
	}
	frac := float64(now.Sub(mv.start)) / float64(mv.end.Sub(mv.start))
	return mv.from + int(float64(mv.to-mv.from)*max(frac, 0))
}

// newDevice builds a device from a checked config; state is the checked
// initial state, applied over the type's defaults.
func newDevice(cfg DeviceConfig, state map[string]any, seed uint64, topics wire.Topics, broker, clientID string, log *slog.Logger) *Device {
	m := catalogue[cfg.Type]
	st := maps.Clone(m.initial)
	maps.Copy(st, state)
	return &Device{
		id:         cfg.ID,
		typ:        cfg.Type,
		m:          m,
		travel:     cfg.Travel,
		topics:     topics,
		broker:     broker,
		clientID:   clientID,
		log:        log.With("device", cfg.ID),
		settling:   make(chan emitted, 256),
		wake:       make(chan struct{}, 1),
		state:      st,
		faults:     cfg.Faults,
		dice:       newDice(seed, cfg.ID),
		acks:       newFIFOMap[[]byte](DedupSize),
		applied:    newFIFOMap[int](appliedSize),
		onlineWait: make(chan struct{}),
	}
}

// ID is the device's ID.
func (d *Device) ID() string { return d.id }

// Type is the device's type, e.g. "light".
func (d *Device) Type() string { return d.typ }

// State returns a copy of the device's current state.
func (d *Device) State() map[string]any {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.snapshot(time.Now())
}

// Counters returns the device's running totals.
func (d *Device) Counters() Counters {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.counters
}

// Applied returns how many times the effect of command id was applied:
// 1 for a command applied exactly once, more for a device that was made
// to forget it (beyond DedupSize), 0 for one never applied.
func (d *Device) Applied(id string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n, _ := d.applied.get(id)
	return n
}

// historySize bounds History; when full, its older half goes.
const historySize = 2048

// History returns the IDs of the commands the device applied, in the
// order it applied them: the last 1,024 to 2,048. Tests read it to
// check the order in which missions' commands took effect.
func (d *Device) History() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.history...)
}

// Faults returns the device's current faults.
func (d *Device) Faults() Faults {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.faults
}

// SetFaults replaces the device's faults from the next command on. It
// returns a *ConfigError if f is invalid for this device.
func (d *Device) SetFaults(f Faults) error {
	if err := f.Validate(d.typ); err != nil {
		var ce *ConfigError
		if errors.As(err, &ce) {
			ce.Device = d.id
		}
		return err
	}
	d.mu.Lock()
	d.faults = f
	d.mu.Unlock()
	d.poke()
	d.log.Info("faults set", "faults", f)
	return nil
}

func (d *Device) poke() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// snapshot copies the state; the curtain's position is where it is now.
func (d *Device) snapshot(now time.Time) map[string]any {
	st := maps.Clone(d.state)
	if d.move != nil {
		st["position"] = d.move.at(now)
	}
	return st
}

var discard = slog.New(slog.DiscardHandler)

// output is one message the device decided to publish.
type output struct {
	topic    string
	payload  []byte
	retained bool
	delay    time.Duration
	ack      bool
}

// handle is the device's firmware: it decides what to do with one
// command payload received at now, updates state and counters, and
// returns what to publish. It never blocks and never panics, whatever the
// payload.
func (d *Device) handle(payload []byte, now time.Time) []output {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.counters.Received++
	cmd, err := wire.DecodeCommand(payload)
	if err != nil {
		id := looseID(payload)
		if id == "" {
			d.counters.Rejected++
			d.log.Warn("command dropped: undecodable and no id to answer", "err", err, "bytes", len(payload))
			return nil
		}
		return d.reject(id, wire.CodeInvalidParam, err.Error(), true, now, d.log.With("cmd", id))
	}
	log := discard // With formats its attributes even when nothing is logged
	if d.log.Enabled(context.Background(), slog.LevelInfo) {
		log = d.log.With("cmd", cmd.ID, "action", cmd.Action, "attempt", cmd.Attempt)
	}
	log.Info("command received", "params", cmd.Params)
	// A bridge relays every frame, a repeat too: it holds each for the
	// radio round trip (the ack delay).
	if d.bridge != nil && !d.bridge.take(now, d.faults.AckDelay) {
		d.counters.Overflowed++
		if d.bridge.cfg.Overflow == OverflowBusy {
			return d.reject(cmd.ID, wire.CodeBusy, "bridge "+d.bridge.cfg.ID+" is full", false, now, log)
		}
		log.Info("command lost: bridge full", "bridge", d.bridge.cfg.ID)
		return nil
	}
	if first, ok := d.acks.get(cmd.ID); ok {
		d.counters.Replayed++
		log.Info("repeated command: re-acking first result, not applying again")
		return d.sendAck(first, log)
	}
	if !cmd.Expires.IsZero() && now.After(cmd.Expires) {
		return d.reject(cmd.ID, wire.CodeExpired,
			"received "+now.Sub(cmd.Expires).Round(time.Millisecond).String()+" after expiry", false, now, log)
	}
	if d.faults.Reject != "" {
		return d.reject(cmd.ID, d.faults.Reject, "rejected by fault injection", true, now, log)
	}
	if roll(d.dice.busy, d.faults.Busy) {
		return d.reject(cmd.ID, wire.CodeBusy, "device busy (fault injection)", false, now, log)
	}
	eff, perr := d.m.effect(cmd.Action, cmd.Params)
	if perr != nil {
		return d.reject(cmd.ID, perr.code, perr.msg, true, now, log)
	}
	if d.faults.Jammed {
		return d.reject(cmd.ID, wire.CodeJammed, "lock mechanism jammed", true, now, log)
	}
	if roll(d.dice.wrongState, d.faults.WrongState) {
		d.skew(eff, now)
		log.Info("wrong state (fault injection)", "effect", eff)
	}
	prior := d.snapshot(now)
	d.apply(eff, now)
	d.counters.Applied++
	if len(d.history) == historySize {
		d.history = append(d.history[:0], d.history[historySize/2:]...)
	}
	d.history = append(d.history, cmd.ID)
	n, _ := d.applied.get(cmd.ID)
	d.applied.put(cmd.ID, n+1)
	st := d.snapshot(now)
	ack := mustJSON(&wire.Ack{ID: cmd.ID, OK: true, State: st, Prior: prior})
	d.acks.put(cmd.ID, ack)
	log.Info("command applied", "state", st)
	// The ack first: it is what the command's sender waits for, and it
	// carries the state already; the retained report is for everyone.
	return append(d.sendAck(ack, log), d.stateOutput(now))
}

// skew changes the effect so the device ends up somewhere it was not
// asked to go: the first key the command sets, or, for a command that
// sets nothing, the first state key.
func (d *Device) skew(eff map[string]any, now time.Time) {
	keys := slices.Sorted(maps.Keys(eff))
	if len(keys) == 0 {
		k := slices.Sorted(maps.Keys(d.m.keys))[0]
		eff[k] = d.m.keys[k].skew(d.snapshot(now)[k])
		return
	}
	eff[keys[0]] = d.m.keys[keys[0]].skew(eff[keys[0]])
}

// apply changes state; a curtain with a travel time starts moving and
// reaches its position when finishTravel runs.
func (d *Device) apply(eff map[string]any, now time.Time) {
	to, ok := eff["position"].(int)
	if !d.m.travels || !ok {
		maps.Copy(d.state, eff)
		return
	}
	from := d.snapshot(now)["position"].(int)
	dist := max(to-from, from-to)
	if d.travel <= 0 || dist == 0 {
		d.move = nil
		d.state["position"], d.state["moving"] = to, false
		return
	}
	d.state["position"], d.state["moving"] = from, true
	d.move = &move{from: from, to: to, start: now, end: now.Add(d.travel * time.Duration(dist) / 100)}
}

// travelDue says when a moving curtain arrives.
func (d *Device) travelDue() (time.Time, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.move == nil {
		return time.Time{}, false
	}
	return d.move.end, true
}

// finishTravel stops a curtain that has arrived by now and returns its
// final state report.
func (d *Device) finishTravel(now time.Time) []output {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.move == nil || now.Before(d.move.end) {
		return nil
	}
	d.state["position"], d.state["moving"] = d.move.to, false
	d.move = nil
	d.log.Info("travel ended", "state", d.state)
	return []output{d.stateOutput(now)}
}

func (d *Device) reject(id, code, msg string, remember bool, now time.Time, log *slog.Logger) []output {
	d.counters.Rejected++
	ack := mustJSON(&wire.Ack{ID: id, Error: &wire.AckError{Code: code, Message: msg}, State: d.snapshot(now)})
	if remember {
		d.acks.put(id, ack)
	}
	log.Info("command rejected", "code", code, "msg", msg)
	return d.sendAck(ack, log)
}

// sendAck applies the ack faults. Every draw is made whatever the fault
// settings, so the sequences stay aligned when faults change at runtime.
func (d *Device) sendAck(ack []byte, log *slog.Logger) []output {
	drop := roll(d.dice.ackLoss, d.faults.AckLoss)
	jitter := time.Duration(d.dice.ackJitter.Float64() * float64(d.faults.AckJitter))
	dup := roll(d.dice.duplicate, d.faults.DuplicateAck)
	if drop {
		d.counters.AcksDropped++
		log.Info("ack dropped (fault injection)")
		return nil
	}
	out := output{topic: d.topics.Ack(d.id), payload: ack, delay: d.faults.AckDelay + jitter, ack: true}
	d.counters.AcksSent++
	if !dup {
		return []output{out}
	}
	d.counters.AcksSent++
	log.Info("ack duplicated (fault injection)")
	return []output{out, out}
}

func (d *Device) stateOutput(now time.Time) output {
	return output{
		topic:    d.topics.State(d.id),
		payload:  mustJSON(&wire.StateReport{State: d.snapshot(now), Time: now.UTC()}),
		retained: true,
	}
}

// looseID digs the command ID out of a payload DecodeCommand refused, so
// the device can say what was wrong instead of staying silent.
func looseID(b []byte) string {
	if len(b) > wire.MaxPayload {
		return ""
	}
	var v struct {
		ID any `json:"id"`
	}
	if err := json.NewDecoder(bytes.NewReader(b)).Decode(&v); err != nil {
		return ""
	}
	id, _ := v.ID.(string)
	return id
}

// mustJSON encodes a message built from decoded JSON and catalogue
// values, which always encode.
func mustJSON(m interface{ AppendJSON([]byte) ([]byte, error) }) []byte {
	b, err := m.AppendJSON(make([]byte, 0, 256))
	if err != nil {
		panic("simulator: encode: " + err.Error())
	}
	return b
}

// fifoMap is a map that forgets its oldest key beyond a capacity.
type fifoMap[V any] struct {
	m     map[string]V
	order []string
	next  int
	cap   int
}

func newFIFOMap[V any](capacity int) fifoMap[V] {
	return fifoMap[V]{m: make(map[string]V), cap: capacity}
}

func (f *fifoMap[V]) get(k string) (V, bool) {
	v, ok := f.m[k]
	return v, ok
}

func (f *fifoMap[V]) len() int { return len(f.m) }

func (f *fifoMap[V]) put(k string, v V) {
	if _, ok := f.m[k]; !ok {
		if len(f.order) < f.cap {
			f.order = append(f.order, k)
		} else {
			delete(f.m, f.order[f.next])
			f.order[f.next] = k
			f.next = (f.next + 1) % f.cap
		}
	}
	f.m[k] = v
}
