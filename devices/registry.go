package devices

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/sortie-edge/sortie/devices/wire"
	"github.com/sortie-edge/sortie/driver"
)

// ParamType is the type of an action parameter.
type ParamType string

// Parameter types. Numbers may arrive as any Go number kind or as
// json.Number; "int" also accepts integral floats, because JSON that went
// through a map[string]any comes back as float64.
const (
	TypeInt    ParamType = "int"
	TypeNumber ParamType = "number"
	TypeBool   ParamType = "bool"
	TypeString ParamType = "string"
	TypeEnum   ParamType = "enum"
)

// DefaultMaxLen bounds string parameters that set no max_len, so no
// command carries an unbounded string to a device.
const DefaultMaxLen = 256

// SetAction is the action every device type must have. Its parameters
// are the type's settable state keys, which is how a compensation
// restores a device's previous state.
const SetAction = "set"

// Param describes one action parameter.
type Param struct {
	Type        ParamType `toml:"type"`
	Description string    `toml:"description"`
	Required    bool      `toml:"required"`
	// Min and Max bound int and number parameters (inclusive).
	Min *float64 `toml:"min"`
	Max *float64 `toml:"max"`
	// Values lists the allowed strings of an enum.
	Values []string `toml:"values"`
	// MaxLen bounds a string's length in bytes; zero means DefaultMaxLen.
	MaxLen int `toml:"max_len"`
	// Secret keeps the value out of what the gateway shows and sends
	// beyond the command itself (Shown): a lock's code as an int.
	Secret bool `toml:"secret"`
	// Show lets a string's value be shown (a playlist's name, a scene
	// label): strings are hidden unless the registry says so, since a
	// string can be anything.
	Show bool `toml:"show"`
}

// Action describes one command a device type accepts.
type Action struct {
	Description string            `toml:"description"`
	Params      map[string]*Param `toml:"params"`
	// Expect is the state the action leads to, beyond its parameters that
	// name state keys (e.g. turn_on leads to power = "on"). Verification
	// waits for it.
	Expect map[string]any `toml:"expect"`
}

// DeviceType describes a kind of device and the actions it accepts.
type DeviceType struct {
	Description string             `toml:"description"`
	Actions     map[string]*Action `toml:"actions"`
	// MaxInFlight is how many commands a device of the type takes at
	// once; zero means 1: further commands wait their turn (priority,
	// then age) without holding anything.
	MaxInFlight int `toml:"max_in_flight"`
}

// Device is one device of the home.
type Device struct {
	ID   string `toml:"id"`
	Type string `toml:"type"`
	Name string `toml:"name"`
	Room string `toml:"room"`
	// Link names the shared link (a Zigbee coordinator, a Wi-Fi bridge,
	// an IR blaster) the device's commands go through, if any.
	Link string `toml:"link"`
	// MaxInFlight overrides the type's.
	MaxInFlight int `toml:"max_in_flight"`
	// Protocol is the dialect the device speaks: ProtocolSortie (the
	// default, docs/protocol.md) or an ecosystem's (docs/devices.md).
	Protocol string `toml:"protocol"`
	// Address is the device's name in its ecosystem (a Zigbee2MQTT
	// friendly name, ...); required with any protocol but Sortie's.
	Address string `toml:"address"`
	// Config is the device's description in its ecosystem's own terms,
	// for ecosystems that describe each device apart: a Home Assistant
	// MQTT discovery config (protocol "homeassistant").
	Config map[string]any `toml:"config"`
}

// Link is a shared path to several devices that takes only so much at
// once: commands through it are admitted by priority, then age, across
// missions, within its limits.
type Link struct {
	Description string `toml:"description"`
	// MaxInFlight caps the commands in flight through the link; zero
	// means no cap.
	MaxInFlight int `toml:"max_in_flight"`
	// Rate caps commands per second through the link, with bursts of up
	// to Burst (default 1); zero means no rate limit. After the link or
	// its devices come back, waiting commands drain at this rate rather
	// than as a flood.
	Rate  float64 `toml:"rate"`
	Burst int     `toml:"burst"`
}

// Registry is the catalogue of device types and devices, loaded from TOML
// and validated. It is read-only after loading and safe for concurrent
// use; callers must not modify what its methods return.
type Registry struct {
	Types   map[string]*DeviceType `toml:"types"`
	Devices []Device               `toml:"devices"`
	Links   map[string]*Link       `toml:"links"`
	// Protocols holds each ecosystem's settings, by protocol name
	// ([protocols.zigbee2mqtt] base_topic = ...).
	Protocols map[string]map[string]any `toml:"protocols"`

	source string
	byID   map[string]int
}

// LoadRegistry reads and validates a registry file.
func LoadRegistry(path string) (*Registry, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load registry: %w", err)
	}
	return ParseRegistry(data, path)
}

// ErrRegistry is wrapped by every registry loading error.
var ErrRegistry = errors.New("invalid device registry")

// ParseRegistry decodes and validates registry TOML. name (usually the
// file path) starts every error message. Unknown keys are errors, so a
// typo cannot silently drop a limit.
func ParseRegistry(data []byte, name string) (*Registry, error) {
	if len(data) > 1<<20 {
		return nil, fmt.Errorf("%w: %s: file is %d bytes (max 1 MiB)", ErrRegistry, name, len(data))
	}
	r := new(Registry)
	md, err := toml.Decode(string(data), r)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrRegistry, name, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return nil, fmt.Errorf("%w: %s: unknown key %s", ErrRegistry, name, strings.Join(keys, ", "))
	}
	r.source = name
	if err := r.validate(); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrRegistry, name, err)
	}
	return r, nil
}

// validName keeps type, action and param names printable and topic-safe.
func validName(s string) error {
	if s == "" {
		return errors.New("empty name")
	}
	if len(s) > 64 {
		return fmt.Errorf("name %.16q... is longer than 64 bytes", s)
	}
	for _, c := range s {
		if !nameChar(c) {
			return fmt.Errorf("name %q: use letters, digits, '_' and '-'", s)
		}
	}
	return nil
}

// nameChar reports whether c may appear in a name (see validName).
func nameChar(c rune) bool {
	return c == '_' || c == '-' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

func (r *Registry) validate() error {
	if len(r.Types) == 0 {
		return errors.New("types: no device types")
	}
	for _, tn := range sortedKeys(r.Types) {
		t := r.Types[tn]
		if err := validName(tn); err != nil {
			return fmt.Errorf("type %q: %w", tn, err)
		}
		if t == nil || len(t.Actions) == 0 {
			return fmt.Errorf("type %q: actions: none defined", tn)
		}
		set := t.Actions[SetAction]
		if set == nil {
			return fmt.Errorf("type %q: actions: no %q action (needed to restore previous state)", tn, SetAction)
		}
		for _, an := range sortedKeys(t.Actions) {
			a := t.Actions[an]
			if err := validName(an); err != nil {
				return fmt.Errorf("type %q: action %q: %w", tn, an, err)
			}
			if a == nil {
				return fmt.Errorf("type %q: action %q: empty", tn, an)
			}
			for _, pn := range sortedKeys(a.Params) {
				if err := validName(pn); err != nil {
					return fmt.Errorf("type %q: action %q: param %q: %w", tn, an, pn, err)
				}
				if err := a.Params[pn].validate(); err != nil {
					return fmt.Errorf("type %q: action %q: param %q: %w", tn, an, pn, err)
				}
			}
			for _, k := range sortedKeys(a.Expect) {
				p := set.Params[k]
				if p == nil {
					return fmt.Errorf("type %q: action %q: expect.%s: not a param of the %q action", tn, an, k, SetAction)
				}
				if err := p.check(a.Expect[k]); err != nil {
					return fmt.Errorf("type %q: action %q: expect.%s: %w", tn, an, k, err)
				}
			}
		}
	}
	for _, ln := range sortedKeys(r.Links) {
		l := r.Links[ln]
		if err := validName(ln); err != nil {
			return fmt.Errorf("link %q: %w", ln, err)
		}
		switch {
		case l == nil:
			return fmt.Errorf("link %q: empty", ln)
		case l.MaxInFlight < 0 || l.MaxInFlight > 10000:
			return fmt.Errorf("link %q: max_in_flight: %d is not between 0 (no cap) and 10000", ln, l.MaxInFlight)
		case l.Rate < 0 || l.Rate > 1e6 || math.IsNaN(l.Rate):
			return fmt.Errorf("link %q: rate: %v is not between 0 (no limit) and 1e6 commands a second", ln, l.Rate)
		case l.Burst < 0 || l.Burst > 10000:
			return fmt.Errorf("link %q: burst: %d is not between 0 and 10000", ln, l.Burst)
		}
	}
	for _, tn := range sortedKeys(r.Types) {
		if n := r.Types[tn].MaxInFlight; n < 0 || n > 10000 {
			return fmt.Errorf("type %q: max_in_flight: %d is not between 0 (one) and 10000", tn, n)
		}
	}
	r.byID = make(map[string]int, len(r.Devices))
	for i, d := range r.Devices {
		where := fmt.Sprintf("devices[%d]", i)
		if d.ID != "" {
			where = fmt.Sprintf("device %q", d.ID)
		}
		if err := wire.ValidateDeviceID(d.ID); err != nil {
			return fmt.Errorf("%s: id: %w", where, err)
		}
		if _, dup := r.byID[d.ID]; dup {
			return fmt.Errorf("%s: id: duplicate", where)
		}
		if d.Type == "" {
			return fmt.Errorf("%s: type: missing", where)
		}
		if r.Types[d.Type] == nil {
			return fmt.Errorf("%s: type: unknown device type %q", where, d.Type)
		}
		if len(d.Name) > 128 || len(d.Room) > 128 {
			return fmt.Errorf("%s: name or room longer than 128 bytes", where)
		}
		if d.Link != "" && r.Links[d.Link] == nil {
			return fmt.Errorf("%s: link: unknown link %q (declare it under [links.%s])", where, d.Link, d.Link)
		}
		if d.MaxInFlight < 0 || d.MaxInFlight > 10000 {
			return fmt.Errorf("%s: max_in_flight: %d is not between 0 (the type's) and 10000", where, d.MaxInFlight)
		}
		if err := r.checkProtocol(d, where); err != nil {
			return err
		}
		r.byID[d.ID] = i
	}
	return r.checkProtocols()
}

func (p *Param) validate() error {
	if p == nil {
		return errors.New("empty")
	}
	numeric := p.Type == TypeInt || p.Type == TypeNumber
	switch p.Type {
	case TypeInt, TypeNumber, TypeBool, TypeString, TypeEnum:
	case "":
		return errors.New("type: missing (int, number, bool, string or enum)")
	default:
		return fmt.Errorf("type: unknown %q (want int, number, bool, string or enum)", p.Type)
	}
	for _, b := range []struct {
		name string
		v    *float64
	}{{"min", p.Min}, {"max", p.Max}} {
		if b.v == nil {
			continue
		}
		if !numeric {
			return fmt.Errorf("%s: only int and number params have bounds", b.name)
		}
		if math.IsInf(*b.v, 0) || math.IsNaN(*b.v) {
			return fmt.Errorf("%s: must be finite", b.name)
		}
		if p.Type == TypeInt && !isIntegral(*b.v) {
			return fmt.Errorf("%s: %v is not an integer", b.name, *b.v)
		}
	}
	if p.Min != nil && p.Max != nil && *p.Min > *p.Max {
		return fmt.Errorf("min: %v is above max %v", *p.Min, *p.Max)
	}
	if p.Type == TypeEnum {
		if len(p.Values) == 0 {
			return errors.New("values: an enum needs at least one value")
		}
		seen := make(map[string]bool, len(p.Values))
		for _, v := range p.Values {
			if v == "" || seen[v] {
				return fmt.Errorf("values: %q is empty or repeated", v)
			}
			seen[v] = true
		}
	} else if len(p.Values) > 0 {
		return errors.New("values: only enum params have values")
	}
	if p.MaxLen < 0 {
		return errors.New("max_len: must not be negative")
	}
	if p.MaxLen > 0 && p.Type != TypeString {
		return errors.New("max_len: only string params have a length")
	}
	if p.Show && p.Type != TypeString {
		return errors.New("show: only a string param is hidden unless shown (the others show unless secret)")
	}
	if p.Show && p.Secret {
		return errors.New("show and secret: a param is one or the other")
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// CheckError says why a command was refused before publishing. Field is
// "device", "action" or the parameter's name. It is permanent: errors.Is
// (err, driver.ErrPermanent) holds, since no retry changes the command.
type CheckError struct {
	Device string
	Action string
	Field  string
	Reason string
}

func (e *CheckError) Error() string {
	switch e.Field {
	case "device":
		return fmt.Sprintf("device %q: %s", e.Device, e.Reason)
	case "action":
		return fmt.Sprintf("device %s: action %q: %s", e.Device, e.Action, e.Reason)
	}
	return fmt.Sprintf("device %s: action %s: %s: %s", e.Device, e.Action, e.Field, e.Reason)
}

// Unwrap makes errors.Is(err, ErrInvalidCommand) hold.
func (e *CheckError) Unwrap() error { return ErrInvalidCommand }

// Is makes errors.Is(err, driver.ErrPermanent) hold.
func (e *CheckError) Is(target error) bool { return target == driver.ErrPermanent }

// Code is the machine-readable reason, matching the device error codes
// where one applies.
func (e *CheckError) Code() string {
	switch e.Field {
	case "device":
		return "unknown_device"
	case "action":
		return wire.CodeUnknownAction
	}
	return wire.CodeInvalidParam
}

// Device returns the device with the given ID.
func (r *Registry) Device(id string) (Device, bool) {
	i, ok := r.byID[id]
	if !ok {
		return Device{}, false
	}
	return r.Devices[i], true
}

// Label names a device for people: its name, else its ID, with its room
// in parentheses when it has one ("Front door lock (hall)").
func (r *Registry) Label(id string) string {
	d, ok := r.Device(id)
	if !ok {
		return "device " + id
	}
	who := d.Name
	if who == "" {
		who = d.ID
	}
	if d.Room != "" {
		who += " (" + d.Room + ")"
	}
	return who
}

func (r *Registry) action(deviceID, action string) (*Action, error) {
	if err := wire.ValidateDeviceID(deviceID); err != nil {
		return nil, &CheckError{Device: deviceID, Action: action, Field: "device", Reason: err.Error()}
	}
	d, ok := r.Device(deviceID)
	if !ok {
		return nil, &CheckError{Device: deviceID, Action: action, Field: "device", Reason: "unknown device"}
	}
	a := r.Types[d.Type].Actions[action]
	if a == nil {
		return nil, &CheckError{Device: deviceID, Action: action, Field: "action",
			Reason: fmt.Sprintf("no such action for type %s (it has %s)", d.Type, strings.Join(sortedKeys(r.Types[d.Type].Actions), ", "))}
	}
	return a, nil
}

// Shown says whether a parameter's value may be shown in a step's name,
// which goes to the hub's store, dashboard and CSV: only values of a
// bounded kind (int, number, bool, enum) the registry does not mark
// secret, and strings it marks show. A string can be anything (a code,
// a URL with its token), and an unknown parameter is not shown either.
func (r *Registry) Shown(deviceID, action, param string) bool {
	a, err := r.action(deviceID, action)
	if err != nil {
		return false
	}
	p := a.Params[param]
	return p != nil && p.shown()
}

func (p *Param) shown() bool { return !p.Secret && (p.Type != TypeString || p.Show) }

// Masked returns a copy of state, a device's reported or expected state,
// with "***" for every value a step name would not show: a key that is
// a parameter of action or of the device's set action and is not Shown,
// and a key that is neither whose value is a string, an object or an
// array (free text a device reports: a track's title, the last code
// used); numbers, booleans and null stay. With the device or the action
// unknown to r, every value is hidden. A verify failure quotes both
// states into the step's error, which goes where step names go.
func (r *Registry) Masked(deviceID, action string, state map[string]any) map[string]any {
	if state == nil {
		return nil
	}
	var set *Action
	if d, ok := r.Device(deviceID); ok {
		set = r.Types[d.Type].Actions[SetAction]
	}
	a, err := r.action(deviceID, action)
	hidden := func(k string, v any) bool {
		if err != nil {
			return true
		}
		known := false
		for _, act := range []*Action{a, set} {
			if act == nil || act.Params[k] == nil {
				continue
			}
			if !act.Params[k].shown() {
				return true
			}
			known = true
		}
		switch v.(type) {
		case nil, bool, float64, float32, int, int64, int32, uint, uint64, uint32, json.Number:
			return false
		}
		return !known
	}
	out := make(map[string]any, len(state))
	for k, v := range state {
		if hidden(k, v) {
			v = "***"
		}
		out[k] = v
	}
	return out
}

// Check validates a command against the device's type before anything
// is published. The error is a *CheckError naming the bad field.
func (r *Registry) Check(deviceID, action string, params map[string]any) error {
	a, err := r.action(deviceID, action)
	if err != nil {
		return err
	}
	for _, name := range sortedKeys(params) {
		p := a.Params[name]
		if p == nil {
			return &CheckError{Device: deviceID, Action: action, Field: name, Reason: "unknown param"}
		}
		if err := p.check(params[name]); err != nil {
			return &CheckError{Device: deviceID, Action: action, Field: name, Reason: err.Error()}
		}
	}
	for _, name := range sortedKeys(a.Params) {
		if _, ok := params[name]; !ok && a.Params[name].Required {
			return &CheckError{Device: deviceID, Action: action, Field: name, Reason: "missing required param"}
		}
	}
	return nil
}

// check's errors go into a refused trigger's reason and a step's error,
// so they quote the value only where a step name would show it.
func (p *Param) check(v any) error {
	describe := describe
	if !p.shown() {
		describe = func(any) string { return "the value" }
	}
	switch p.Type {
	case TypeInt, TypeNumber:
		f, ok := asFloat(v)
		if !ok {
			return fmt.Errorf("%s is not a number", describe(v))
		}
		if math.IsInf(f, 0) || math.IsNaN(f) {
			return fmt.Errorf("%s is not finite", describe(v))
		}
		if p.Type == TypeInt && !isIntegral(f) {
			return fmt.Errorf("%s is not an integer", describe(v))
		}
		if p.Min != nil && f < *p.Min {
			return fmt.Errorf("%s is below min %v", describe(v), *p.Min)
		}
		if p.Max != nil && f > *p.Max {
			return fmt.Errorf("%s is above max %v", describe(v), *p.Max)
		}
	case TypeBool:
		if _, ok := v.(bool); !ok {
			return fmt.Errorf("%s is not a bool", describe(v))
		}
	case TypeString, TypeEnum:
		s, ok := v.(string)
		if !ok {
			return fmt.Errorf("%s is not a string", describe(v))
		}
		if p.Type == TypeEnum {
			if !slices.Contains(p.Values, s) {
				return fmt.Errorf("%s is not one of %s", describe(v), strings.Join(p.Values, ", "))
			}
			return nil
		}
		limit := p.MaxLen
		if limit == 0 {
			limit = DefaultMaxLen
		}
		if len(s) > limit {
			return fmt.Errorf("is %d bytes long (max %d)", len(s), limit)
		}
	}
	return nil
}

// describe renders a value for an error message, short and unambiguous.
func describe(v any) string {
	switch t := v.(type) {
	case string:
		if len(t) > 32 {
			return fmt.Sprintf("%q...", t[:32])
		}
		return fmt.Sprintf("%q", t)
	case nil:
		return "null"
	case map[string]any, []any:
		return fmt.Sprintf("a %T", v)
	}
	if f, ok := asFloat(v); ok {
		return fmt.Sprint(f)
	}
	return fmt.Sprintf("%v", v)
}

// Settable returns the state keys that the device's set action accepts,
// sorted.
func (r *Registry) Settable(deviceID string) []string {
	d, ok := r.Device(deviceID)
	if !ok {
		return nil
	}
	return sortedKeys(r.Types[d.Type].Actions[SetAction].Params)
}

// Expected returns the state a command should lead to: the action's
// expect table plus every parameter that names a settable state key. An
// empty result means there is nothing to verify. It assumes Check passed.
func (r *Registry) Expected(deviceID, action string, params map[string]any) map[string]any {
	a, err := r.action(deviceID, action)
	if err != nil {
		return nil
	}
	d, _ := r.Device(deviceID)
	set := r.Types[d.Type].Actions[SetAction]
	want := make(map[string]any, len(a.Expect)+len(params))
	for k, v := range a.Expect {
		want[k] = v
	}
	for k, v := range params {
		if set.Params[k] != nil {
			want[k] = v
		}
	}
	return want
}

// Limits says how many commands a device takes at once and which link,
// if any, its commands share ("" for none).
func (r *Registry) Limits(deviceID string) (maxInFlight int, link string) {
	d, ok := r.Device(deviceID)
	if !ok {
		return 1, ""
	}
	n := d.MaxInFlight
	if n == 0 {
		if t := r.Types[d.Type]; t != nil {
			n = t.MaxInFlight
		}
	}
	return max(n, 1), d.Link
}
