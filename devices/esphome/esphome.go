// Package esphome speaks the MQTT component of ESPHome nodes for the
// devices of a Sortie registry that name protocol "esphome": switches,
// lights (JSON schema), locks, covers and climate entities.
//
// What counts as success: ESPHome has no reply and no command ID. Its
// entities publish their state on <prefix>/<type>/<object id>/state
// (retained by default) when it changes; the step succeeds when a
// message received after the command, not a retained replay, shows every
// commanded value. ESPHome has no way to read a state on demand, and
// whether an entity republishes a state that did not change is not
// documented: a device whose last report already shows the wanted state
// is done without a command.
//
// What counts as failure: a lock reporting JAMMED ("jammed", the step
// fails at once). An unknown payload is only logged by the node, so it
// shows as a timeout, retried.
//
// How offline is seen: <prefix>/status, the node's birth ("online",
// retained) and will ("offline").
package esphome

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/sortie-edge/sortie/devices/adapter"
)

// Name is the registry's protocol name for this package.
const Name = "esphome"

// Keys are the keys of the common vocabulary this package translates.
var Keys = []string{"power", "brightness", "color_temp", "locked", "position", "mode", "target"}

// MaxPayload bounds what Decode reads.
const MaxPayload = 8 << 10

// Components are the entity types this package speaks.
var Components = []string{"switch", "light", "lock", "cover", "climate"}

// ParseSettings reads the registry's table: ESPHome has no settings of
// its own here (each device's address holds its topic prefix).
func ParseSettings(m map[string]any) error {
	for k := range m {
		return fmt.Errorf("unknown key %s (esphome takes none: a device's address is <topic prefix>/<type>/<object id>)", k)
	}
	return nil
}

// Protocol is the adapter for a set of ESPHome entities.
type Protocol struct {
	byID   map[string]*entity
	byBase map[string]*entity // <prefix>/<type>/<object id> → entity
	nodes  map[string][]*entity
	order  []*entity
}

type entity struct {
	id, base, node, comp string
	keys                 []string
}

// New makes the adapter for devs, whose Address is the entity's base
// topic: <topic prefix>/<component type>/<object id>, e.g.
// "livingroom/light/ceiling" (the prefix is the node's name by default
// and may hold '/').
func New(devs []adapter.Device) (*Protocol, error) {
	p := &Protocol{byID: make(map[string]*entity), byBase: make(map[string]*entity), nodes: make(map[string][]*entity)}
	for _, d := range devs {
		levels := strings.Split(d.Address, "/")
		if len(levels) < 3 || slices.Contains(levels, "") || strings.ContainsAny(d.Address, "+#\x00") {
			return nil, fmt.Errorf("device %s: address %q is not <topic prefix>/<type>/<object id>", d.ID, d.Address)
		}
		comp := levels[len(levels)-2]
		if !slices.Contains(Components, comp) {
			return nil, fmt.Errorf("device %s: address %q: component %q is not one of %s", d.ID, d.Address, comp, strings.Join(Components, ", "))
		}
		if p.byBase[d.Address] != nil {
			return nil, fmt.Errorf("device %s: address %q: another device has it", d.ID, d.Address)
		}
		for _, k := range d.Keys {
			if !slices.Contains(componentKeys(comp), k) {
				return nil, fmt.Errorf("device %s: state key %q: %w (an ESPHome %s has %s)", d.ID, k, adapter.ErrUnsupported, comp, strings.Join(componentKeys(comp), ", "))
			}
		}
		e := &entity{id: d.ID, base: d.Address, node: strings.Join(levels[:len(levels)-2], "/"), comp: comp, keys: d.Keys}
		p.byID[d.ID], p.byBase[d.Address] = e, e
		p.nodes[e.node] = append(p.nodes[e.node], e)
		p.order = append(p.order, e)
	}
	return p, nil
}

func componentKeys(comp string) []string {
	switch comp {
	case "switch":
		return []string{"power"}
	case "light":
		return []string{"power", "brightness", "color_temp"}
	case "lock":
		return []string{"locked"}
	case "cover":
		return []string{"position"}
	}
	return []string{"mode", "target"}
}

// Filters are each node's status and each entity's state topics.
func (p *Protocol) Filters() []string {
	var f []string
	seen := make(map[string]bool)
	for _, e := range p.order {
		if !seen[e.node] {
			seen[e.node] = true
			f = append(f, e.node+"/status")
		}
		switch e.comp {
		case "cover":
			f = append(f, e.base+"/state", e.base+"/position/state")
		case "climate":
			f = append(f, e.base+"/mode/state", e.base+"/target_temperature/state")
		default:
			f = append(f, e.base+"/state")
		}
	}
	return f
}

// Decode reads one message of a node.
func (p *Protocol) Decode(m adapter.Message) ([]adapter.Report, error) {
	if len(m.Payload) > MaxPayload {
		return nil, fmt.Errorf("esphome: %s: payload of %d bytes (max %d)", m.Topic, len(m.Payload), MaxPayload)
	}
	if node, ok := strings.CutSuffix(m.Topic, "/status"); ok && p.nodes[node] != nil {
		var a adapter.Availability
		switch string(m.Payload) {
		case "online":
			a = adapter.Online
		case "offline":
			a = adapter.Offline
		case "":
			return nil, nil
		default:
			return nil, fmt.Errorf("esphome: %s: %.32q is neither online nor offline", m.Topic, m.Payload)
		}
		var out []adapter.Report
		for _, e := range p.nodes[node] {
			out = append(out, adapter.Report{Device: e.id, Availability: a})
		}
		return out, nil
	}
	for _, suffix := range []string{"/position/state", "/mode/state", "/target_temperature/state", "/state"} {
		base, ok := strings.CutSuffix(m.Topic, suffix)
		if !ok {
			continue
		}
		e := p.byBase[base]
		if e == nil {
			continue
		}
		if len(m.Payload) == 0 {
			return nil, nil
		}
		rep, err := decodeState(e, suffix, string(m.Payload))
		if err != nil {
			return nil, fmt.Errorf("esphome: %s: %w", m.Topic, err)
		}
		if rep.State == nil && rep.Failure == nil {
			return nil, nil
		}
		rep.Device = e.id
		return []adapter.Report{rep}, nil
	}
	return nil, fmt.Errorf("esphome: topic %s is not one of its entities'", m.Topic)
}

func decodeState(e *entity, suffix, payload string) (adapter.Report, error) {
	var rep adapter.Report
	number := func() (float64, error) {
		f, err := strconv.ParseFloat(strings.TrimSpace(payload), 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return 0, fmt.Errorf("%.32q is not a number", payload)
		}
		return f, nil
	}
	switch {
	case e.comp == "switch":
		switch payload {
		case "ON":
			rep.State = map[string]any{"power": "on"}
		case "OFF":
			rep.State = map[string]any{"power": "off"}
		default:
			return rep, fmt.Errorf("%.32q is neither ON nor OFF", payload)
		}
	case e.comp == "light":
		var l struct {
			State      string   `json:"state"`
			Brightness *float64 `json:"brightness"`
			ColorTemp  *float64 `json:"color_temp"`
		}
		if err := json.Unmarshal([]byte(payload), &l); err != nil {
			return rep, err
		}
		rep.State = make(map[string]any, 3)
		switch l.State {
		case "ON":
			rep.State["power"] = "on"
		case "OFF":
			rep.State["power"] = "off"
		}
		if l.Brightness != nil && *l.Brightness >= 0 && *l.Brightness <= 255 {
			rep.State["brightness"] = int64(math.Round(*l.Brightness * 100 / 255))
		}
		if l.ColorTemp != nil && *l.ColorTemp >= 50 && *l.ColorTemp <= 1000 {
			rep.State["color_temp"] = int64(math.Round(1e6 / *l.ColorTemp))
		}
	case e.comp == "lock":
		switch payload {
		case "LOCKED":
			rep.State = map[string]any{"locked": true, "moving": false}
		case "UNLOCKED":
			rep.State = map[string]any{"locked": false, "moving": false}
		case "LOCKING", "UNLOCKING":
			rep.State = map[string]any{"moving": true}
		case "JAMMED":
			rep.Failure = &adapter.Failure{Code: "jammed", Message: "the lock reports JAMMED"}
		default:
			return rep, fmt.Errorf("%.32q is not a lock state", payload)
		}
	case e.comp == "cover" && suffix == "/position/state":
		f, err := number()
		if err != nil {
			return rep, err
		}
		// ESPHome publishes a cover's position as 0..100 over MQTT.
		if f >= 0 && f <= 100 {
			rep.State = map[string]any{"position": int64(math.Round(f))}
		}
	case e.comp == "cover":
		switch strings.ToLower(payload) {
		case "opening", "closing":
			rep.State = map[string]any{"moving": true}
		case "open", "closed", "stopped":
			rep.State = map[string]any{"moving": false}
		}
	case suffix == "/mode/state":
		rep.State = map[string]any{"mode": strings.ToLower(payload)}
	case suffix == "/target_temperature/state":
		f, err := number()
		if err != nil {
			return rep, err
		}
		rep.State = map[string]any{"target": f}
	}
	return rep, nil
}

// Command returns the entity's commands: ON/OFF, a JSON light command,
// LOCK/UNLOCK, a position, a mode and a target temperature, each on its
// command topic.
func (p *Protocol) Command(device string, want map[string]any, _ string) ([]adapter.Message, error) {
	e := p.byID[device]
	if e == nil {
		return nil, fmt.Errorf("esphome: device %s is not one of this adapter's", device)
	}
	for k := range want {
		if !slices.Contains(componentKeys(e.comp), k) {
			return nil, fmt.Errorf("%s: %w", k, adapter.ErrUnsupported)
		}
	}
	msg := func(topic, payload string) adapter.Message {
		return adapter.Message{Topic: e.base + topic, Payload: []byte(payload)}
	}
	switch e.comp {
	case "switch":
		v, err := onOff(want["power"])
		if err != nil {
			return nil, err
		}
		return []adapter.Message{msg("/command", v)}, nil
	case "light":
		cmd := map[string]any{}
		if v, ok := want["power"]; ok {
			s, err := onOff(v)
			if err != nil {
				return nil, err
			}
			cmd["state"] = s
		}
		if cmd["state"] != "OFF" {
			if v, ok := want["brightness"]; ok {
				b, ok := adapter.Number(v)
				if !ok || b < 0 || b > 100 {
					return nil, fmt.Errorf("brightness: %v is not 0..100", v)
				}
				cmd["brightness"] = int(math.Round(b * 255 / 100))
				cmd["state"] = "ON"
			}
			if v, ok := want["color_temp"]; ok {
				k, ok := adapter.Number(v)
				if !ok || k < 1000 || k > 20000 {
					return nil, fmt.Errorf("color_temp: %v is not a kelvin value 1000..20000", v)
				}
				cmd["color_temp"] = int(math.Round(1e6 / k))
			}
		}
		b, _ := json.Marshal(cmd) // strings and ints always encode
		return []adapter.Message{msg("/command", string(b))}, nil
	case "lock":
		l, ok := want["locked"].(bool)
		if !ok {
			return nil, fmt.Errorf("locked: %v is not a bool", want["locked"])
		}
		return []adapter.Message{msg("/command", map[bool]string{true: "LOCK", false: "UNLOCK"}[l])}, nil
	case "cover":
		pos, ok := adapter.Number(want["position"])
		if !ok || pos < 0 || pos > 100 {
			return nil, fmt.Errorf("position: %v is not 0..100", want["position"])
		}
		return []adapter.Message{msg("/position/command", strconv.Itoa(int(math.Round(pos))))}, nil
	}
	var out []adapter.Message
	if v, ok := want["mode"]; ok {
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("mode: %v is not a string", v)
		}
		out = append(out, msg("/mode/command", s)) // ESPHome reads the mode in any case
	}
	if v, ok := want["target"]; ok {
		t, ok := adapter.Number(v)
		if !ok {
			return nil, fmt.Errorf("target: %v is not a number", v)
		}
		out = append(out, msg("/target_temperature/command", strconv.FormatFloat(t, 'f', -1, 64)))
	}
	return out, nil
}

func onOff(v any) (string, error) {
	switch v {
	case "on":
		return "ON", nil
	case "off":
		return "OFF", nil
	}
	return "", fmt.Errorf("power: %v is not on or off", v)
}

// Probe is nil: ESPHome has no way to ask an entity for its state.
func (p *Protocol) Probe(string, string) []adapter.Message { return nil }

// DiscoveryFilters are where Home Assistant discovery configs are
// published (ESPHome publishes them by default, retained, with
// abbreviated keys).
var DiscoveryFilters = []string{"homeassistant/+/+/config", "homeassistant/+/+/+/config"}

// DecodeDiscovery reads a Home Assistant discovery config and reports
// the entity when it is an ESPHome node's: its state and command topics
// are <prefix>/<type>/<object id>/state and /command (or a cover's
// /position/...), its availability <prefix>/status. Configs of others
// are not an error: ok is false.
func DecodeDiscovery(topic string, payload []byte) (f adapter.Found, ok bool, err error) {
	if len(payload) == 0 {
		return f, false, nil // a removed entity
	}
	if len(payload) > MaxPayload {
		return f, false, fmt.Errorf("discovery %s: %d bytes (max %d)", topic, len(payload), MaxPayload)
	}
	var raw map[string]any
	if err := json.Unmarshal(payload, &raw); err != nil {
		return f, false, fmt.Errorf("discovery %s: %w", topic, err)
	}
	str := func(long, short string) string {
		v, _ := raw[long].(string)
		if v == "" {
			v, _ = raw[short].(string)
		}
		// "~" stands for the base topic at either end of a *_topic value.
		if base, _ := raw["~"].(string); base != "" {
			if strings.HasPrefix(v, "~") {
				v = base + v[1:]
			} else if strings.HasSuffix(v, "~") {
				v = v[:len(v)-1] + base
			}
		}
		return v
	}
	levels := strings.Split(topic, "/")
	comp := levels[1]
	cmd := str("command_topic", "cmd_t")
	if comp == "cover" && str("set_position_topic", "set_pos_t") == "" {
		return f, false, nil // a cover without position: nothing Sortie sets
	}
	if comp == "climate" {
		cmd = strings.TrimSuffix(str("mode_command_topic", "mode_cmd_t"), "/mode/command") + "/command"
	}
	base, isCmd := strings.CutSuffix(cmd, "/command")
	avty := str("availability_topic", "avty_t")
	bl := strings.Split(base, "/")
	if !isCmd || len(bl) < 3 || bl[len(bl)-2] != comp || !slices.Contains(Components, comp) ||
		avty != strings.Join(bl[:len(bl)-2], "/")+"/status" {
		return f, false, nil
	}
	name := str("name", "name")
	if dev, _ := raw["device"].(map[string]any); dev != nil {
		if n, _ := dev["name"].(string); n != "" && name != "" {
			name = n + " " + name
		}
	} else if dev, _ := raw["dev"].(map[string]any); dev != nil {
		if n, _ := dev["name"].(string); n != "" && name != "" {
			name = n + " " + name
		}
	}
	f = adapter.Found{Protocol: Name, Address: base, Name: name, Model: "ESPHome " + comp}
	switch comp {
	case "switch":
		f.Kind, f.Keys = "relay", []string{"power"}
	case "light":
		f.Kind, f.Keys = "light", []string{"power", "brightness"}
	case "lock":
		f.Kind, f.Keys = "lock", []string{"locked"}
	case "cover":
		f.Kind, f.Keys = "curtain", []string{"position"}
	case "climate":
		f.Kind, f.Keys = "thermostat", []string{"mode", "target"}
	}
	return f, true, nil
}
