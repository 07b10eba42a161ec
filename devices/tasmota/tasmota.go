// Package tasmota speaks Tasmota's MQTT interface for the devices of a
// Sortie registry that name protocol "tasmota": plugs, relays, dimmers,
// white-spectrum lights and shutters.
//
// What counts as success: Tasmota answers every command and query on
// stat/<topic>/RESULT (or, with SetOption4, on stat/<topic>/<COMMAND>)
// with a JSON echo of the new values, e.g. {"POWER":"ON","Dimmer":40}.
// It carries no command ID: the step succeeds when an echo published
// after the command (never a retained one) shows every commanded value.
// A shutter is confirmed when it reports its position at the target
// with Direction 0, not when it starts moving.
//
// What counts as failure: {"Command":"Unknown"} (the device has no
// such command; it names none, so it may answer another client's: the
// attempt fails at once and is retried), and silence (a timeout,
// retried with a query first).
//
// How offline is seen: tele/<topic>/LWT, retained: "Online" published
// by the device at connect, "Offline" its will (the payloads may be
// changed with the lwt_online/lwt_offline settings).
//
// Commands go on cmnd/<topic>/<Command>, never retained; a query (the
// read before a retry) is the same topic with an empty payload.
package tasmota

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/sortie-edge/sortie/devices/adapter"
)

// Name is the registry's protocol name for this package.
const Name = "tasmota"

// Keys are the keys of the common vocabulary this package translates.
var Keys = []string{"power", "brightness", "color_temp", "position"}

// MaxPayload bounds what Decode reads: Tasmota's own MQTT buffer is
// 1,200 bytes by default, larger in some builds.
const MaxPayload = 16 << 10

// DefaultFullTopic is Tasmota's default FullTopic.
const DefaultFullTopic = "%prefix%/%topic%/"

// Settings are a registry's [protocols.tasmota] table.
type Settings struct {
	// FullTopic is the devices' FullTopic: %prefix% and %topic% are
	// replaced; default DefaultFullTopic.
	FullTopic string
	// Prefixes are Prefix1..3: commands, status, telemetry.
	Prefixes [3]string
	// Online and Offline are the LWT payloads, "Online"/"Offline" by
	// default.
	Online, Offline string
}

// ParseSettings reads the registry's table; unknown keys are errors.
func ParseSettings(m map[string]any) (Settings, error) {
	s := Settings{FullTopic: DefaultFullTopic, Prefixes: [3]string{"cmnd", "stat", "tele"}, Online: "Online", Offline: "Offline"}
	str := func(k string, v any) (string, error) {
		x, ok := v.(string)
		if !ok || x == "" {
			return "", fmt.Errorf("%s: %v is not a non-empty string", k, v)
		}
		return x, nil
	}
	var err error
	for k, v := range m {
		switch k {
		case "full_topic":
			s.FullTopic, err = str(k, v)
		case "prefixes":
			l, ok := v.([]any)
			if !ok || len(l) != 3 {
				return s, fmt.Errorf("prefixes: want three strings (commands, status, telemetry), got %v", v)
			}
			for i, x := range l {
				if s.Prefixes[i], err = str(k, x); err != nil {
					return s, err
				}
			}
		case "lwt_online":
			s.Online, err = str(k, v)
		case "lwt_offline":
			s.Offline, err = str(k, v)
		default:
			return s, fmt.Errorf("unknown key %s (tasmota takes full_topic, prefixes, lwt_online, lwt_offline)", k)
		}
		if err != nil {
			return s, err
		}
	}
	if !strings.Contains(s.FullTopic, "%prefix%") || !strings.Contains(s.FullTopic, "%topic%") {
		return s, fmt.Errorf("full_topic: %q needs %%prefix%% and %%topic%%", s.FullTopic)
	}
	if strings.ContainsAny(s.FullTopic, "+#") {
		return s, fmt.Errorf("full_topic: %q holds an MQTT wildcard", s.FullTopic)
	}
	for _, p := range s.Prefixes {
		if strings.ContainsAny(p, "+#/") {
			return s, fmt.Errorf("prefixes: %q holds '/' or a wildcard", p)
		}
	}
	return s, nil
}

// Topic is where a device's prefix-kind messages go: the FullTopic with
// its tokens replaced, then the message's own name (POWER, RESULT, LWT).
func (s Settings) Topic(prefix, topic, name string) string {
	t := strings.ReplaceAll(s.FullTopic, "%prefix%", prefix)
	t = strings.ReplaceAll(t, "%topic%", topic)
	if !strings.HasSuffix(t, "/") {
		t += "/"
	}
	return t + name
}

// Protocol is the adapter for a set of Tasmota devices.
type Protocol struct {
	s      Settings
	byID   map[string]*device
	order  []*device
	routes map[string]route // topic without its last level → device
}

type device struct {
	id, topic string
	relay     int // POWER<relay>; 0 is plain POWER
	shutter   int // Shutter<n> for position
	keys      []string
}

type route struct {
	dev  *device
	kind int // 1 status, 2 telemetry
}

// New makes the adapter for devs. A device's Address is its Tasmota
// topic (tasmota_1A2B3C), with ":N" for its Nth relay or shutter on a
// device that has several ("tasmota_1A2B3C:2").
func New(s Settings, devs []adapter.Device) (*Protocol, error) {
	p := &Protocol{s: s, byID: make(map[string]*device), routes: make(map[string]route)}
	seen := make(map[string]bool)
	for _, d := range devs {
		topic, n, err := parseAddress(d.Address)
		if err != nil {
			return nil, fmt.Errorf("device %s: address: %w", d.ID, err)
		}
		if seen[d.Address] {
			return nil, fmt.Errorf("device %s: address %q: another device has it", d.ID, d.Address)
		}
		seen[d.Address] = true
		for _, k := range d.Keys {
			if !slices.Contains(Keys, k) {
				return nil, fmt.Errorf("device %s: state key %q: %w (tasmota translates %s)", d.ID, k, adapter.ErrUnsupported, strings.Join(Keys, ", "))
			}
		}
		x := &device{id: d.ID, topic: topic, keys: d.Keys}
		if slices.Contains(d.Keys, "position") {
			x.shutter = max(n, 1)
		} else {
			x.relay = n
		}
		p.byID[d.ID] = x
		p.order = append(p.order, x)
		for kind, prefix := range map[int]string{1: s.Prefixes[1], 2: s.Prefixes[2]} {
			base := strings.TrimSuffix(s.Topic(prefix, topic, ""), "/")
			if r, dup := p.routes[base]; dup && r.dev.topic != topic {
				return nil, fmt.Errorf("device %s: its topics collide with device %s's", d.ID, r.dev.id)
			}
			if _, dup := p.routes[base]; !dup {
				p.routes[base] = route{dev: x, kind: kind}
			}
		}
	}
	return p, nil
}

func parseAddress(a string) (topic string, n int, err error) {
	topic = a
	if i := strings.LastIndexByte(a, ':'); i >= 0 {
		n, err = strconv.Atoi(a[i+1:])
		if err != nil || n < 1 || n > 32 {
			return "", 0, fmt.Errorf("%q: after ':' comes a relay or shutter number 1..32", a)
		}
		topic = a[:i]
	}
	switch {
	case topic == "":
		return "", 0, errors.New("empty")
	case len(topic) > 100:
		return "", 0, errors.New("longer than Tasmota's 100 bytes")
	case strings.ContainsAny(topic, "+#/ \x00"):
		return "", 0, fmt.Errorf("%q: a Tasmota topic has no '/', space or wildcard", topic)
	}
	return topic, n, nil
}

// Filters are each device's status and telemetry topics.
func (p *Protocol) Filters() []string {
	var f []string
	seen := make(map[string]bool)
	for _, d := range p.order {
		for _, prefix := range []string{p.s.Prefixes[1], p.s.Prefixes[2]} {
			t := p.s.Topic(prefix, d.topic, "+")
			if !seen[t] {
				seen[t] = true
				f = append(f, t)
			}
		}
	}
	return f
}

// Decode reads one message of a device.
func (p *Protocol) Decode(m adapter.Message) ([]adapter.Report, error) {
	if len(m.Payload) > MaxPayload {
		return nil, fmt.Errorf("tasmota: %s: payload of %d bytes (max %d)", m.Topic, len(m.Payload), MaxPayload)
	}
	i := strings.LastIndexByte(m.Topic, '/')
	if i < 0 {
		return nil, fmt.Errorf("tasmota: topic %s is not a device's", m.Topic)
	}
	r, ok := p.routes[m.Topic[:i]]
	if !ok {
		return nil, fmt.Errorf("tasmota: topic %s is not a device's", m.Topic)
	}
	name := m.Topic[i+1:]
	var out []adapter.Report
	// Several devices may be relays of one Tasmota: each reads its own.
	for _, d := range p.order {
		if d.topic != r.dev.topic {
			continue
		}
		rep, err := p.decodeFor(d, r.kind, name, m.Payload)
		if err != nil {
			return nil, err
		}
		if rep != nil {
			out = append(out, *rep)
		}
	}
	return out, nil
}

func (p *Protocol) decodeFor(d *device, kind int, name string, payload []byte) (*adapter.Report, error) {
	if kind == 2 && name == "LWT" {
		switch string(payload) {
		case p.s.Online:
			return &adapter.Report{Device: d.id, Availability: adapter.Online}, nil
		case p.s.Offline:
			return &adapter.Report{Device: d.id, Availability: adapter.Offline}, nil
		case "":
			return nil, nil // a cleared retained will
		}
		return nil, fmt.Errorf("tasmota: %s LWT: %.32q is neither %s nor %s", d.topic, payload, p.s.Online, p.s.Offline)
	}
	if kind == 2 && name != "STATE" && name != "SENSOR" && name != "RESULT" {
		return nil, nil // INFO1, UPTIME, MARGINS, ...
	}
	if len(payload) == 0 {
		return nil, nil
	}
	if payload[0] != '{' {
		// The plain stat/<topic>/POWER<n> "ON"; other plain replies say
		// nothing of our keys.
		if kind != 1 || !strings.EqualFold(name, d.powerName()) {
			return nil, nil
		}
		v, ok := onOff(string(payload))
		if !ok {
			return nil, fmt.Errorf("tasmota: %s %s: %.32q is not ON or OFF", d.topic, name, payload)
		}
		return &adapter.Report{Device: d.id, State: map[string]any{"power": v}}, nil
	}
	st, unknown, err := DecodeResult(payload, d.relay, d.shutter)
	if err != nil {
		return nil, fmt.Errorf("tasmota: %s %s: %w", d.topic, name, err)
	}
	rep := &adapter.Report{Device: d.id}
	if unknown {
		// It names no command: it may answer another client's, or another
		// relay's. The attempt fails at once, and is retried.
		rep.Failure = &adapter.Failure{Code: "internal", Message: "Tasmota answered {\"Command\":\"Unknown\"}"}
	}
	if len(st) > 0 {
		rep.State = st
	}
	if rep.State == nil && rep.Failure == nil {
		return nil, nil
	}
	return rep, nil
}

func (d *device) powerName() string {
	if d.relay == 0 {
		return "POWER"
	}
	return "POWER" + strconv.Itoa(d.relay)
}

func onOff(s string) (string, bool) {
	switch strings.ToUpper(s) {
	case "ON", "1":
		return "on", true
	case "OFF", "0":
		return "off", true
	}
	return "", false
}

// DecodeResult translates a RESULT, STATE or SENSOR object into the
// common vocabulary, for the device's relay (0: POWER, and POWER1 on a
// single-relay device with SetOption26) or shutter (1..). unknown says
// the object is Tasmota's {"Command":"Unknown"}.
func DecodeResult(payload []byte, relay, shutter int) (st map[string]any, unknown bool, err error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(payload, &raw); err != nil {
		return nil, false, err
	}
	if raw == nil {
		return nil, false, errors.New("not a JSON object")
	}
	// The answers to Status 10 and 11 hold the sensors' and the state's
	// objects one level down.
	for _, inner := range []string{"StatusSNS", "StatusSTS"} {
		if v, ok := raw[inner]; ok {
			return DecodeResult(v, relay, shutter)
		}
	}
	st = make(map[string]any, 3)
	if c, ok := raw["Command"]; ok {
		var s string
		if json.Unmarshal(c, &s) == nil && s == "Unknown" {
			return st, true, nil
		}
	}
	str := func(key string) (string, bool) {
		var s string
		v, ok := raw[key]
		if !ok || json.Unmarshal(v, &s) != nil {
			return "", false
		}
		return s, true
	}
	number := func(key string) (float64, bool) {
		var f float64
		v, ok := raw[key]
		if !ok || json.Unmarshal(v, &f) != nil || math.IsNaN(f) {
			return 0, false
		}
		return f, true
	}
	if shutter == 0 {
		names := []string{"POWER" + strconv.Itoa(relay)}
		if relay <= 1 {
			names = []string{"POWER", "POWER1"}
		}
		for _, n := range names {
			if s, ok := str(n); ok {
				if v, ok := onOff(s); ok {
					st["power"] = v
					break
				}
			}
		}
		if b, ok := number("Dimmer"); ok && b >= 0 && b <= 100 {
			st["brightness"] = int64(math.Round(b))
		}
		if ct, ok := number("CT"); ok && ct >= 153 && ct <= 500 {
			st["color_temp"] = int64(math.Round(1e6 / ct))
		}
		return st, false, nil
	}
	if v, ok := raw["Shutter"+strconv.Itoa(shutter)]; ok {
		var sh struct {
			Position  *float64 `json:"Position"`
			Direction *int     `json:"Direction"`
		}
		if err := json.Unmarshal(v, &sh); err == nil {
			if sh.Position != nil && *sh.Position >= 0 && *sh.Position <= 100 {
				st["position"] = int64(math.Round(*sh.Position))
			}
			if sh.Direction != nil {
				st["moving"] = *sh.Direction != 0
			}
		}
	}
	return st, false, nil
}

// Command sends one Tasmota command per key: Power, then Dimmer and CT
// (Tasmota applies them in the order they arrive); powering off goes
// alone. A shutter gets ShutterPosition<n>.
func (p *Protocol) Command(device string, want map[string]any, _ string) ([]adapter.Message, error) {
	d := p.byID[device]
	if d == nil {
		return nil, fmt.Errorf("tasmota: device %s is not one of this adapter's", device)
	}
	cmd := func(name, value string) adapter.Message {
		return adapter.Message{Topic: p.s.Topic(p.s.Prefixes[0], d.topic, name), Payload: []byte(value)}
	}
	var out []adapter.Message
	for k := range want {
		if !slices.Contains(Keys, k) {
			return nil, fmt.Errorf("%s: %w", k, adapter.ErrUnsupported)
		}
	}
	if v, ok := want["power"]; ok {
		switch v {
		case "on":
			out = append(out, cmd(d.powerName(), "ON"))
		case "off":
			return []adapter.Message{cmd(d.powerName(), "OFF")}, nil
		default:
			return nil, fmt.Errorf("power: %v is not on or off", v)
		}
	}
	if v, ok := want["brightness"]; ok {
		f, ok := adapter.Number(v)
		if !ok || f < 0 || f > 100 {
			return nil, fmt.Errorf("brightness: %v is not 0..100", v)
		}
		out = append(out, cmd("Dimmer", strconv.Itoa(int(math.Round(f)))))
	}
	if v, ok := want["color_temp"]; ok {
		f, ok := adapter.Number(v)
		if !ok || f < 2000 || f > 6536 {
			return nil, fmt.Errorf("color_temp: %v is not a kelvin value Tasmota takes (2000..6536: CT 153..500)", v)
		}
		out = append(out, cmd("CT", strconv.Itoa(int(math.Round(1e6/f)))))
	}
	if v, ok := want["position"]; ok {
		f, ok := adapter.Number(v)
		if !ok || f < 0 || f > 100 {
			return nil, fmt.Errorf("position: %v is not 0..100", v)
		}
		out = append(out, cmd("ShutterPosition"+strconv.Itoa(max(d.shutter, 1)), strconv.Itoa(int(math.Round(f)))))
	}
	return out, nil
}

// Probe queries the device: State (power, dimmer, CT: its answer is
// the STATE object on RESULT), or for a shutter Status 10, whose
// StatusSNS holds Shutter<n>'s position and direction. (A shutter's
// ShutterPosition echo is its target, never its position.)
func (p *Protocol) Probe(device string, _ string) []adapter.Message {
	d := p.byID[device]
	if d == nil {
		return nil
	}
	if d.shutter > 0 {
		return []adapter.Message{{Topic: p.s.Topic(p.s.Prefixes[0], d.topic, "Status"), Payload: []byte("10")}}
	}
	return []adapter.Message{{Topic: p.s.Topic(p.s.Prefixes[0], d.topic, "State")}}
}

// DiscoveryFilter is where Tasmota's own discovery publishes each
// device's config (retained; SetOption19 0, the default).
const DiscoveryFilter = "tasmota/discovery/+/config"

// DecodeDiscovery reads a tasmota/discovery/<MAC>/config message: the
// device's topic, name and relays (rl: 1 relay, 2 light, 3 shutter),
// one device a relay or light, one a shutter pair. Devices whose
// FullTopic or prefixes are not the defaults are found with a note in
// Model: the registry needs [protocols.tasmota] for them.
func DecodeDiscovery(payload []byte) ([]adapter.Found, error) {
	if len(payload) > MaxPayload {
		return nil, fmt.Errorf("tasmota discovery: %d bytes (max %d)", len(payload), MaxPayload)
	}
	var c struct {
		Topic     string   `json:"t"`
		FullTopic string   `json:"ft"`
		Prefixes  []string `json:"tp"`
		Device    string   `json:"dn"`
		Model     string   `json:"md"`
		Relays    []int    `json:"rl"`
		LightType int      `json:"lt_st"`
	}
	if err := json.Unmarshal(payload, &c); err != nil {
		return nil, fmt.Errorf("tasmota discovery: %w", err)
	}
	if _, _, err := parseAddress(c.Topic); err != nil {
		return nil, fmt.Errorf("tasmota discovery: topic: %w", err)
	}
	model := c.Model
	if c.FullTopic != "" && c.FullTopic != DefaultFullTopic || len(c.Prefixes) == 3 && (c.Prefixes[0] != "cmnd" || c.Prefixes[1] != "stat" || c.Prefixes[2] != "tele") {
		model = strings.TrimSpace(model + fmt.Sprintf(" (FullTopic %q, prefixes %q: set [protocols.tasmota])", c.FullTopic, c.Prefixes))
	}
	relays, shutters := 0, 0
	var out []adapter.Found
	for _, r := range c.Relays {
		switch r {
		case 1, 2:
			relays++
		case 3:
			shutters++
		}
	}
	for i, r := range c.Relays {
		if r != 1 && r != 2 {
			continue
		}
		n := i + 1 // POWER<n> is the relay's place in rl
		addr, name := c.Topic, c.Device
		if relays > 1 {
			addr, name = fmt.Sprintf("%s:%d", c.Topic, n), fmt.Sprintf("%s %d", c.Device, n)
		}
		f := adapter.Found{Protocol: Name, Address: addr, Name: name, Model: model, Kind: "relay", Keys: []string{"power"}}
		if r == 2 {
			f.Kind, f.Keys = "light", []string{"power", "brightness"}
			if c.LightType >= 2 { // a CT or RGBCCT light
				f.Keys = append(f.Keys, "color_temp")
			}
		}
		out = append(out, f)
	}
	for i := range shutters / 2 {
		addr := c.Topic
		if shutters > 2 {
			addr = fmt.Sprintf("%s:%d", c.Topic, i+1)
		}
		out = append(out, adapter.Found{Protocol: Name, Address: addr, Name: c.Device, Model: model, Kind: "curtain", Keys: []string{"position"}})
	}
	return out, nil
}
