package devices_test

import (
	"errors"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/simulator"
)

// haRegistry names a DIY garage board's entities as a user writes them
// from its discovery configs: Home Assistant's own keys, full or short.
const haRegistry = ecoTypes + `
[[devices]]
id = "garage-relay"
type = "relay"
protocol = "homeassistant"
address = "switch/garage/relay"
config = { command_topic = "garage/relay/set", state_topic = "garage/relay/state", value_template = "{{ value_json.POWER }}", availability_topic = "garage/availability" }

[[devices]]
id = "garage-lamp"
type = "light"
protocol = "homeassistant"
address = "light/garage/lamp"
[devices.config]
"~" = "garage/lamp"
cmd_t = "~/set"
stat_t = "~/state"
stat_val_tpl = "{{ value_json.state }}"
bri_cmd_t = "~/brightness/set"
bri_stat_t = "~/state"
bri_val_tpl = "{{ value_json.brightness }}"
clr_temp_cmd_t = "~/color_temp/set"
clr_temp_stat_t = "~/state"
clr_temp_val_tpl = "{{ value_json.color_temp }}"
avty_t = "garage/availability"

[[devices]]
id = "garage-door"
type = "lock"
protocol = "homeassistant"
address = "lock/garage/door"
config = { command_topic = "garage/door/set", state_topic = "garage/door/state", availability_topic = "garage/availability" }

[[devices]]
id = "garage-blind"
type = "curtain"
protocol = "homeassistant"
address = "cover/garage/blind"
config = { set_position_topic = "garage/blind/position/set", set_position_template = '{"position": {{ position }}}', position_topic = "garage/blind/position", state_topic = "garage/blind/state", availability_topic = "garage/availability" }
`

func newHARig(t *testing.T, jammed bool) (*rig, *simulator.HADevice) {
	t.Helper()
	r := newEcoRig(t, nil, haRegistry)
	d, err := simulator.StartHA(t.Context(), simulator.HAConfig{
		Conn: simulator.Conn{Broker: r.broker.URL()}, Name: "garage",
		Entities: []simulator.HAEntity{
			{Type: "switch", ObjectID: "relay"}, {Type: "light", ObjectID: "lamp"},
			{Type: "lock", ObjectID: "door", Jammed: jammed}, {Type: "cover", ObjectID: "blind"},
		},
		WiFiFaults: simulator.WiFiFaults{Delay: 30 * time.Millisecond, Travel: 300 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	waitUntil(t, r.client, "garage-relay", "first state", func() bool { _, ok := r.client.State("garage-relay"); return ok })
	return r, d
}

func TestHomeAssistantDeviceCommandConfirmedByItsState(t *testing.T) {
	r, d := newHARig(t, false)
	if _, err := r.run(t, devices.KindCommand, z2mCommand(t, "c1", "garage-relay", "turn_on", nil, 1)); err != nil {
		t.Fatal(err)
	}
	if d.State("relay")["state"] != "ON" {
		t.Errorf("relay %v", d.State("relay"))
	}
	out, err := r.run(t, devices.KindCommand, z2mCommand(t, "c2", "garage-lamp", "turn_on", map[string]any{"brightness": 40}, 1))
	if err != nil {
		t.Fatal(err)
	}
	// The default schema: ON on the command topic, then the level on the
	// brightness topic, confirmed from one JSON state read by templates.
	if st := d.State("lamp"); st["state"] != "ON" || st["brightness"] != 102 {
		t.Errorf("lamp %v", st)
	}
	if st := out["state"].(map[string]any); st["power"] != "on" || st["brightness"] != int64(40) {
		t.Errorf("confirmed state %v", st)
	}
}

func TestHomeAssistantJammedLockFailsAtOnce(t *testing.T) {
	r, _ := newHARig(t, true)
	start := time.Now()
	_, err := r.run(t, devices.KindCommand, z2mCommand(t, "c1", "garage-door", "unlock", nil, 1))
	var se *driver.StepError
	if !errors.As(err, &se) || se.Code != "jammed" || se.Class != driver.Permanent {
		t.Fatalf("err %v, want a permanent jammed error", err)
	}
	if took := time.Since(start); took > 900*time.Millisecond {
		t.Errorf("took %v: waited for the ack timeout, not the JAMMED report", took)
	}
}

func TestHomeAssistantCoverConfirmedWhenItStops(t *testing.T) {
	r, d := newHARig(t, false)
	start := time.Now()
	out, err := r.run(t, devices.KindCommand, z2mCommand(t, "c1", "garage-blind", "set_position", map[string]any{"position": 70}, 1))
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 150*time.Millisecond {
		t.Errorf("confirmed after %v, before its travel", took)
	}
	if st := out["state"].(map[string]any); st["position"] != int64(70) || st["moving"] == true || d.Position() != 70 {
		t.Errorf("state %v, device at %d", st, d.Position())
	}
}

func TestHomeAssistantAvailabilityTakesEntitiesOffline(t *testing.T) {
	r, d := newHARig(t, false)
	waitUntil(t, r.client, "garage-door", "online", func() bool { return r.client.Available("garage-door") })
	d.Kill()
	waitUntil(t, r.client, "garage-lamp", "offline", func() bool { return !r.client.Available("garage-lamp") })
}

func TestHomeAssistantRegistryRefusesAnOptimisticDevice(t *testing.T) {
	_, err := devices.ParseRegistry([]byte(ecoTypes+`
[[devices]]
id = "porch"
type = "relay"
protocol = "homeassistant"
address = "switch/porch"
config = { command_topic = "porch/set" }
`), "r.toml")
	if err == nil {
		t.Fatal("a switch without a state topic loaded")
	}
	t.Log(err)
}
