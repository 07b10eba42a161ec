// Package shelly speaks the RPC over MQTT of Shelly's Gen2 and later
// devices (Plus, Pro, Gen3, Gen4) for the devices of a Sortie registry
// that name protocol "shelly": relays (Switch), dimmers (Light) and
// covers (Cover).
//
// What counts as success: the only ecosystem here with a real reply.
// Sortie sends a JSON-RPC request on <prefix>/rpc with an "id" and its
// own "src"; the device answers on <src>/rpc with the same id and a
// "result" (Switch.Set's carries "was_on", the state before: it is what
// an undo restores). A cover's reply only says it started: it is
// confirmed when its status shows it stopped at the target.
//
// What counts as failure: the reply's "error": its code is classified
// (-103 invalid argument, -105 not found, -109 failed precondition such
// as an uncalibrated cover, 401 authentication: the step fails at once;
// -104 deadline exceeded, -108 resource exhausted, -114 unavailable and
// codes not documented: retried, which absolute commands make safe).
//
// How offline is seen: <prefix>/online "false", the device's will. The
// will is not retained (captures in ioBroker.shelly), so a restarted
// agent cannot know from the broker: it sends each device a
// Shelly.GetStatus when it connects, and a device that does not answer
// within ProbeTimeout is offline until it speaks again.
//
// Commands are Switch.Set, Light.Set and Cover.GoToPosition, never
// Toggle (a toggle repeated by a QoS 2 redelivery or a retry switches
// back: ioBroker.shelly #1117), at QoS 1, never retained.
package shelly

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sortie-edge/sortie/devices/adapter"
)

// Name is the registry's protocol name for this package.
const Name = "shelly"

// Keys are the keys of the common vocabulary this package translates.
var Keys = []string{"power", "brightness", "position"}

// MaxPayload bounds what Decode reads: a full Shelly.GetStatus of a
// Pro 4PM is a few kilobytes.
const MaxPayload = 32 << 10

// ProbeTimeout is how long a device has to answer the Shelly.GetStatus
// sent when the agent connects before it counts as offline.
const ProbeTimeout = 5 * time.Second

// maxPending bounds the requests whose replies are awaited; older ones
// are forgotten (their replies are then ignored, and the step times out
// and retries).
const maxPending = 4096

// Settings are a registry's [protocols.shelly] table.
type Settings struct {
	// Src is the "src" of Sortie's requests: the device replies on
	// <Src>/rpc. It must be unique among the clients of the broker
	// that talk to these devices; default "sortie".
	Src string
	// ProbeTimeout is how long a device has to answer the probe sent
	// when the agent connects; default ProbeTimeout.
	ProbeTimeout time.Duration
}

// ParseSettings reads the registry's table; unknown keys are errors.
func ParseSettings(m map[string]any) (Settings, error) {
	s := Settings{Src: "sortie", ProbeTimeout: ProbeTimeout}
	for k, v := range m {
		switch k {
		case "src":
			x, ok := v.(string)
			if !ok || x == "" || strings.ContainsAny(x, "+#") || strings.HasPrefix(x, "/") || strings.HasSuffix(x, "/") {
				return s, fmt.Errorf("src: %v is not a topic prefix (no wildcards, no leading or trailing '/')", v)
			}
			s.Src = x
		case "probe_timeout":
			x, _ := v.(string)
			d, err := time.ParseDuration(x)
			if err != nil || d <= 0 || d > time.Minute {
				return s, fmt.Errorf("probe_timeout: %v is not a duration up to 1m", v)
			}
			s.ProbeTimeout = d
		default:
			return s, fmt.Errorf("unknown key %s (shelly takes src, probe_timeout)", k)
		}
	}
	return s, nil
}

// Protocol is the adapter for a set of Shelly devices.
type Protocol struct {
	s        Settings
	byID     map[string]*device
	byPrefix map[string][]*device
	order    []*device
	// pending maps a request's id to its device, oldest first in ring.
	pending map[string]pendingReq
	// srcOf is each prefix's device ID, as its notifications (on its own
	// topics, which only it may publish) name it: a reply must come from
	// it, not from another device that can publish on Sortie's src.
	srcOf map[string]string
	ring  []string
	next  int
}

type pendingReq struct {
	dev   *device
	probe bool
}

type device struct {
	id, prefix string
	comp       string // "switch", "light" or "cover"
	n          int    // the component's id
	keys       []string
}

func (d *device) key() string { return d.comp + ":" + strconv.Itoa(d.n) }

// New makes the adapter for devs. A device's Address is its MQTT topic
// prefix (by default its device ID, shellyplus1-4855199bc0e8), with
// ":N" for its component N on a device that has several.
func New(s Settings, devs []adapter.Device) (*Protocol, error) {
	p := &Protocol{s: s, byID: make(map[string]*device), byPrefix: make(map[string][]*device),
		pending: make(map[string]pendingReq), ring: make([]string, maxPending), srcOf: make(map[string]string)}
	seen := make(map[string]bool)
	for _, d := range devs {
		prefix, n := d.Address, 0
		if i := strings.LastIndexByte(d.Address, ':'); i >= 0 {
			v, err := strconv.Atoi(d.Address[i+1:])
			if err != nil || v < 0 || v > 15 {
				return nil, fmt.Errorf("device %s: address %q: after ':' comes a component id 0..15", d.ID, d.Address)
			}
			prefix, n = d.Address[:i], v
		}
		if prefix == "" || strings.ContainsAny(prefix, "+#\x00") || strings.HasPrefix(prefix, "/") || strings.HasSuffix(prefix, "/") || prefix == s.Src {
			return nil, fmt.Errorf("device %s: address %q is not a Shelly topic prefix (or it is the src)", d.ID, d.Address)
		}
		if seen[d.Address] {
			return nil, fmt.Errorf("device %s: address %q: another device has it", d.ID, d.Address)
		}
		seen[d.Address] = true
		x := &device{id: d.ID, prefix: prefix, n: n, keys: d.Keys, comp: "switch"}
		for _, k := range d.Keys {
			if !slices.Contains(Keys, k) {
				return nil, fmt.Errorf("device %s: state key %q: %w (shelly translates %s)", d.ID, k, adapter.ErrUnsupported, strings.Join(Keys, ", "))
			}
		}
		switch {
		case slices.Contains(d.Keys, "position"):
			x.comp = "cover"
		case slices.Contains(d.Keys, "brightness"):
			x.comp = "light"
		}
		p.byID[d.ID] = x
		p.byPrefix[prefix] = append(p.byPrefix[prefix], x)
		p.order = append(p.order, x)
	}
	return p, nil
}

// Filters are the replies to Sortie's src, and each device's will,
// notifications and status topics.
func (p *Protocol) Filters() []string {
	f := []string{p.s.Src + "/rpc"}
	for _, prefix := range slices.Sorted(mapKeys(p.byPrefix)) {
		f = append(f, prefix+"/online", prefix+"/events/rpc", prefix+"/status/+")
	}
	return f
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// Frame is a JSON-RPC frame of Shelly's, request, response or
// notification.
type Frame struct {
	ID     json.RawMessage `json:"id,omitempty"`
	Src    string          `json:"src,omitempty"`
	Dst    string          `json:"dst,omitempty"`
	Method string          `json:"method,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  *RPCError       `json:"error,omitempty"`
}

// RPCError is a response's error.
type RPCError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// Decode reads one message.
func (p *Protocol) Decode(m adapter.Message) ([]adapter.Report, error) {
	if len(m.Payload) > MaxPayload {
		return nil, fmt.Errorf("shelly: %s: payload of %d bytes (max %d)", m.Topic, len(m.Payload), MaxPayload)
	}
	if m.Topic == p.s.Src+"/rpc" {
		return p.reply(m.Payload)
	}
	for prefix, devs := range p.byPrefix {
		rest, ok := strings.CutPrefix(m.Topic, prefix+"/")
		if !ok {
			continue
		}
		switch {
		case rest == "online":
			var a adapter.Availability
			switch string(m.Payload) {
			case "true":
				a = adapter.Online
			case "false":
				a = adapter.Offline
			case "":
				return nil, nil
			default:
				return nil, fmt.Errorf("shelly: %s: %.32q is neither true nor false", m.Topic, m.Payload)
			}
			out := make([]adapter.Report, 0, len(devs))
			for _, d := range devs {
				out = append(out, adapter.Report{Device: d.id, Availability: a})
			}
			return out, nil
		case rest == "events/rpc":
			var f Frame
			if err := json.Unmarshal(m.Payload, &f); err != nil {
				return nil, fmt.Errorf("shelly: %s: %w", m.Topic, err)
			}
			if f.Src != "" && len(f.Src) <= 128 {
				p.srcOf[prefix] = f.Src
			}
			if f.Method != "NotifyStatus" && f.Method != "NotifyFullStatus" {
				return nil, nil
			}
			return statusReports(devs, f.Params)
		case strings.HasPrefix(rest, "status/"):
			comp := strings.TrimPrefix(rest, "status/")
			for _, d := range devs {
				if d.key() == comp {
					st, err := DecodeStatus(d.comp, m.Payload)
					if err != nil {
						return nil, fmt.Errorf("shelly: %s: %w", m.Topic, err)
					}
					if len(st) == 0 {
						st = nil
					}
					// A device that reports is there.
					return []adapter.Report{{Device: d.id, State: st, Availability: adapter.Online}}, nil
				}
			}
			return nil, nil
		}
	}
	return nil, nil
}

// statusReports reads the components of a NotifyStatus or a
// Shelly.GetStatus result ({"switch:0":{...},...}).
func statusReports(devs []*device, params json.RawMessage) ([]adapter.Report, error) {
	var comps map[string]json.RawMessage
	if err := json.Unmarshal(params, &comps); err != nil {
		return nil, fmt.Errorf("shelly: status: %w", err)
	}
	var out []adapter.Report
	for _, d := range devs {
		raw, ok := comps[d.key()]
		if !ok {
			continue
		}
		st, err := DecodeStatus(d.comp, raw)
		if err != nil {
			return nil, fmt.Errorf("shelly: %s: %w", d.key(), err)
		}
		if len(st) > 0 {
			out = append(out, adapter.Report{Device: d.id, State: st, Availability: adapter.Online})
		}
	}
	return out, nil
}

// DecodeStatus translates a component's status (whole, or the changed
// fields a NotifyStatus carries) into the common vocabulary.
func DecodeStatus(comp string, raw []byte) (map[string]any, error) {
	var s struct {
		Output     *bool    `json:"output"`
		Brightness *float64 `json:"brightness"`
		State      *string  `json:"state"`
		CurrentPos *float64 `json:"current_pos"`
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, err
	}
	st := make(map[string]any, 2)
	if s.Output != nil && comp != "cover" {
		st["power"] = map[bool]string{true: "on", false: "off"}[*s.Output]
	}
	if s.Brightness != nil && comp == "light" && *s.Brightness >= 0 && *s.Brightness <= 100 {
		st["brightness"] = int64(math.Round(*s.Brightness))
	}
	if comp == "cover" {
		if s.CurrentPos != nil && *s.CurrentPos >= 0 && *s.CurrentPos <= 100 {
			st["position"] = int64(math.Round(*s.CurrentPos))
		}
		if s.State != nil {
			st["moving"] = *s.State == "opening" || *s.State == "closing" || *s.State == "calibrating"
		}
	}
	return st, nil
}

// reply reads a response on Sortie's src topic.
func (p *Protocol) reply(payload []byte) ([]adapter.Report, error) {
	var f Frame
	if err := json.Unmarshal(payload, &f); err != nil {
		return nil, fmt.Errorf("shelly: reply: %w", err)
	}
	var id string
	if err := json.Unmarshal(f.ID, &id); err != nil {
		return nil, nil // not one of ours: Sortie's ids are strings
	}
	req, ok := p.pending[id]
	if !ok {
		return nil, nil // forgotten, or another client's with our src
	}
	d := req.dev
	if want := cmp.Or(p.srcOf[d.prefix], d.prefix); f.Src != want {
		return nil, nil // not from the device asked: ignored, and still awaited
	}
	delete(p.pending, id)
	if req.probe {
		// Shelly.GetStatus: the device is there, and says its state.
		if f.Error != nil {
			return []adapter.Report{{Device: d.id, Availability: adapter.Online}}, nil
		}
		reps, err := statusReports([]*device{d}, f.Result)
		if err != nil {
			return nil, err
		}
		if len(reps) == 0 {
			reps = []adapter.Report{{Device: d.id}}
		}
		reps[0].Availability = adapter.Online
		return reps, nil
	}
	rep := adapter.Report{Device: d.id, Availability: adapter.Online}
	if f.Error != nil {
		rep.Reply = &adapter.Reply{ID: id, Failure: &adapter.Failure{Code: Classify(f.Error.Code), Message: fmt.Sprintf("%s (Shelly error %d)", f.Error.Message, f.Error.Code)}}
		return []adapter.Report{rep}, nil
	}
	if d.comp == "cover" {
		return []adapter.Report{rep}, nil // started: its status will say when it stops
	}
	var res struct {
		WasOn *bool `json:"was_on"`
	}
	_ = json.Unmarshal(f.Result, &res) // a result of another shape carries no prior state
	rep.Reply = &adapter.Reply{ID: id}
	if res.WasOn != nil {
		rep.Reply.Prior = map[string]any{"power": map[bool]string{true: "on", false: "off"}[*res.WasOn]}
	}
	return []adapter.Report{rep}, nil
}

// Classify maps a Shelly RPC error code to a devices/wire code.
func Classify(code int) string {
	switch code {
	case -103:
		return "invalid_param"
	case -105, -109, 401, 404:
		return "unsupported"
	case -108, -114:
		return "busy"
	}
	return "internal" // -104 and codes not documented: an absolute command is safe to retry
}

// Command is one request: Switch.Set, Light.Set or Cover.GoToPosition,
// with id as its "id".
func (p *Protocol) Command(device string, want map[string]any, id string) ([]adapter.Message, error) {
	d := p.byID[device]
	if d == nil {
		return nil, fmt.Errorf("shelly: device %s is not one of this adapter's", device)
	}
	params := map[string]any{"id": d.n}
	var method string
	for k := range want {
		if !slices.Contains(d.keys, k) {
			return nil, fmt.Errorf("%s: %w", k, adapter.ErrUnsupported)
		}
	}
	switch d.comp {
	case "cover":
		pos, ok := adapter.Number(want["position"])
		if !ok || pos < 0 || pos > 100 {
			return nil, fmt.Errorf("position: %v is not 0..100", want["position"])
		}
		method, params["pos"] = "Cover.GoToPosition", int(math.Round(pos))
	default:
		method = "Switch.Set"
		if d.comp == "light" {
			method = "Light.Set"
		}
		if v, ok := want["power"]; ok {
			if v != "on" && v != "off" {
				return nil, fmt.Errorf("power: %v is not on or off", v)
			}
			params["on"] = v == "on"
		}
		if v, ok := want["brightness"]; ok {
			b, ok := adapter.Number(v)
			if !ok || b < 0 || b > 100 {
				return nil, fmt.Errorf("brightness: %v is not 0..100", v)
			}
			params["brightness"] = int(math.Round(b))
		}
		if _, ok := params["on"]; !ok && method == "Switch.Set" {
			return nil, errors.New("power: a switch is only switched")
		}
	}
	return p.request(d, id, method, params, false)
}

func (p *Protocol) request(d *device, id, method string, params map[string]any, probe bool) ([]adapter.Message, error) {
	payload, err := json.Marshal(map[string]any{"id": id, "src": p.s.Src, "method": method, "params": params})
	if err != nil {
		return nil, err
	}
	if old := p.ring[p.next]; old != "" {
		delete(p.pending, old)
	}
	p.ring[p.next] = id
	p.next = (p.next + 1) % len(p.ring)
	p.pending[id] = pendingReq{dev: d, probe: probe}
	return []adapter.Message{{Topic: d.prefix + "/rpc", Payload: payload}}, nil
}

// Probe asks for the device's status with Shelly.GetStatus; its answer
// also says the device is online.
func (p *Protocol) Probe(device string, id string) []adapter.Message {
	d := p.byID[device]
	if d == nil {
		return nil
	}
	m, err := p.request(d, id, "Shelly.GetStatus", map[string]any{}, true)
	if err != nil {
		return nil
	}
	return m
}

// ProbeOnConnect says the devices must be probed when the agent
// connects: their will is not retained (see adapter.Prober).
func (p *Protocol) ProbeOnConnect() time.Duration {
	if p.s.ProbeTimeout <= 0 {
		return ProbeTimeout
	}
	return p.s.ProbeTimeout
}

// DiscoveryFilters catch Shelly devices that announce themselves while
// discovery listens: their online message and notifications, under a
// one-level topic prefix (the default, the device's ID).
var DiscoveryFilters = []string{"+/online", "+/events/rpc"}

// StatusRequest is a Shelly.GetStatus request with id, answered on
// <src>/rpc: discovery asks each candidate for its components.
func StatusRequest(src, id string) []byte {
	b, _ := json.Marshal(map[string]any{"id": id, "src": src, "method": "Shelly.GetStatus"}) // strings always encode
	return b
}

// DecodeComponents reads the reply to StatusRequest from the device at
// prefix: one Found per switch, light and cover component.
func DecodeComponents(prefix string, reply []byte) ([]adapter.Found, error) {
	var f Frame
	if err := json.Unmarshal(reply, &f); err != nil {
		return nil, fmt.Errorf("shelly status: %w", err)
	}
	if f.Error != nil || len(f.Result) == 0 {
		return nil, nil
	}
	var comps map[string]json.RawMessage
	if err := json.Unmarshal(f.Result, &comps); err != nil {
		return nil, fmt.Errorf("shelly status: %w", err)
	}
	var out []adapter.Found
	for _, key := range slices.Sorted(mapKeys(comps)) {
		kind, n, ok := strings.Cut(key, ":")
		if !ok {
			continue
		}
		id, err := strconv.Atoi(n)
		if err != nil || id < 0 || id > 15 {
			continue
		}
		found := adapter.Found{Protocol: Name, Address: prefix, Name: f.Src, Model: "Shelly " + kind}
		if id > 0 || slices.ContainsFunc(slices.Collect(mapKeys(comps)), func(k string) bool { return strings.HasPrefix(k, kind+":") && k != key }) {
			found.Address = fmt.Sprintf("%s:%d", prefix, id)
			found.Name = fmt.Sprintf("%s %s", f.Src, key)
		}
		switch kind {
		case "switch":
			found.Kind, found.Keys = "relay", []string{"power"}
		case "light":
			found.Kind, found.Keys = "light", []string{"power", "brightness"}
		case "cover":
			found.Kind, found.Keys = "curtain", []string{"position"}
		default:
			continue
		}
		out = append(out, found)
	}
	return out, nil
}
