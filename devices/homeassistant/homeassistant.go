// Package homeassistant speaks for any device described by a Home
// Assistant MQTT discovery config, for the devices of a Sortie registry
// that name protocol "homeassistant": switches, lights (default and JSON
// schema), locks, covers and climate entities. It is how Sortie reaches
// devices that have no adapter of their own but that Home Assistant
// already drives over MQTT (hand-written configs, OpenMQTTGateway,
// Zwave-JS-UI, custom firmware, ...).
//
// A registry entry carries its device's config, in Home Assistant's own
// keys (full or abbreviated, "~" base topics allowed): the config that
// is, or would be, published on <prefix>/<component>/<object id>/config.
// `agent devices discover` prints it from what devices announce, so
// nobody types it. Keeping it in the registry, rather than reading the
// announcement at start, means a device configured in Home Assistant's
// YAML (which announces nothing) works too, and that what Sortie does is
// what the reviewed registry says.
//
// What counts as success: these devices have no reply and no command
// ID. The step succeeds when a state message received after the command,
// not a retained replay, shows every commanded value (a cover: its
// position, and no longer opening or closing). An entity without a state
// topic (optimistic) cannot be confirmed and is refused at load.
//
// What counts as failure: a lock reporting its state_jammed. Anything
// else shows as a timeout, retried.
//
// How offline is seen: the config's availability (availability_topic or
// an availability list, with availability_mode latest, any or all).
// Without one, offline shows only as timeouts.
//
// Templates: value templates are evaluated in a documented subset of
// Jinja (see template.go), command templates as text with placeholders;
// a config using more is refused at load, with the reason.
package homeassistant

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
const Name = "homeassistant"

// Keys are the keys of the common vocabulary this package translates.
var Keys = []string{"power", "brightness", "color_temp", "locked", "position", "mode", "target"}

// MaxPayload bounds what Decode reads.
const MaxPayload = 16 << 10

// Components are the entity types this package speaks.
var Components = []string{"switch", "light", "lock", "cover", "climate"}

// Protocol is the adapter for a set of Home Assistant MQTT entities.
type Protocol struct {
	byID  map[string]*entity
	order []*entity
	// readers maps a topic to what reads it: several entities may share
	// a state topic (a JSON state holding many values, each entity's
	// template picking its own).
	readers map[string][]use
	// avail is each entity's last availability per topic.
	avail map[string]map[string]adapter.Availability
}

// use is what one entity reads on a topic.
type use struct {
	e    *entity
	role string // state, brightness, color_temp, position, mode, target, availability
	avty int    // the availability's index, for role availability
}

// New makes the adapter for devs, whose Address is
// <component>/[<node id>/]<object id> (as in the discovery topic) and
// whose Config is the entity's discovery config.
func New(_ Settings, devs []adapter.Device) (*Protocol, error) {
	p := &Protocol{byID: make(map[string]*entity), readers: make(map[string][]use),
		avail: make(map[string]map[string]adapter.Availability)}
	addrs := make(map[string]string)
	for _, d := range devs {
		comp, err := checkAddress(d.Address)
		if err != nil {
			return nil, fmt.Errorf("device %s: %w", d.ID, err)
		}
		if other, ok := addrs[d.Address]; ok {
			return nil, fmt.Errorf("device %s: address %q: device %s has it", d.ID, d.Address, other)
		}
		addrs[d.Address] = d.ID
		if d.Config == nil {
			return nil, fmt.Errorf("device %s: config: missing (the entity's Home Assistant discovery config; `agent devices discover` prints it)", d.ID)
		}
		e, err := parseEntity(d.ID, comp, Normalize(d.Config))
		if err != nil {
			return nil, fmt.Errorf("device %s: config: %w", d.ID, err)
		}
		for _, k := range d.Keys {
			if !slices.Contains(e.keys, k) {
				return nil, fmt.Errorf("device %s: state key %q: %w (its config gives a %s with %s)", d.ID, k, adapter.ErrUnsupported, comp, strings.Join(e.keys, ", "))
			}
		}
		p.byID[d.ID] = e
		p.order = append(p.order, e)
		add := func(topic, role string, i int) {
			if topic != "" {
				p.readers[topic] = append(p.readers[topic], use{e: e, role: role, avty: i})
			}
		}
		switch comp {
		case "cover":
			add(e.pos, "position", 0)
			add(e.state, "state", 0)
		case "climate":
			add(e.modeState, "mode", 0)
			add(e.tempState, "target", 0)
		default:
			add(e.state, "state", 0)
			add(e.briState, "brightness", 0)
			add(e.ctState, "color_temp", 0)
		}
		for i, a := range e.avty {
			add(a.topic, "availability", i)
		}
		p.avail[d.ID] = make(map[string]adapter.Availability)
	}
	return p, nil
}

// checkAddress checks <component>/[<node id>/]<object id> and returns
// the component.
func checkAddress(addr string) (string, error) {
	levels := strings.Split(addr, "/")
	if len(levels) < 2 || len(levels) > 3 {
		return "", fmt.Errorf("address %q is not <component>/[<node id>/]<object id>", addr)
	}
	for _, l := range levels {
		if l == "" || strings.IndexFunc(l, notIDRune) >= 0 {
			return "", fmt.Errorf("address %q: %q is not made of [a-zA-Z0-9_-]", addr, l)
		}
	}
	if !slices.Contains(Components, levels[0]) {
		return "", fmt.Errorf("address %q: component %q is not one of %s", addr, levels[0], strings.Join(Components, ", "))
	}
	return levels[0], nil
}

// notIDRune says r may not be in a node or object ID ([a-zA-Z0-9_-]).
func notIDRune(r rune) bool {
	return r != '_' && r != '-' && (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (r < '0' || r > '9')
}

// Filters are the entities' state and availability topics.
func (p *Protocol) Filters() []string {
	var f []string
	for _, e := range p.order {
		f = append(f, e.topics()...)
	}
	slices.Sort(f)
	return slices.Compact(f)
}

// Decode reads one message on an entity's topic.
func (p *Protocol) Decode(m adapter.Message) ([]adapter.Report, error) {
	if len(m.Payload) > MaxPayload {
		return nil, fmt.Errorf("homeassistant: %s: payload of %d bytes (max %d)", m.Topic, len(m.Payload), MaxPayload)
	}
	rs := p.readers[m.Topic]
	if rs == nil {
		return nil, fmt.Errorf("homeassistant: topic %s is not one of its entities'", m.Topic)
	}
	byDev := make(map[string]*adapter.Report)
	var order []string
	var errs []string
	for _, r := range rs {
		rep := byDev[r.e.id]
		if rep == nil {
			rep = &adapter.Report{Device: r.e.id}
			byDev[r.e.id] = rep
			order = append(order, r.e.id)
		}
		if r.role == "availability" {
			rep.Availability = p.availability(r.e, r.avty, m.Payload)
			continue
		}
		if len(m.Payload) == 0 {
			continue // a cleared retained state says nothing
		}
		if err := r.e.decode(r.role, m.Payload, rep); err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", r.e.id, err))
		}
	}
	var out []adapter.Report
	for _, id := range order {
		if rep := byDev[id]; rep.State != nil || rep.Failure != nil || rep.Availability != adapter.Unknown {
			out = append(out, *rep)
		}
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("homeassistant: %s: %s", m.Topic, strings.Join(errs, "; "))
	}
	return out, nil
}

// availability records what availability i of e said and returns the
// entity's availability by its mode.
func (p *Protocol) availability(e *entity, i int, payload []byte) adapter.Availability {
	a := e.avty[i]
	v, ok := a.tpl.eval(payload)
	now := adapter.Unknown
	switch {
	case !ok:
	case v == a.on:
		now = adapter.Online
	case v == a.off:
		now = adapter.Offline
	}
	if now == adapter.Unknown {
		return adapter.Unknown
	}
	seen := p.avail[e.id]
	seen[a.topic] = now
	switch e.avtyMode {
	case "any":
		for _, s := range seen {
			if s == adapter.Online {
				return adapter.Online
			}
		}
		return adapter.Offline
	case "all":
		for _, x := range e.avty {
			if seen[x.topic] != adapter.Online {
				return adapter.Offline
			}
		}
		return adapter.Online
	}
	return now
}

// decode reads payload, on the topic of role, into rep.
func (e *entity) decode(role string, payload []byte, rep *adapter.Report) error {
	set := func(k string, v any) {
		if rep.State == nil {
			rep.State = make(map[string]any, 2)
		}
		rep.State[k] = v
	}
	num := func(t *valueTemplate) (float64, bool, error) {
		s, ok := t.eval(payload)
		if s = strings.TrimSpace(s); !ok || s == "" || s == "None" {
			return 0, false, nil // says nothing of it, as in Home Assistant
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return 0, false, fmt.Errorf("%.32q is not a number", s)
		}
		return f, true, nil
	}
	switch {
	case e.comp == "light" && e.json:
		return e.decodeJSONLight(payload, set)
	case role == "state" && (e.comp == "switch" || e.comp == "light"):
		s, ok := e.stateTpl.eval(payload)
		switch {
		case !ok || s == "None":
		case s == e.stOn:
			set("power", "on")
		case s == e.stOff:
			set("power", "off")
		default:
			return fmt.Errorf("%.32q is neither %q nor %q", s, e.stOn, e.stOff)
		}
	case role == "brightness":
		f, ok, err := num(e.briTpl)
		if ok && f >= 0 && f <= e.briScale {
			set("brightness", int64(math.Round(f*100/e.briScale)))
		}
		return err
	case role == "color_temp":
		f, ok, err := num(e.ctTpl)
		if ok {
			if k, ok := e.kelvin(f); ok {
				set("color_temp", k)
			}
		}
		return err
	case e.comp == "lock":
		s, ok := e.stateTpl.eval(payload)
		switch {
		case !ok || s == "None":
		case s == e.stLocked:
			set("locked", true)
			set("moving", false)
		case s == e.stUnlocked || s == e.stOpen:
			set("locked", false)
			set("moving", false)
		case s == e.stLocking || s == e.stUnlock || s == e.stOpening:
			set("moving", true)
		case s == e.stJammed:
			rep.Failure = &adapter.Failure{Code: "jammed", Message: "the lock reports " + e.stJammed}
		default:
			return fmt.Errorf("%.32q is not a lock state of its config", s)
		}
	case role == "position":
		f, ok, err := num(e.posTpl)
		if ok {
			pct := (f - e.posClosed) * 100 / (e.posOpen - e.posClosed)
			if pct >= -0.5 && pct <= 100.5 {
				set("position", int64(math.Round(math.Max(0, math.Min(100, pct)))))
			}
		}
		return err
	case role == "state" && e.comp == "cover":
		s, ok := e.stateTpl.eval(payload)
		switch {
		case !ok:
		case s == e.stOpening || s == e.stClose:
			set("moving", true)
		case slices.Contains(e.stMoveEnd, s):
			set("moving", false)
		}
	case role == "mode":
		if s, ok := e.modeTpl.eval(payload); ok && s != "" && s != "None" {
			set("mode", s)
		}
	case role == "target":
		f, ok, err := num(e.tempTpl)
		if ok {
			set("target", f)
		}
		return err
	}
	return nil
}

// decodeJSONLight reads a JSON-schema light's state.
func (e *entity) decodeJSONLight(payload []byte, set func(string, any)) error {
	var l struct {
		State      *string  `json:"state"`
		Brightness *float64 `json:"brightness"`
		ColorTemp  *float64 `json:"color_temp"`
	}
	if err := json.Unmarshal(payload, &l); err != nil {
		return err
	}
	if l.State != nil {
		switch *l.State {
		case "ON":
			set("power", "on")
		case "OFF":
			set("power", "off")
		default:
			return fmt.Errorf("state %.32q is neither ON nor OFF", *l.State)
		}
	}
	if l.Brightness != nil && *l.Brightness >= 0 && *l.Brightness <= e.briScale {
		set("brightness", int64(math.Round(*l.Brightness*100/e.briScale)))
	}
	if l.ColorTemp != nil {
		if k, ok := e.kelvin(*l.ColorTemp); ok {
			set("color_temp", k)
		}
	}
	return nil
}

// kelvin reads a reported color temperature, in mireds unless the
// config says kelvin.
func (e *entity) kelvin(v float64) (int64, bool) {
	if e.ctKelvin {
		return int64(math.Round(v)), v >= 1000 && v <= 20000
	}
	if v < 50 || v > 1000 {
		return 0, false
	}
	return int64(math.Round(1e6 / v)), true
}

// Command returns the messages that bring the entity to want, on its
// command topics, through its command templates.
func (p *Protocol) Command(device string, want map[string]any, _ string) ([]adapter.Message, error) {
	e := p.byID[device]
	if e == nil {
		return nil, fmt.Errorf("homeassistant: device %s is not one of this adapter's", device)
	}
	for k := range want {
		if !slices.Contains(e.keys, k) {
			return nil, fmt.Errorf("%s: %w", k, adapter.ErrUnsupported)
		}
	}
	msg := func(topic string, t *commandTemplate, v string) adapter.Message {
		return adapter.Message{Topic: topic, Payload: []byte(t.render(map[string]string{"value": v}))}
	}
	switch e.comp {
	case "switch":
		v, err := e.onOff(want["power"])
		if err != nil {
			return nil, err
		}
		return []adapter.Message{msg(e.cmd, e.cmdTpl, v)}, nil
	case "light":
		return e.lightCommand(want, msg)
	case "lock":
		l, ok := want["locked"].(bool)
		if !ok {
			return nil, fmt.Errorf("locked: %v is not a bool", want["locked"])
		}
		v := e.plUnlock
		if l {
			v = e.plLock
		}
		return []adapter.Message{msg(e.cmd, e.cmdTpl, v)}, nil
	case "cover":
		pos, ok := adapter.Number(want["position"])
		if !ok || pos < 0 || pos > 100 {
			return nil, fmt.Errorf("position: %v is not 0..100", want["position"])
		}
		raw := math.Round(e.posClosed + pos*(e.posOpen-e.posClosed)/100)
		payload := e.setPosTpl.render(map[string]string{
			"value": strconv.FormatFloat(raw, 'f', -1, 64), "position": strconv.FormatFloat(math.Round(pos), 'f', -1, 64)})
		return []adapter.Message{{Topic: e.setPos, Payload: []byte(payload)}}, nil
	}
	var out []adapter.Message
	if v, ok := want["mode"]; ok {
		s, ok := v.(string)
		if !ok || !slices.Contains(e.modes, s) {
			return nil, fmt.Errorf("mode: %v is not one of its modes (%s): %w", v, strings.Join(e.modes, ", "), adapter.ErrUnsupported)
		}
		out = append(out, msg(e.modeCmd, e.modeCmdTpl, s))
	}
	if v, ok := want["target"]; ok {
		t, ok := adapter.Number(v)
		if !ok {
			return nil, fmt.Errorf("target: %v is not a number", v)
		}
		out = append(out, msg(e.tempCmd, e.tempCmdTpl, strconv.FormatFloat(t, 'f', -1, 64)))
	}
	return out, nil
}

func (e *entity) onOff(v any) (string, error) {
	switch v {
	case "on":
		return e.plOn, nil
	case "off":
		return e.plOff, nil
	}
	return "", fmt.Errorf("power: %v is not on or off", v)
}

// lightCommand turns a light on or off, dims it and sets its white, in
// its schema: one JSON command, or one message per command topic with
// the power first (an off light is only turned off).
func (e *entity) lightCommand(want map[string]any, msg func(string, *commandTemplate, string) adapter.Message) ([]adapter.Message, error) {
	power := ""
	if v, ok := want["power"]; ok {
		var err error
		if power, err = e.onOff(v); err != nil {
			return nil, err
		}
	}
	off := power != "" && power == e.plOff
	var bri, ct float64
	hasBri, hasCT := false, false
	if v, ok := want["brightness"]; ok && !off {
		b, ok := adapter.Number(v)
		if !ok || b < 0 || b > 100 {
			return nil, fmt.Errorf("brightness: %v is not 0..100", v)
		}
		bri, hasBri = math.Round(b*e.briScale/100), true
	}
	if v, ok := want["color_temp"]; ok && !off {
		k, ok := adapter.Number(v)
		if !ok || k < 1000 || k > 20000 {
			return nil, fmt.Errorf("color_temp: %v is not a kelvin value 1000..20000", v)
		}
		ct, hasCT = math.Round(k), true
		if !e.ctKelvin {
			ct = math.Round(1e6 / k)
		}
	}
	if e.json {
		cmd := map[string]any{}
		if off {
			cmd["state"] = "OFF"
		} else {
			cmd["state"] = "ON"
		}
		if hasBri {
			cmd["brightness"] = int64(bri)
		}
		if hasCT {
			cmd["color_temp"] = int64(ct)
		}
		b, _ := json.Marshal(cmd) // strings and ints always encode
		return []adapter.Message{{Topic: e.cmd, Payload: b}}, nil
	}
	var out []adapter.Message
	if power != "" {
		out = append(out, msg(e.cmd, e.cmdTpl, power))
	}
	if hasBri {
		out = append(out, msg(e.briCmd, e.briCmdTpl, strconv.FormatFloat(bri, 'f', -1, 64)))
	}
	if hasCT {
		out = append(out, msg(e.ctCmd, e.ctCmdTpl, strconv.FormatFloat(ct, 'f', -1, 64)))
	}
	return out, nil
}

// Probe is nil: Home Assistant's MQTT entities have no way to be asked
// for their state.
func (p *Protocol) Probe(string, string) []adapter.Message { return nil }
