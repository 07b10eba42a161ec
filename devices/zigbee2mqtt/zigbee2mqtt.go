// Package zigbee2mqtt speaks Zigbee2MQTT's MQTT API (1.x and 2.x) for
// the devices of a Sortie registry that name protocol "zigbee2mqtt".
//
// What counts as success: Zigbee2MQTT sends no reply to a command. It
// publishes the device's state on <base>/<friendly name> once the Zigbee
// command resolved (its "optimistic" publish, on by default), and the
// step succeeds when a message published after the command, not one the
// broker replayed as retained, shows every commanded value.
//
// What counts as failure: an error on <base>/bridge/logging (2.x; 1.x
// from 1.35) reading "Publish 'set' '<key>' to '<name>' failed: …", or
// 1.x's legacy {"type":"zigbee_publish_error"} on <base>/bridge/log.
// A timeout, a "MAC no ack", a missing route is the code "unreachable"
// (retried); an unknown entity, a missing converter or an unsupported
// device is "unsupported" (the step fails at once). Zigbee2MQTT does not
// repeat a log message identical to the one before, so a second failure
// in a row may only show as a timeout, which is retried too.
//
// How offline is seen: <base>/bridge/state (the bridge's will,
// retained) takes every device of the bridge offline; <base>/<name>/
// availability (retained) takes one device, when availability is enabled
// in Zigbee2MQTT (it is off by default: then a device that does not
// answer shows only as failed and timed-out commands). Both payload
// forms are read: 1.x's plain "online"/"offline" and 2.x's
// {"state":"online"}.
//
// A command is one JSON publish on <base>/<name>/set, never retained,
// always absolute ("ON", never "TOGGLE"); the read before a retry is
// <base>/<name>/get, whose answer is an ordinary state publish.
package zigbee2mqtt

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/sortie-edge/sortie/devices/adapter"
)

// Name is the registry's protocol name for this package.
const Name = "zigbee2mqtt"

// DefaultBase is Zigbee2MQTT's default base topic (mqtt.base_topic).
const DefaultBase = "zigbee2mqtt"

// Keys are the keys of the common vocabulary this package translates.
var Keys = []string{"power", "brightness", "color_temp", "locked", "position", "mode", "target"}

// MaxPayload bounds what Decode reads: a state or log message of one
// device is a few hundred bytes; bridge/devices, which is larger, is not
// subscribed.
const MaxPayload = 64 << 10

// Settings are a registry's [protocols.zigbee2mqtt] table.
type Settings struct {
	// Base is Zigbee2MQTT's mqtt.base_topic; "" means DefaultBase.
	Base string
}

// ParseSettings reads the registry's table; unknown keys are errors.
func ParseSettings(m map[string]any) (Settings, error) {
	var s Settings
	for k, v := range m {
		switch k {
		case "base_topic":
			b, ok := v.(string)
			if !ok {
				return s, fmt.Errorf("base_topic: %v is not a string", v)
			}
			s.Base = b
		default:
			return s, fmt.Errorf("unknown key %s (zigbee2mqtt takes base_topic)", k)
		}
	}
	if s.Base == "" {
		s.Base = DefaultBase
	}
	if err := checkTopic(s.Base); err != nil {
		return s, fmt.Errorf("base_topic: %w", err)
	}
	return s, nil
}

// checkTopic refuses what cannot be a topic level, or levels, of ours.
func checkTopic(t string) error {
	switch {
	case t == "":
		return errors.New("empty")
	case len(t) > 256:
		return errors.New("longer than 256 bytes")
	case strings.ContainsAny(t, "+#\x00"):
		return fmt.Errorf("%q holds an MQTT wildcard or NUL", t)
	case strings.HasPrefix(t, "/") || strings.HasSuffix(t, "/") || strings.Contains(t, "//"):
		return fmt.Errorf("%q has an empty topic level", t)
	}
	return nil
}

// Protocol is the adapter for one bridge's devices. Decode is not safe
// for concurrent use (package devices calls it in order); the rest is.
type Protocol struct {
	s Settings
	// sent holds the Zigbee2MQTT keys of each device's last command: a
	// bridge error about another key (someone else's command) is not
	// Sortie's command's failure.
	sent   map[string][]string
	byName map[string]*device // friendly name → device
	byID   map[string]*device
	order  []*device // registry order, for bridge-wide reports
	bridge adapter.Availability
}

type device struct {
	id, name string
	keys     []string
	lock     bool // its "state" is a lock's, not a switch's
	avail    adapter.Availability
}

// New makes the adapter for devs, which must each name their friendly
// name as Address and set only keys this package translates.
func New(s Settings, devs []adapter.Device) (*Protocol, error) {
	p := &Protocol{s: s, byName: make(map[string]*device), byID: make(map[string]*device), sent: make(map[string][]string)}
	for _, d := range devs {
		if err := checkTopic(d.Address); err != nil {
			return nil, fmt.Errorf("device %s: address (its friendly name): %w", d.ID, err)
		}
		if last := d.Address[strings.LastIndexByte(d.Address, '/')+1:]; last == "set" || last == "get" || last == "availability" {
			return nil, fmt.Errorf("device %s: address %q ends in a level Zigbee2MQTT reserves", d.ID, d.Address)
		}
		if d.Address == "bridge" || strings.HasPrefix(d.Address, "bridge/") {
			return nil, fmt.Errorf("device %s: address %q is the bridge's", d.ID, d.Address)
		}
		if _, dup := p.byName[d.Address]; dup {
			return nil, fmt.Errorf("device %s: address %q: another device has it", d.ID, d.Address)
		}
		for _, k := range d.Keys {
			if !slices.Contains(Keys, k) {
				return nil, fmt.Errorf("device %s: state key %q: %w (zigbee2mqtt translates %s)", d.ID, k, adapter.ErrUnsupported, strings.Join(Keys, ", "))
			}
		}
		if slices.Contains(d.Keys, "locked") && slices.Contains(d.Keys, "power") {
			return nil, fmt.Errorf("device %s: a type with both locked and power: Zigbee2MQTT reports both as \"state\"", d.ID)
		}
		x := &device{id: d.ID, name: d.Address, keys: d.Keys, lock: slices.Contains(d.Keys, "locked")}
		p.byName[d.Address], p.byID[d.ID] = x, x
		p.order = append(p.order, x)
	}
	return p, nil
}

// Filters are the bridge's state and logs and, per device, its state
// and availability topics: not <base>/#, which would bring back our own
// commands and the bridge's large retained device list.
func (p *Protocol) Filters() []string {
	b := p.s.Base
	f := []string{b + "/bridge/state", b + "/bridge/logging", b + "/bridge/log"}
	for _, d := range p.order {
		f = append(f, b+"/"+d.name, b+"/"+d.name+"/availability")
	}
	return f
}

// Decode reads one message from the bridge.
func (p *Protocol) Decode(m adapter.Message) ([]adapter.Report, error) {
	if len(m.Payload) > MaxPayload {
		return nil, fmt.Errorf("zigbee2mqtt: %s: payload of %d bytes (max %d)", m.Topic, len(m.Payload), MaxPayload)
	}
	rest, ok := strings.CutPrefix(m.Topic, p.s.Base+"/")
	if !ok {
		return nil, fmt.Errorf("zigbee2mqtt: topic %s is not under %s/", m.Topic, p.s.Base)
	}
	switch rest {
	case "bridge/state":
		return p.bridgeState(m.Payload)
	case "bridge/logging":
		return p.logging(m.Payload)
	case "bridge/log":
		return p.legacyLog(m.Payload)
	}
	if d := p.byName[rest]; d != nil {
		return p.state(d, m.Payload)
	}
	if name, ok := strings.CutSuffix(rest, "/availability"); ok {
		if d := p.byName[name]; d != nil {
			a, err := DecodeAvailability(m.Payload)
			if err != nil {
				return nil, fmt.Errorf("zigbee2mqtt: %s: %w", m.Topic, err)
			}
			d.avail = a
			return []adapter.Report{{Device: d.id, Availability: p.combined(d)}}, nil
		}
	}
	return nil, nil
}

// combined is a device's availability: the bridge's when the bridge is
// offline, else its own, and online when availability is not enabled.
func (p *Protocol) combined(d *device) adapter.Availability {
	if p.bridge == adapter.Offline || d.avail == adapter.Offline {
		return adapter.Offline
	}
	if p.bridge == adapter.Online || d.avail == adapter.Online {
		return adapter.Online
	}
	return adapter.Unknown
}

func (p *Protocol) bridgeState(payload []byte) ([]adapter.Report, error) {
	if len(payload) == 0 {
		return nil, nil // a cleared retained message
	}
	a, err := DecodeAvailability(payload)
	if err != nil {
		return nil, fmt.Errorf("zigbee2mqtt: bridge/state: %w", err)
	}
	p.bridge = a
	out := make([]adapter.Report, 0, len(p.order))
	for _, d := range p.order {
		out = append(out, adapter.Report{Device: d.id, Availability: p.combined(d)})
	}
	return out, nil
}

// DecodeAvailability reads an availability payload in either form: 1.x's
// plain "online"/"offline" and 2.x's {"state":"online"}.
func DecodeAvailability(payload []byte) (adapter.Availability, error) {
	s := strings.TrimSpace(string(payload))
	if strings.HasPrefix(s, "{") {
		var v struct {
			State string `json:"state"`
		}
		if err := json.Unmarshal(payload, &v); err != nil {
			return adapter.Unknown, fmt.Errorf("availability: %w", err)
		}
		s = v.State
	}
	switch s {
	case "online":
		return adapter.Online, nil
	case "offline":
		return adapter.Offline, nil
	}
	return adapter.Unknown, fmt.Errorf("availability: %.32q is neither online nor offline", s)
}

// state translates a device's state message into the common vocabulary.
func (p *Protocol) state(d *device, payload []byte) ([]adapter.Report, error) {
	if len(payload) == 0 {
		return nil, nil
	}
	st, err := DecodeState(payload, d.lock)
	if err != nil {
		return nil, fmt.Errorf("zigbee2mqtt: %s: %w", d.name, err)
	}
	if len(st) == 0 {
		return nil, nil
	}
	return []adapter.Report{{Device: d.id, State: st}}, nil
}

// DecodeState translates a Zigbee2MQTT state object into the common
// vocabulary: "state" is a lock's locked when lock is set, else power
// (a cover's OPEN/CLOSE/STOP is left out: its position says more);
// brightness 0..254 becomes a percentage, color_temp in mireds becomes
// kelvin, a cover's moving or running says whether it still travels.
// Keys it does not know (linkquality, last_seen, …) are left out.
func DecodeState(payload []byte, lock bool) (map[string]any, error) {
	var raw map[string]any
	if err := json.Unmarshal(payload, &raw); err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	if raw == nil {
		return nil, errors.New("state: not a JSON object")
	}
	st := make(map[string]any, 4)
	if s, ok := raw["state"].(string); ok {
		switch strings.ToUpper(s) {
		case "ON":
			st["power"] = "on"
		case "OFF":
			st["power"] = "off"
		case "LOCK":
			st["locked"] = true
		case "UNLOCK":
			st["locked"] = false
		}
		if lock {
			delete(st, "power")
		} else {
			delete(st, "locked")
		}
	}
	if ls, ok := raw["lock_state"]; lock && ok {
		// lock_state is the lock's own report, and decides; "state" may
		// be what was asked of it. not_fully_locked (a jam) is neither.
		switch ls {
		case "locked":
			st["locked"] = true
		case "unlocked":
			st["locked"] = false
		default:
			delete(st, "locked")
		}
	}
	if b, ok := num(raw["brightness"]); ok && b >= 0 && b <= 254 {
		st["brightness"] = int64(math.Round(b * 100 / 254))
	}
	if m, ok := num(raw["color_temp"]); ok && m >= 50 && m <= 1000 {
		st["color_temp"] = int64(math.Round(1e6 / m))
	}
	if pos, ok := num(raw["position"]); ok && pos >= 0 && pos <= 100 {
		st["position"] = int64(math.Round(pos))
	}
	switch v := raw["moving"].(type) {
	case string:
		st["moving"] = strings.ToUpper(v) != "STOP"
	case bool:
		st["moving"] = v
	}
	if v, ok := raw["running"].(bool); ok {
		st["moving"] = v
	}
	if m, ok := raw["system_mode"].(string); ok {
		st["mode"] = m
	}
	for _, k := range []string{"occupied_heating_setpoint", "current_heating_setpoint"} {
		if t, ok := num(raw[k]); ok && t > -100 && t < 200 {
			st["target"] = t
			break
		}
	}
	return st, nil
}

func num(v any) (float64, bool) {
	f, ok := v.(float64)
	return f, ok && !math.IsNaN(f) && !math.IsInf(f, 0)
}

// Log is a message on bridge/logging.
type Log struct {
	Level     string `json:"level"`
	Message   string `json:"message"`
	Namespace string `json:"namespace,omitempty"`
}

func (p *Protocol) logging(payload []byte) ([]adapter.Report, error) {
	var l Log
	if err := json.Unmarshal(payload, &l); err != nil {
		return nil, fmt.Errorf("zigbee2mqtt: bridge/logging: %w", err)
	}
	if l.Level != "error" {
		return nil, nil
	}
	return p.failure(l.Message), nil
}

// legacyLog reads 1.x's bridge/log (legacy_api), whose publish errors
// name the device in meta.
func (p *Protocol) legacyLog(payload []byte) ([]adapter.Report, error) {
	var l struct {
		Type    string `json:"type"`
		Message any    `json:"message"`
		Meta    struct {
			FriendlyName string `json:"friendly_name"`
		} `json:"meta"`
	}
	if err := json.Unmarshal(payload, &l); err != nil {
		return nil, fmt.Errorf("zigbee2mqtt: bridge/log: %w", err)
	}
	if l.Type != "zigbee_publish_error" {
		return nil, nil
	}
	msg, _ := l.Message.(string)
	d := p.byName[l.Meta.FriendlyName]
	if d == nil {
		return p.failure(msg), nil
	}
	if key := failedKey(msg); key != "" && !slices.Contains(p.sent[d.name], key) {
		return nil, nil // another client's command failed
	}
	return []adapter.Report{{Device: d.id, Failure: &adapter.Failure{Code: Classify(msg), Message: msg}}}, nil
}

// failure finds the device a bridge error names, if it is one of ours
// and the error is about a key Sortie's last command to it sent.
func (p *Protocol) failure(msg string) []adapter.Report {
	name, ok := FailedDevice(msg)
	if !ok {
		return nil
	}
	d := p.byName[name]
	if d == nil {
		return nil
	}
	if key := failedKey(msg); key != "" && !slices.Contains(p.sent[name], key) {
		return nil // another client's command failed
	}
	return []adapter.Report{{Device: d.id, Failure: &adapter.Failure{Code: Classify(msg), Message: msg}}}
}

// FailedDevice reads the friendly name from a bridge error about a
// command, in the forms Zigbee2MQTT writes (with or without the "z2m: "
// namespace folded in): "Publish 'set' 'state' to 'x' failed: …",
// "No converter available for 'state' on 'x'…", "Cannot publish to
// unsupported device 'x'", "Entity 'x' is unknown". A failed 'get' is
// not a command's failure: ok is false.
func FailedDevice(msg string) (name string, ok bool) {
	if i := strings.Index(msg, "Publish 'set' '"); i >= 0 {
		rest := msg[i+len("Publish 'set' '"):]
		j := strings.Index(rest, "' to '")
		if j < 0 {
			return "", false
		}
		rest = rest[j+len("' to '"):]
		k := strings.LastIndex(rest, "' failed")
		if k < 0 {
			return "", false
		}
		return rest[:k], true
	}
	for _, form := range []struct{ pre, post string }{
		{"' on '", "'"},
		{"Cannot publish to unsupported device '", "'"},
		{"Entity '", "' is unknown"},
	} {
		i := strings.Index(msg, form.pre)
		if i < 0 {
			continue
		}
		if form.pre == "' on '" && !strings.Contains(msg[:i], "No converter available for '") {
			continue
		}
		rest := msg[i+len(form.pre):]
		j := strings.Index(rest, form.post)
		if j < 0 {
			continue
		}
		return rest[:j], true
	}
	return "", false
}

// failedKey reads the key a bridge error is about ("Publish 'set'
// 'state' to …", "No converter available for 'state' on …"), "" when it
// names none.
func failedKey(msg string) string {
	for _, pre := range []string{"Publish 'set' '", "No converter available for '"} {
		if i := strings.Index(msg, pre); i >= 0 {
			rest := msg[i+len(pre):]
			if j := strings.IndexByte(rest, '\''); j >= 0 {
				return rest[:j]
			}
		}
	}
	return ""
}

// Classify turns a bridge error into a devices/wire code: what no retry
// can change is "unsupported"; everything else (timeouts, "MAC no ack",
// "No network route", a busy coordinator) is "unreachable", retried.
func Classify(msg string) string {
	for _, permanent := range []string{"No converter available", "unsupported device", "is unknown", "Invalid", "invalid"} {
		if strings.Contains(msg, permanent) {
			return "unsupported"
		}
	}
	return "unreachable"
}

// Command is one JSON set on <base>/<name>/set. Powering off goes with
// nothing else: a brightness sent with "OFF" would turn some bulbs on.
func (p *Protocol) Command(device string, want map[string]any, _ string) ([]adapter.Message, error) {
	d := p.byID[device]
	if d == nil {
		return nil, fmt.Errorf("zigbee2mqtt: device %s is not one of this bridge's", device)
	}
	payload, err := EncodeSet(want)
	if err != nil {
		return nil, fmt.Errorf("zigbee2mqtt: device %s: %w", device, err)
	}
	var keys map[string]any
	_ = json.Unmarshal(payload, &keys) // our own encoding
	p.sent[d.name] = sortedKeys(keys)
	return []adapter.Message{{Topic: p.s.Base + "/" + d.name + "/set", Payload: payload}}, nil
}

// EncodeSet translates a wanted state into a Zigbee2MQTT set payload.
func EncodeSet(want map[string]any) ([]byte, error) {
	set := make(map[string]any, len(want))
	for _, k := range sortedKeys(want) {
		v := want[k]
		switch k {
		case "power":
			switch v {
			case "on":
				set["state"] = "ON"
			case "off":
				set["state"] = "OFF"
			default:
				return nil, fmt.Errorf("power: %v is not on or off", v)
			}
		case "locked":
			b, ok := v.(bool)
			if !ok {
				return nil, fmt.Errorf("locked: %v is not a bool", v)
			}
			set["state"] = map[bool]string{true: "LOCK", false: "UNLOCK"}[b]
		case "brightness":
			f, ok := adapter.Number(v)
			if !ok || f < 0 || f > 100 {
				return nil, fmt.Errorf("brightness: %v is not 0..100", v)
			}
			set["brightness"] = int(math.Round(f * 254 / 100))
		case "color_temp":
			f, ok := adapter.Number(v)
			if !ok || f < 1000 || f > 20000 {
				return nil, fmt.Errorf("color_temp: %v is not a kelvin value 1000..20000", v)
			}
			set["color_temp"] = int(math.Round(1e6 / f))
		case "position":
			f, ok := adapter.Number(v)
			if !ok || f < 0 || f > 100 {
				return nil, fmt.Errorf("position: %v is not 0..100", v)
			}
			set["position"] = int(math.Round(f))
		case "mode":
			s, ok := v.(string)
			if !ok {
				return nil, fmt.Errorf("mode: %v is not a string", v)
			}
			set["system_mode"] = s
		case "target":
			f, ok := adapter.Number(v)
			if !ok {
				return nil, fmt.Errorf("target: %v is not a number", v)
			}
			set["occupied_heating_setpoint"] = f
		case "moving":
			return nil, fmt.Errorf("moving: %w (it is only reported)", adapter.ErrUnsupported)
		default:
			return nil, fmt.Errorf("%s: %w", k, adapter.ErrUnsupported)
		}
	}
	if set["state"] == "OFF" {
		set = map[string]any{"state": "OFF"}
	}
	return json.Marshal(set)
}

// Probe asks the bridge to read the device's attributes that its keys
// need; the answer is an ordinary state publish.
func (p *Protocol) Probe(id string, _ string) []adapter.Message {
	d := p.byID[id]
	if d == nil {
		return nil
	}
	get := make(map[string]string, len(d.keys))
	for _, k := range d.keys {
		switch k {
		case "power", "locked":
			get["state"] = ""
		case "brightness", "color_temp", "position":
			get[k] = ""
		case "mode":
			get["system_mode"] = ""
		case "target":
			get["occupied_heating_setpoint"] = ""
		}
	}
	if len(get) == 0 {
		get["state"] = ""
	}
	payload, _ := json.Marshal(get) // a map of strings always encodes
	return []adapter.Message{{Topic: p.s.Base + "/" + d.name + "/get", Payload: payload}}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// DevicesTopic is where the bridge publishes its devices (retained).
func (s Settings) DevicesTopic() string { return s.Base + "/bridge/devices" }

// DecodeDevices reads the bridge's bridge/devices list: each device's
// friendly name and, from its definition's exposes, what it can be
// commanded to do. The coordinator, disabled and unsupported devices,
// and devices with nothing Sortie can command are left out.
func DecodeDevices(payload []byte) ([]adapter.Found, error) {
	if len(payload) > 4<<20 {
		return nil, fmt.Errorf("bridge/devices: %d bytes (max 4 MiB)", len(payload))
	}
	var list []struct {
		FriendlyName string `json:"friendly_name"`
		Type         string `json:"type"`
		Supported    *bool  `json:"supported"`
		Disabled     bool   `json:"disabled"`
		Definition   *struct {
			Model   string   `json:"model"`
			Vendor  string   `json:"vendor"`
			Exposes []expose `json:"exposes"`
		} `json:"definition"`
	}
	if err := json.Unmarshal(payload, &list); err != nil {
		return nil, fmt.Errorf("bridge/devices: %w", err)
	}
	var out []adapter.Found
	for _, d := range list {
		if d.Type == "Coordinator" || d.Disabled || d.Definition == nil || (d.Supported != nil && !*d.Supported) || checkTopic(d.FriendlyName) != nil {
			continue
		}
		kind, keys := "", []string(nil)
		for _, e := range d.Definition.Exposes {
			if k, ks := e.kind(); k != "" {
				kind, keys = k, ks
				break
			}
		}
		if kind == "" {
			continue
		}
		out = append(out, adapter.Found{Protocol: Name, Address: d.FriendlyName, Name: d.FriendlyName,
			Model: strings.TrimSpace(d.Definition.Vendor + " " + d.Definition.Model), Kind: kind, Keys: keys})
	}
	return out, nil
}

// expose is an entry of a definition's exposes.
type expose struct {
	Type     string   `json:"type"`
	Features []expose `json:"features"`
	Property string   `json:"property"`
}

// kind says what a specific expose lets Sortie command.
func (e expose) kind() (string, []string) {
	has := func(p string) bool {
		return slices.ContainsFunc(e.Features, func(f expose) bool { return f.Property == p })
	}
	switch e.Type {
	case "switch":
		return "relay", []string{"power"}
	case "light":
		keys := []string{"power"}
		if has("brightness") {
			keys = append(keys, "brightness")
		}
		if has("color_temp") {
			keys = append(keys, "color_temp")
		}
		return "light", keys
	case "lock":
		return "lock", []string{"locked"}
	case "cover":
		if has("position") {
			return "curtain", []string{"position"}
		}
	case "climate":
		if has("occupied_heating_setpoint") && has("system_mode") {
			return "thermostat", []string{"mode", "target"}
		}
	}
	return "", nil
}
