package devices_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
)

const homeFile = "../configs/devices.toml"

func loadHome(t testing.TB) *devices.Registry {
	t.Helper()
	r, err := devices.LoadRegistry(homeFile)
	if err != nil {
		t.Fatalf("LoadRegistry: %v", err)
	}
	return r
}

func TestShippedRegistry(t *testing.T) {
	r := loadHome(t)
	want := map[string]string{
		"living-light": "light", "kitchen-light": "light", "bedroom-light": "light",
		"living-ac": "ac", "living-speaker": "speaker", "front-door": "lock", "bedroom-curtain": "curtain",
	}
	if len(r.Devices) != len(want) {
		t.Errorf("%d devices, want %d", len(r.Devices), len(want))
	}
	for id, typ := range want {
		d, ok := r.Device(id)
		if !ok || d.Type != typ {
			t.Errorf("device %s = %+v (found %v), want type %s", id, d, ok, typ)
		}
	}
	// The catalogue the simulator implements: actions and settable keys.
	catalogue := map[string]struct {
		actions  []string
		settable []string
	}{
		"light":   {[]string{"set", "turn_off", "turn_on"}, []string{"brightness", "color_temp", "power"}},
		"ac":      {[]string{"set", "turn_off"}, []string{"fan", "mode", "power", "target"}},
		"speaker": {[]string{"pause", "play", "set"}, []string{"playlist", "status", "volume"}},
		"lock":    {[]string{"lock", "set", "unlock"}, []string{"locked"}},
		"curtain": {[]string{"close", "open", "set", "set_position"}, []string{"position"}},
	}
	for typ, c := range catalogue {
		dt := r.Types[typ]
		if dt == nil {
			t.Errorf("type %s missing", typ)
			continue
		}
		var got []string
		for a := range dt.Actions {
			got = append(got, a)
		}
		slices.Sort(got)
		if !slices.Equal(got, c.actions) {
			t.Errorf("type %s actions = %v, want %v", typ, got, c.actions)
		}
	}
	for id, typ := range want {
		if got := strings.Join(r.Settable(id), ","); got != strings.Join(catalogue[typ].settable, ",") {
			t.Errorf("Settable(%s) = %s, want %v", id, got, catalogue[typ].settable)
		}
	}
}

func TestCheck(t *testing.T) {
	r := loadHome(t)
	for _, tc := range []struct {
		name, device, action string
		params               map[string]any
		want                 string // "" = valid; else substring of the error
		field                string
	}{
		{"ok set", "living-ac", "set", map[string]any{"target": 22, "mode": "cool"}, "", ""},
		{"ok float int", "living-ac", "set", map[string]any{"target": 22.0}, "", ""},
		{"ok json number", "living-ac", "set", map[string]any{"target": json.Number("22")}, "", ""},
		{"ok no params", "living-light", "turn_off", nil, "", ""},
		{"above max", "living-ac", "set", map[string]any{"target": 35}, "target: 35 is above max 30", "target"},
		{"below min", "living-light", "turn_on", map[string]any{"brightness": 0}, "brightness: 0 is below min 1", "brightness"},
		{"not integer", "living-ac", "set", map[string]any{"target": 21.5}, "target: 21.5 is not an integer", "target"},
		{"wrong type", "living-ac", "set", map[string]any{"target": "22"}, `target: "22" is not a number`, "target"},
		{"enum", "living-ac", "set", map[string]any{"mode": "turbo"}, `mode: "turbo" is not one of cool, heat, dry, fan, auto`, "mode"},
		{"bool", "front-door", "set", map[string]any{"locked": "yes"}, `locked: "yes" is not a bool`, "locked"},
		{"string too long", "living-speaker", "play", map[string]any{"playlist": strings.Repeat("x", 65)}, "playlist: is 65 bytes long (max 64)", "playlist"},
		{"unknown param", "living-light", "turn_off", map[string]any{"brightness": 3}, "brightness: unknown param", "brightness"},
		{"required", "bedroom-curtain", "set_position", nil, "position: missing required param", "position"},
		{"unknown action", "front-door", "explode", nil, `action "explode": no such action for type lock`, "action"},
		{"unknown device", "garage", "open", nil, `device "garage": unknown device`, "device"},
		{"unsafe device", "a/+", "open", nil, "invalid device id", "device"},
		{"null", "living-ac", "set", map[string]any{"target": nil}, "target: null is not a number", "target"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := r.Check(tc.device, tc.action, tc.params)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
			var ce *devices.CheckError
			if !errors.As(err, &ce) || ce.Field != tc.field {
				t.Errorf("err = %#v, want *CheckError on field %s", err, tc.field)
			}
			if !errors.Is(err, driver.ErrPermanent) || !errors.Is(err, devices.ErrInvalidCommand) {
				t.Error("check error must be permanent and ErrInvalidCommand")
			}
			if class, _ := driver.Classify(err); class != driver.Permanent {
				t.Errorf("class = %v, want permanent", class)
			}
		})
	}
}

func TestExpected(t *testing.T) {
	r := loadHome(t)
	for _, tc := range []struct {
		device, action string
		params         map[string]any
		want           string
	}{
		{"living-light", "turn_on", map[string]any{"brightness": 40}, `{"brightness":40,"power":"on"}`},
		{"living-light", "turn_off", nil, `{"power":"off"}`},
		{"front-door", "unlock", nil, `{"locked":false}`},
		{"bedroom-curtain", "open", nil, `{"position":100}`},
		{"bedroom-curtain", "set_position", map[string]any{"position": 30}, `{"position":30}`},
		{"living-speaker", "play", map[string]any{"volume": 20}, `{"status":"playing","volume":20}`},
		{"living-ac", "set", map[string]any{"target": 21}, `{"target":21}`},
	} {
		b, _ := json.Marshal(r.Expected(tc.device, tc.action, tc.params))
		if string(b) != tc.want {
			t.Errorf("Expected(%s, %s) = %s, want %s", tc.device, tc.action, b, tc.want)
		}
	}
}

const minimalType = `
[types.lamp.actions.set]
params.power = { type = "enum", values = ["on", "off"] }
`

func TestRegistryErrors(t *testing.T) {
	for _, tc := range []struct {
		name, toml, want string
	}{
		{"syntax", `[types`, "home.toml: toml: line 1"},
		{"unknown key", minimalType + "[types.lamp.actions.set.params.level]\ntype = \"int\"\nmx = 3\n", "home.toml: unknown key types.lamp.actions.set.params.level.mx"},
		{"no types", ``, "home.toml: types: no device types"},
		{"no set", "[types.lamp.actions.on]\n", `home.toml: type "lamp": actions: no "set" action`},
		{"bad param type", minimalType + "params.level = { type = \"float\" }\n", `type "lamp": action "set": param "level": type: unknown "float"`},
		{"min above max", minimalType + "params.level = { type = \"int\", min = 5, max = 1 }\n", `param "level": min: 5 is above max 1`},
		{"bounds on enum", minimalType + "params.mode = { type = \"enum\", values = [\"a\"], min = 1 }\n", `param "mode": min: only int and number params have bounds`},
		{"empty enum", minimalType + "params.mode = { type = \"enum\" }\n", `param "mode": values: an enum needs at least one value`},
		{"show on an int", minimalType + "params.level = { type = \"int\", show = true }\n", `param "level": show: only a string param`},
		{"show and secret", minimalType + "params.label = { type = \"string\", show = true, secret = true }\n", `param "label": show and secret`},
		{"bad expect", minimalType + "[types.lamp.actions.on]\nexpect = { power = \"dim\" }\n", `action "on": expect.power: "dim" is not one of on, off`},
		{"expect unknown key", minimalType + "[types.lamp.actions.on]\nexpect = { level = 1 }\n", `action "on": expect.level: not a param of the "set" action`},
		{"device bad id", minimalType + "[[devices]]\nid = \"a/b\"\ntype = \"lamp\"\n", `home.toml: device "a/b": id: invalid device id`},
		{"device no id", minimalType + "[[devices]]\ntype = \"lamp\"\n", `home.toml: devices[0]: id: invalid device id: empty`},
		{"device dup", minimalType + "[[devices]]\nid = \"a\"\ntype = \"lamp\"\n[[devices]]\nid = \"a\"\ntype = \"lamp\"\n", `device "a": id: duplicate`},
		{"device unknown type", minimalType + "[[devices]]\nid = \"a\"\ntype = \"lump\"\n", `home.toml: device "a": type: unknown device type "lump"`},
		{"device unknown key", minimalType + "[[devices]]\nid = \"a\"\ntype = \"lamp\"\nflavour = 1\n", `unknown key devices.flavour`},
		{"bad type name", "[types.\"a b\".actions.set]\n", `type "a b": name "a b"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := devices.ParseRegistry([]byte(tc.toml), "home.toml")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
			if !errors.Is(err, devices.ErrRegistry) {
				t.Errorf("err does not wrap ErrRegistry")
			}
		})
	}
	if _, err := devices.LoadRegistry("testdata/missing.toml"); err == nil || !strings.Contains(err.Error(), "missing.toml") {
		t.Errorf("missing file: %v", err)
	}
}

// TestCheckAndMaskedQuoteNoHiddenValue: a refusal quotes the value only
// of a parameter a step name would show (int, number, bool, enum, not
// secret; a string marked show); Masked hides the others in a state
// quoted by a verify failure, whether the action's own parameter or the
// set action's, and a reported key that is no parameter when its value
// is free text (a string, an object, an array).
func TestCheckAndMaskedQuoteNoHiddenValue(t *testing.T) {
	r, err := devices.ParseRegistry([]byte(`
[types.keypad_lock.actions.unlock]
params.pin = { type = "int", min = 0, max = 9999, secret = true }
params.hold = { type = "int", min = 0, max = 60 }
params.code = { type = "string", max_len = 8 }
[types.keypad_lock.actions.set]
params.locked = { type = "bool" }
params.greeting = { type = "string" }
params.label = { type = "string", show = true }
[[devices]]
id = "front-door"
type = "keypad_lock"
`), "hidden.toml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		params     map[string]any
		want, hide string
	}{
		{map[string]any{"pin": 123456}, "pin: the value is above max 9999", "123456"},
		{map[string]any{"pin": "4321"}, "pin: the value is not a number", "4321"},
		{map[string]any{"code": 451}, "code: the value is not a string", "451"},
		{map[string]any{"hold": 99}, "hold: 99 is above max 60", ""},
	} {
		err := r.Check("front-door", "unlock", tc.params)
		if err == nil || !strings.Contains(err.Error(), tc.want) || tc.hide != "" && strings.Contains(err.Error(), tc.hide) {
			t.Errorf("Check(%v) = %v, want %q and not %q", tc.params, err, tc.want, tc.hide)
		}
	}
	got := r.Masked("front-door", "unlock", map[string]any{"locked": false, "greeting": "hi Ann", "label": "front", "pin": 4321, "hold": 5,
		"battery": 80, "last_code": "0451", "log": []any{"0451"}})
	want := map[string]any{"locked": false, "greeting": "***", "label": "front", "pin": "***", "hold": 5,
		"battery": 80, "last_code": "***", "log": "***"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Masked = %v, want %v", got, want)
	}
	// A device or action the registry does not know (a registry swapped
	// out since the command): nothing is shown.
	if got := r.Masked("garage", "unlock", map[string]any{"pin": 4321, "battery": 80}); got["pin"] != "***" || got["battery"] != "***" {
		t.Errorf("Masked for an unknown device = %v, want every value hidden", got)
	}
}
