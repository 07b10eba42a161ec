package devices_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/devices/adapter"
	"github.com/sortie-edge/sortie/simulator"
)

// TestDiscoverFindsEveryEcosystemAndWritesARegistryThatLoads runs a
// Zigbee2MQTT bridge, a Tasmota plug and shutter, a Shelly relay (that
// connects while discovery listens) and an ESPHome node, and asks the
// agent's client what it hears (with a DIY board announcing itself to
// Home Assistant): every device is found with the right
// protocol, address and kind, and the TOML it writes loads as a registry
// whose devices the adapters accept.
func TestDiscoverFindsEveryEcosystemAndWritesARegistryThatLoads(t *testing.T) {
	r := newEcoRig(t, nil, z2mRegistry)
	url := r.broker.URL()
	conn := simulator.Conn{Broker: url}
	z, err := simulator.StartZigbee2MQTT(t.Context(), simulator.Z2MConfig{Broker: url, Devices: []simulator.Z2MDevice{
		{Name: "Hall/Bulb", Kind: "light"}, {Name: "Kitchen/Plug", Kind: "switch"}, {Name: "Front door", Kind: "lock"},
		{Name: "Blind", Kind: "cover"}, {Name: "Bath/TRV", Kind: "thermostat"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(z.Close)
	for _, tc := range []simulator.TasmotaConfig{{Conn: conn, Topic: "tasmota_AA0001", Kind: "plug"}, {Conn: conn, Topic: "tasmota_AA0002", Kind: "shutter"}} {
		d, err := simulator.StartTasmota(t.Context(), tc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(d.Close)
	}
	n, err := simulator.StartESPHome(t.Context(), simulator.ESPHomeConfig{Conn: conn, Name: "garage-node",
		Entities: []simulator.ESPHomeEntity{{Type: "switch", ObjectID: "garage_light"}, {Type: "cover", ObjectID: "garage_door"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	ha, err := simulator.StartHA(t.Context(), simulator.HAConfig{Conn: conn, Name: "shed",
		Entities: []simulator.HAEntity{{Type: "light", ObjectID: "lamp"}, {Type: "climate", ObjectID: "heater"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ha.Close)

	done := make(chan devices.Discovery, 1)
	failed := make(chan error, 1)
	listening := make(chan struct{})
	go func() {
		d, err := r.client.Discover(t.Context(), devices.DiscoverOptions{Window: 700 * time.Millisecond, OnListening: func() { close(listening) }})
		if err != nil {
			failed <- err
			return
		}
		done <- d
	}()
	// The Shelly connects while discovery listens: its "online" makes it
	// known, and it is asked for its components.
	select {
	case <-listening:
	case err := <-failed:
		t.Fatal(err)
	}
	sh, err := simulator.StartShelly(t.Context(), simulator.ShellyConfig{Conn: conn, ID: "shellyplus1-4855199bc0e8", Kind: "switch"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sh.Close)
	var d devices.Discovery
	select {
	case d = <-done:
	case err := <-failed:
		t.Fatal(err)
	}

	want := map[string]string{
		"zigbee2mqtt Kitchen/Plug":                "relay",
		"zigbee2mqtt Front door":                  "lock",
		"zigbee2mqtt Blind":                       "curtain",
		"zigbee2mqtt Bath/TRV":                    "thermostat",
		"tasmota tasmota_AA0001":                  "relay",
		"tasmota tasmota_AA0002":                  "curtain",
		"esphome garage-node/switch/garage_light": "relay",
		"esphome garage-node/cover/garage_door":   "curtain",
		"shelly shellyplus1-4855199bc0e8":         "relay",
		"zigbee2mqtt Hall/Bulb":                   "light",
		"homeassistant light/shed/lamp":           "light",
		"homeassistant climate/shed/heater":       "thermostat",
	}
	got := map[string]string{}
	for _, f := range d.Found {
		got[f.Protocol+" "+f.Address] = f.Kind
	}
	// An ESPHome node's announcements are ESPHome's, not generic ones.
	if len(got) != len(want) {
		t.Errorf("found %d devices, want %d: %v", len(got), len(want), got)
	}
	for k, kind := range want {
		if got[k] != kind {
			t.Errorf("%s: found as %q, want %q", k, got[k], kind)
		}
	}
	if len(d.Problems) > 0 {
		t.Errorf("problems: %q", d.Problems)
	}
	reg, _ := devices.ParseRegistry([]byte(z2mRegistry), "z2m.toml")
	toml := devices.RegistryTOML(d, reg)
	if !strings.Contains(toml, `# already in the registry: hall-bulb (zigbee2mqtt "Hall/Bulb")`) {
		t.Errorf("the bulb the registry names is proposed again:\n%s", toml)
	}
	if _, err := devices.ParseRegistry([]byte(devices.RegistryTOML(d, nil)), "discovered.toml"); err != nil {
		t.Fatalf("the discovered registry does not load: %v\n%s", err, devices.RegistryTOML(d, nil))
	}
}

// TestRegistryTOMLEscapesWhatTOMLForbids: a discovered config's text
// with quotes, a backslash and control characters (DEL, which JSON does
// not escape) still makes a registry that loads, with the text intact.
func TestRegistryTOMLEscapesWhatTOMLForbids(t *testing.T) {
	odd := "a\"b\\c\x7fd\x01e"
	d := devices.Discovery{Found: []adapter.Found{{Protocol: "homeassistant", Address: "switch/odd", Kind: "relay", Keys: []string{"power"},
		Config: map[string]any{"command_topic": "odd/set", "state_topic": "odd/state", "payload_on": odd}}}}
	reg, err := devices.ParseRegistry([]byte(devices.RegistryTOML(d, nil)), "discovered.toml")
	if err != nil {
		t.Fatalf("%v\n%s", err, devices.RegistryTOML(d, nil))
	}
	if len(reg.Devices) != 1 {
		t.Fatalf("devices %+v", reg.Devices)
	}
	if dev := reg.Devices[0]; dev.Config["payload_on"] != odd {
		t.Errorf("payload_on %q, want %q", dev.Config["payload_on"], odd)
	}
}
