package homeassistant

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/sortie-edge/sortie/devices/adapter"
)

// The configs in testdata/ are Home Assistant discovery configs in the
// forms their sources publish them:
//
//	switch-irrigation.json  the MQTT integration docs' "~" example
//	light-json-z2m.json     a Zigbee2MQTT 2.x light (homeassistant.ts:
//	                        JSON schema, an availability list, mode all)
//	device-cmps.json        the docs' device-based discovery example
//	switch-optimistic.json  a switch without a state topic
//	cover-jinja.json        a position template using {% if %}
//	light-state-shared.json a JSON state read by several templates
func golden(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func config(t testing.TB, name string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(golden(t, name), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// diy is a device of the simulator's kind: a switch, a default-schema
// light reading one JSON state through three templates, a lock, a cover
// and a climate unit, all available on one topic.
func diy(t testing.TB) *Protocol {
	t.Helper()
	avty := map[string]any{"avty_t": "garage/availability"}
	with := func(m map[string]any) map[string]any {
		for k, v := range avty {
			m[k] = v
		}
		return m
	}
	p, err := New(Settings{}, []adapter.Device{
		{ID: "relay", Address: "switch/garage/relay", Keys: []string{"power"}, Config: with(map[string]any{
			"~": "garage/relay", "cmd_t": "~/set", "stat_t": "~/state", "val_tpl": "{{ value_json.POWER }}"})},
		{ID: "lamp", Address: "light/garage/lamp", Keys: []string{"brightness", "power"}, Config: with(map[string]any{
			"~": "garage/lamp", "cmd_t": "~/set", "stat_t": "~/state", "stat_val_tpl": "{{ value_json.state }}",
			"bri_cmd_t": "~/brightness/set", "bri_stat_t": "~/state", "bri_val_tpl": "{{ value_json.brightness }}"})},
		{ID: "door", Address: "lock/garage/door", Keys: []string{"locked"}, Config: with(map[string]any{
			"cmd_t": "garage/door/set", "stat_t": "garage/door/state"})},
		{ID: "blind", Address: "cover/garage/blind", Keys: []string{"position"}, Config: with(map[string]any{
			"set_pos_t": "garage/blind/position/set", "set_pos_tpl": `{"position": {{ position }}}`,
			"pos_t": "garage/blind/position", "stat_t": "garage/blind/state", "pos_open": int64(255), "pos_clsd": int64(0)})},
		{ID: "trv", Address: "climate/garage/trv", Keys: []string{"mode", "target"}, Config: with(map[string]any{
			"mode_cmd_t": "garage/trv/mode/set", "mode_stat_t": "garage/trv/mode", "modes": []any{"off", "heat"},
			"temp_cmd_t": "garage/trv/target/set", "temp_stat_t": "garage/trv/target", "temp_cmd_tpl": "{{ value }}"})},
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDecodeReadsEachEntityThroughItsTemplates(t *testing.T) {
	p := diy(t)
	for _, tc := range []struct {
		name, topic string
		payload     []byte
		want        []adapter.Report
	}{
		{"switch via value_json", "garage/relay/state", []byte(`{"POWER":"ON"}`),
			[]adapter.Report{{Device: "relay", State: map[string]any{"power": "on"}}}},
		{"light state and brightness from one message", "garage/lamp/state", golden(t, "light-state-shared.json"),
			[]adapter.Report{{Device: "lamp", State: map[string]any{"power": "on", "brightness": int64(50)}}}},
		{"lock", "garage/door/state", []byte("UNLOCKED"),
			[]adapter.Report{{Device: "door", State: map[string]any{"locked": false, "moving": false}}}},
		{"jammed lock", "garage/door/state", []byte("JAMMED"),
			[]adapter.Report{{Device: "door", Failure: &adapter.Failure{Code: "jammed", Message: "the lock reports JAMMED"}}}},
		{"cover position in its own range", "garage/blind/position", []byte("51"),
			[]adapter.Report{{Device: "blind", State: map[string]any{"position": int64(20)}}}},
		{"cover moving", "garage/blind/state", []byte("closing"),
			[]adapter.Report{{Device: "blind", State: map[string]any{"moving": true}}}},
		{"climate mode", "garage/trv/mode", []byte("heat"), []adapter.Report{{Device: "trv", State: map[string]any{"mode": "heat"}}}},
		{"climate target", "garage/trv/target", []byte("21.5"), []adapter.Report{{Device: "trv", State: map[string]any{"target": 21.5}}}},
		{"availability reaches every entity", "garage/availability", []byte("offline"), []adapter.Report{
			{Device: "relay", Availability: adapter.Offline}, {Device: "lamp", Availability: adapter.Offline},
			{Device: "door", Availability: adapter.Offline}, {Device: "blind", Availability: adapter.Offline},
			{Device: "trv", Availability: adapter.Offline}}},
		{"a cleared retained state says nothing", "garage/relay/state", nil, nil},
		{"a template that finds nothing says nothing", "garage/relay/state", []byte(`{"Time":"2026-12-06"}`), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := p.Decode(adapter.Message{Topic: tc.topic, Payload: tc.payload})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestDecodeRefusesWhatItCannotRead(t *testing.T) {
	p := diy(t)
	for topic, payload := range map[string]string{
		"garage/relay/state":  `{"POWER":"MAYBE"}`,
		"garage/door/state":   "AJAR",
		"garage/trv/target":   "warm",
		"garage/lamp/state":   `{"state":"ON","brightness":"bright"}`,
		"somewhere/else/else": "ON",
	} {
		if _, err := p.Decode(adapter.Message{Topic: topic, Payload: []byte(payload)}); err == nil {
			t.Errorf("%s %q: no error", topic, payload)
		}
	}
}

func TestAvailabilityModes(t *testing.T) {
	cfg := config(t, "light-json-z2m.json")
	p, err := New(Settings{}, []adapter.Device{{ID: "kitchen", Address: "light/kitchen", Keys: []string{"power", "brightness", "color_temp"}, Config: cfg}})
	if err != nil {
		t.Fatal(err)
	}
	step := func(topic, payload string, want adapter.Availability) {
		t.Helper()
		got, err := p.Decode(adapter.Message{Topic: topic, Payload: []byte(payload)})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].Availability != want {
			t.Fatalf("%s %s: got %+v, want availability %v", topic, payload, got, want)
		}
	}
	// Mode "all": the device is available only when the bridge and the
	// device both say so.
	step("zigbee2mqtt/Kitchen/availability", `{"state":"online"}`, adapter.Offline)
	step("zigbee2mqtt/bridge/state", `{"state":"online"}`, adapter.Online)
	step("zigbee2mqtt/bridge/state", `{"state":"offline"}`, adapter.Offline)
	got, err := p.Decode(adapter.Message{Topic: "zigbee2mqtt/Kitchen", Payload: []byte(`{"state":"OFF","brightness":254,"color_temp":250}`)})
	if err != nil || len(got) != 1 || !reflect.DeepEqual(got[0].State, map[string]any{"power": "off", "brightness": int64(100), "color_temp": int64(4000)}) {
		t.Fatalf("JSON light state: %+v, %v", got, err)
	}
}

func TestCommandsFollowTheConfig(t *testing.T) {
	p := diy(t)
	for _, tc := range []struct {
		device string
		want   map[string]any
		msgs   []string
	}{
		{"relay", map[string]any{"power": "on"}, []string{"garage/relay/set ON"}},
		{"lamp", map[string]any{"power": "on", "brightness": int64(50)}, []string{"garage/lamp/set ON", "garage/lamp/brightness/set 128"}},
		{"lamp", map[string]any{"power": "off", "brightness": int64(50)}, []string{"garage/lamp/set OFF"}},
		{"door", map[string]any{"locked": true}, []string{"garage/door/set LOCK"}},
		// set_position_template's position is the target in percent.
		{"blind", map[string]any{"position": int64(20)}, []string{`garage/blind/position/set {"position": 20}`}},
		{"trv", map[string]any{"mode": "heat", "target": 21.5}, []string{"garage/trv/mode/set heat", "garage/trv/target/set 21.5"}},
	} {
		msgs, err := p.Command(tc.device, tc.want, "id")
		if err != nil {
			t.Fatalf("%s %v: %v", tc.device, tc.want, err)
		}
		var got []string
		for _, m := range msgs {
			if m.Retained {
				t.Errorf("%s: a retained command", m.Topic)
			}
			got = append(got, m.Topic+" "+string(m.Payload))
		}
		if !reflect.DeepEqual(got, tc.msgs) {
			t.Errorf("%s %v: got %q, want %q", tc.device, tc.want, got, tc.msgs)
		}
	}
	if _, err := p.Command("trv", map[string]any{"mode": "cool"}, ""); !errors.Is(err, adapter.ErrUnsupported) {
		t.Errorf("a mode the config does not list: %v", err)
	}
	if _, err := p.Command("relay", map[string]any{"brightness": 3}, ""); !errors.Is(err, adapter.ErrUnsupported) {
		t.Errorf("a key the entity does not have: %v", err)
	}
}

func TestJSONLightCommand(t *testing.T) {
	p, err := New(Settings{}, []adapter.Device{{ID: "kitchen", Address: "light/kitchen", Keys: []string{"power", "brightness", "color_temp"}, Config: config(t, "light-json-z2m.json")}})
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := p.Command("kitchen", map[string]any{"power": "on", "brightness": int64(100), "color_temp": int64(2700)}, "")
	if err != nil || len(msgs) != 1 || msgs[0].Topic != "zigbee2mqtt/Kitchen/set" || string(msgs[0].Payload) != `{"brightness":254,"color_temp":370,"state":"ON"}` {
		t.Fatalf("got %+v, %v", msgs, err)
	}
}

func TestConfigsSortieCannotHonourAreRefusedWithTheReason(t *testing.T) {
	for _, tc := range []struct {
		name, addr string
		cfg        map[string]any
		keys       []string
		why        string
	}{
		{"optimistic switch", "switch/porch", config(t, "switch-optimistic.json"), []string{"power"}, "state_topic: missing"},
		{"jinja statement", "cover/blind", config(t, "cover-jinja.json"), []string{"position"}, "position_template"},
		{"template schema", "light/x", map[string]any{"schema": "template", "cmd_t": "x", "stat_t": "y"}, []string{"power"}, "schema"},
		{"command_on_template", "light/x", map[string]any{"command_on_template": "on", "cmd_t": "x", "stat_t": "y"}, []string{"power"}, "template schema"},
		{"optimistic flag", "lock/x", map[string]any{"opt": true, "cmd_t": "x", "stat_t": "y"}, []string{"locked"}, "optimistic"},
		{"a key the entity lacks", "switch/x", map[string]any{"cmd_t": "x", "stat_t": "y"}, []string{"brightness"}, "not supported"},
		{"no config", "switch/x", nil, []string{"power"}, "config: missing"},
		{"bad address", "sensor/x", map[string]any{"cmd_t": "x", "stat_t": "y"}, []string{"power"}, "component"},
		{"wildcard topic", "switch/x", map[string]any{"cmd_t": "x/#", "stat_t": "y"}, []string{"power"}, "wildcards"},
		{"both availabilities", "switch/x", map[string]any{"cmd_t": "x", "stat_t": "y", "avty_t": "a", "avty": []any{map[string]any{"t": "b"}}}, []string{"power"}, "one or the other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(Settings{}, []adapter.Device{{ID: "d", Address: tc.addr, Keys: tc.keys, Config: tc.cfg}})
			if err == nil || !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("got %v, want an error saying %q", err, tc.why)
			}
		})
	}
}

func TestDiscoveryReadsEntityAndDeviceConfigs(t *testing.T) {
	fs, err := DecodeDiscovery("homeassistant", "homeassistant/switch/irrigation/config", golden(t, "switch-irrigation.json"))
	if err != nil || len(fs) != 1 {
		t.Fatalf("got %+v, %v", fs, err)
	}
	f := fs[0]
	if f.Protocol != Name || f.Address != "switch/irrigation" || f.Kind != "relay" || f.Name != "garden" ||
		f.Config["command_topic"] != "homeassistant/switch/irrigation/set" || f.Config["state_topic"] != "homeassistant/switch/irrigation/state" {
		t.Errorf("irrigation: %+v", f)
	}
	// What discovery keeps loads as a registry entry's config.
	if _, err := New(Settings{}, []adapter.Device{{ID: "i", Address: f.Address, Keys: f.Keys, Config: f.Config}}); err != nil {
		t.Errorf("the discovered config does not load: %v", err)
	}
	fs, err = DecodeDiscovery("homeassistant", "homeassistant/device/ea334450945afc/config", golden(t, "device-cmps.json"))
	if err != nil || len(fs) != 1 {
		t.Fatalf("device config: got %+v, %v", fs, err)
	}
	if f := fs[0]; f.Address != "switch/ea334450945afc/relay1" || f.Config["state_topic"] != "kitchen/state" || f.Config["value_template"] != "{{ value_json.relay1 }}" || f.Model != "Bla electronics xya" {
		t.Errorf("device component: %+v", f)
	}
	if fs, err := DecodeDiscovery("homeassistant", "homeassistant/sensor/x/config", []byte(`{"stat_t":"x"}`)); err != nil || fs != nil {
		t.Errorf("a sensor: %+v, %v", fs, err)
	}
	if fs, err := DecodeDiscovery("homeassistant", "homeassistant/switch/porch/config", golden(t, "switch-optimistic.json")); err == nil || fs != nil {
		t.Errorf("an optimistic switch: %+v, %v", fs, err)
	}
	if fs, err := DecodeDiscovery("homeassistant", "homeassistant/switch/porch/config", nil); err != nil || fs != nil {
		t.Errorf("a removal: %+v, %v", fs, err)
	}
}

func TestValueTemplateSubset(t *testing.T) {
	for _, tc := range []struct {
		tpl, payload, want string
		found              bool
	}{
		{"{{ value }}", "ON", "ON", true},
		{"{{value_json.a.b}}", `{"a":{"b":"x"}}`, "x", true},
		{"{{ value_json['a b'] }}", `{"a b":3}`, "3", true},
		{`{{ value_json["POWER1"] | lower }}`, `{"POWER1":"ON"}`, "on", true},
		{"{{ value_json.t | float | round(1) }}", `{"t":21.46}`, "21.5", true},
		{"{{ value_json.t | int }}", `{"t":21.9}`, "21", true},
		{"{{ value_json.missing | default('off') }}", `{}`, "off", true},
		{"{{ value_json.missing }}", `{}`, "", false},
		{"{{ value_json.ok }}", `{"ok":true}`, "True", true},
		{"{{ value_json.p | int }}", `{"p":null}`, "", false},
		{"{{ value_json.p | int(0) }}", `{"p":"x"}`, "0", true},
		{"{{ value | float }}", `21`, "21.0", true},
		{"{{ value | round }}", `2.5`, "2", true},
		{"{{ value_json.a }}", `not json`, "", false},
	} {
		vt, err := parseValueTemplate(tc.tpl)
		if err != nil {
			t.Fatalf("%s: %v", tc.tpl, err)
		}
		got, found := vt.eval([]byte(tc.payload))
		if got != tc.want || found != tc.found {
			t.Errorf("%s on %s: got %q %v, want %q %v", tc.tpl, tc.payload, got, found, tc.want, tc.found)
		}
	}
	for _, bad := range []string{"{% if value %}on{% endif %}", "{{ states('x') }}", "on {{ value }}", "{{ value_json.a | replace('a','b') }}", "{{ value | int(x) }}", "{{ value_json. }}", "{{ value_json['a }}"} {
		if _, err := parseValueTemplate(bad); err == nil || !strings.Contains(err.Error(), "Sortie evaluates") {
			t.Errorf("%s: %v", bad, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add("garage/lamp/state", golden(f, "light-state-shared.json"))
	f.Add("garage/relay/state", []byte(`{"POWER":"OFF"}`))
	f.Add("garage/blind/position", []byte("255"))
	f.Add("garage/availability", []byte("online"))
	p := diy(f)
	f.Fuzz(func(t *testing.T, topic string, payload []byte) {
		reps, err := p.Decode(adapter.Message{Topic: topic, Payload: payload})
		if err != nil {
			return
		}
		for _, r := range reps {
			if r.Device == "" {
				t.Fatalf("a report without a device: %+v", r)
			}
		}
	})
}

func FuzzDecodeDiscovery(f *testing.F) {
	for _, name := range []string{"switch-irrigation.json", "light-json-z2m.json", "device-cmps.json", "cover-jinja.json"} {
		f.Add("homeassistant/light/x/config", golden(f, name))
	}
	f.Add("homeassistant/device/d/config", golden(f, "device-cmps.json"))
	f.Fuzz(func(t *testing.T, topic string, payload []byte) {
		fs, err := DecodeDiscovery("homeassistant", topic, payload)
		for _, fd := range fs {
			// Whatever discovery proposes loads as a registry entry.
			if _, lerr := New(Settings{}, []adapter.Device{{ID: "d", Address: fd.Address, Keys: fd.Keys, Config: fd.Config}}); lerr != nil {
				t.Fatalf("found %+v (err %v) does not load: %v", fd, err, lerr)
			}
		}
	})
}

func FuzzTemplate(f *testing.F) {
	f.Add("{{ value_json.a.b | lower | default('x') }}", []byte(`{"a":{"b":"Y"}}`))
	f.Add("{{ value | round(2) }}", []byte("1.005"))
	f.Fuzz(func(t *testing.T, src string, payload []byte) {
		if vt, err := parseValueTemplate(src); err == nil {
			vt.eval(payload)
		}
		if ct, err := parseCommandTemplate(src, "value"); err == nil && strings.Contains(src, "{{") {
			if out := ct.render(map[string]string{"value": "\x00"}); !strings.Contains(out, "\x00") {
				t.Fatalf("%q rendered %q without its value", src, out)
			}
		}
	})
}

// TestShellyGen1ThroughItsHomeAssistantConfig: a Shelly Gen1 relay and
// roller (shellies/<id>/relay/0 "on"/"off", roller/0/pos, the will
// "false" on shellies/<id>/online), described by the config Home
// Assistant users write for them, are driven by this adapter.
func TestShellyGen1ThroughItsHomeAssistantConfig(t *testing.T) {
	base := "shellies/shellyswitch25-73CDE9"
	avty := map[string]any{"availability_topic": base + "/online", "payload_available": "true", "payload_not_available": "false"}
	cfg := func(m map[string]any) map[string]any {
		for k, v := range avty {
			m[k] = v
		}
		return m
	}
	p, err := New(Settings{}, []adapter.Device{
		{ID: "relay", Address: "switch/shelly_relay", Keys: []string{"power"}, Config: cfg(map[string]any{
			"command_topic": base + "/relay/0/command", "state_topic": base + "/relay/0", "payload_on": "on", "payload_off": "off"})},
		{ID: "roller", Address: "cover/shelly_roller", Keys: []string{"position"}, Config: cfg(map[string]any{
			"command_topic": base + "/roller/0/command", "set_position_topic": base + "/roller/0/command/pos", "position_topic": base + "/roller/0/pos"})},
	})
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := p.Command("relay", map[string]any{"power": "on"}, "")
	if err != nil || len(msgs) != 1 || msgs[0].Topic != base+"/relay/0/command" || string(msgs[0].Payload) != "on" {
		t.Fatalf("relay command %+v, %v", msgs, err)
	}
	msgs, err = p.Command("roller", map[string]any{"position": int64(30)}, "")
	if err != nil || len(msgs) != 1 || msgs[0].Topic != base+"/roller/0/command/pos" || string(msgs[0].Payload) != "30" {
		t.Fatalf("roller command %+v, %v", msgs, err)
	}
	for topic, want := range map[string][]adapter.Report{
		base + "/relay/0":      {{Device: "relay", State: map[string]any{"power": "on"}}},
		base + "/roller/0/pos": {{Device: "roller", State: map[string]any{"position": int64(30)}}},
		base + "/online":       {{Device: "relay", Availability: adapter.Offline}, {Device: "roller", Availability: adapter.Offline}},
	} {
		payload := map[string]string{base + "/relay/0": "on", base + "/roller/0/pos": "30", base + "/online": "false"}[topic]
		got, err := p.Decode(adapter.Message{Topic: topic, Payload: []byte(payload)})
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%s %s: got %+v, %v; want %+v", topic, payload, got, err, want)
		}
	}
}
