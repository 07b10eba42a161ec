package zigbee2mqtt

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/sortie-edge/sortie/devices/adapter"
)

// The golden payloads in testdata/ come from Zigbee2MQTT's documentation
// and source (2.12.1 and 1.42.0), its test mocks, and captures from real
// installations posted in its public issues:
//
//	logging-2x-mock.json       test/mocks: {level, message, namespace}
//	logging-2x-capture.json    a real 2.x bridge: namespace folded into the message (#27246, #25900)
//	log-1x-legacy.json         1.x legacy_api bridge/log zigbee_publish_error (1.42.0 lib/extension/publish.ts)
//	logging-no-converter.json  publish.ts "No converter available for '<key>' on '<name>': (<value>)"
//	state-*.json               docs "MQTT topics and messages" and device pages (exposes)
//	availability-*             docs "Device availability": 1.x plain, 2.x JSON
func golden(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newTestProtocol(t *testing.T) *Protocol {
	t.Helper()
	p, err := New(Settings{Base: DefaultBase}, []adapter.Device{
		{ID: "bulb", Address: "Hall/Bulb", Keys: []string{"brightness", "color_temp", "power"}},
		{ID: "door", Address: "Front door", Keys: []string{"locked"}},
		{ID: "blind", Address: "Blind", Keys: []string{"position"}},
		{ID: "trv", Address: "x", Keys: []string{"mode", "target"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDecodeTranslatesGoldenPayloadsIntoTheCommonVocabulary(t *testing.T) {
	p := newTestProtocol(t)
	// The bridge's errors below are about commands Sortie sent: a set of
	// state and brightness to the bulb, and of state to x.
	if _, err := p.Command("bulb", map[string]any{"power": "on", "brightness": 10}, ""); err != nil {
		t.Fatal(err)
	}
	p.sent["x"] = []string{"state"}
	fail := func(dev, code string) []adapter.Report {
		return []adapter.Report{{Device: dev, Failure: &adapter.Failure{Code: code}}}
	}
	for _, tc := range []struct {
		name, topic, file string
		want              []adapter.Report
	}{
		{"light state", "zigbee2mqtt/Hall/Bulb", "state-light.json",
			[]adapter.Report{{Device: "bulb", State: map[string]any{"power": "on", "brightness": int64(40), "color_temp": int64(2703)}}}},
		{"lock state", "zigbee2mqtt/Front door", "state-lock.json",
			[]adapter.Report{{Device: "door", State: map[string]any{"locked": true}}}},
		{"moving cover", "zigbee2mqtt/Blind", "state-cover-moving.json",
			[]adapter.Report{{Device: "blind", State: map[string]any{"position": int64(42), "moving": true}}}},
		{"thermostat", "zigbee2mqtt/x", "state-thermostat.json",
			[]adapter.Report{{Device: "trv", State: map[string]any{"mode": "heat", "target": 21.5}}}},
		{"2.x log from the mocks", "zigbee2mqtt/bridge/logging", "logging-2x-mock.json", fail("trv", "unreachable")},
		{"2.x log from a real bridge", "zigbee2mqtt/bridge/logging", "logging-2x-capture.json", fail("bulb", "unreachable")},
		{"1.x legacy log", "zigbee2mqtt/bridge/log", "log-1x-legacy.json", fail("bulb", "unreachable")},
		{"no converter", "zigbee2mqtt/bridge/logging", "logging-no-converter.json", fail("bulb", "unsupported")},
		{"1.x availability", "zigbee2mqtt/Front door/availability", "availability-1x.txt",
			[]adapter.Report{{Device: "door", Availability: adapter.Offline}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := p.Decode(adapter.Message{Topic: tc.topic, Payload: golden(t, tc.file)})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range got {
				if r.Failure != nil {
					r.Failure.Message = "" // the bridge's own words, checked below
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestABridgeErrorAboutAnotherClientsCommandIsNotOurs(t *testing.T) {
	p := newTestProtocol(t)
	if _, err := p.Command("bulb", map[string]any{"power": "on"}, ""); err != nil {
		t.Fatal(err)
	}
	// Home Assistant set the bulb's color_temp, which failed: Sortie sent
	// only its state.
	got, err := p.Decode(adapter.Message{Topic: "zigbee2mqtt/bridge/logging",
		Payload: []byte(`{"level":"error","message":"Publish 'set' 'color_temp' to 'Hall/Bulb' failed: 'Timeout'"}`)})
	if err != nil || len(got) != 0 {
		t.Fatalf("got %+v, %v: another client's failure taken for Sortie's", got, err)
	}
}

func TestALockThatIsNotFullyLockedIsNotLocked(t *testing.T) {
	st, err := DecodeState([]byte(`{"state":"LOCK","lock_state":"not_fully_locked"}`), true)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := st["locked"]; ok {
		t.Errorf("state %v: a jammed lock reported as locked or unlocked", st)
	}
}

func TestBridgeStateDecidesEveryDevicesAvailability(t *testing.T) {
	p := newTestProtocol(t)
	if _, err := p.Decode(adapter.Message{Topic: "zigbee2mqtt/Front door/availability", Payload: []byte(`{"state":"offline"}`)}); err != nil {
		t.Fatal(err)
	}
	got, err := p.Decode(adapter.Message{Topic: "zigbee2mqtt/bridge/state", Payload: golden(t, "availability-2x.json")})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]adapter.Availability{"bulb": adapter.Online, "door": adapter.Offline, "blind": adapter.Online, "trv": adapter.Online}
	for _, r := range got {
		if r.Availability != want[r.Device] {
			t.Errorf("%s: %v, want %v", r.Device, r.Availability, want[r.Device])
		}
	}
	got, _ = p.Decode(adapter.Message{Topic: "zigbee2mqtt/bridge/state", Payload: []byte("offline")})
	for _, r := range got {
		if r.Availability != adapter.Offline {
			t.Errorf("%s: %v with the bridge offline", r.Device, r.Availability)
		}
	}
}

func TestFailedDeviceReadsEveryFormOfABridgeError(t *testing.T) {
	for msg, want := range map[string]string{
		"Publish 'set' 'state' to 'a' failed: 'x'":                      "a",
		"z2m: Publish 'set' 'brightness' to 'it's/here' failed: 'boom'": "it's/here",
		"No converter available for 'x' on 'lamp': (1)":                 "lamp",
		"Cannot publish to unsupported device 'old'":                    "old",
		"Entity 'ghost' is unknown":                                     "ghost",
	} {
		if got, ok := FailedDevice(msg); !ok || got != want {
			t.Errorf("FailedDevice(%q) = %q, %v; want %q", msg, got, ok, want)
		}
	}
	for _, msg := range []string{"Publish 'get' 'state' to 'a' failed: 'x'", "MQTT error: connection lost", "Publish 'set' 'state' to 'a"} {
		if got, ok := FailedDevice(msg); ok {
			t.Errorf("FailedDevice(%q) = %q: not a command's failure", msg, got)
		}
	}
}

func TestEncodeSetSendsAbsoluteValuesAndOffAlone(t *testing.T) {
	for _, tc := range []struct {
		want map[string]any
		json string
	}{
		{map[string]any{"power": "on", "brightness": 40, "color_temp": 2700}, `{"brightness":102,"color_temp":370,"state":"ON"}`},
		{map[string]any{"power": "off", "brightness": 40}, `{"state":"OFF"}`},
		{map[string]any{"locked": false}, `{"state":"UNLOCK"}`},
		{map[string]any{"position": 55}, `{"position":55}`},
		{map[string]any{"mode": "heat", "target": 21.5}, `{"occupied_heating_setpoint":21.5,"system_mode":"heat"}`},
	} {
		got, err := EncodeSet(tc.want)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != tc.json {
			t.Errorf("EncodeSet(%v) = %s, want %s", tc.want, got, tc.json)
		}
	}
	for _, bad := range []map[string]any{{"power": "toggle"}, {"playlist": "x"}, {"brightness": 400}, {"moving": true}} {
		if _, err := EncodeSet(bad); err == nil {
			t.Errorf("EncodeSet(%v) accepted", bad)
		}
	}
	if _, err := EncodeSet(map[string]any{"playlist": "x"}); !errors.Is(err, adapter.ErrUnsupported) {
		t.Errorf("an unknown key: %v, want ErrUnsupported", err)
	}
}

func TestProbeReadsTheAttributesOfTheDevicesKeys(t *testing.T) {
	p := newTestProtocol(t)
	got := p.Probe("bulb", "")
	if len(got) != 1 || got[0].Topic != "zigbee2mqtt/Hall/Bulb/get" {
		t.Fatalf("probe = %+v", got)
	}
	var m map[string]string
	if err := json.Unmarshal(got[0].Payload, &m); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(m, map[string]string{"state": "", "brightness": "", "color_temp": ""}) {
		t.Errorf("probe reads %v", m)
	}
}

func TestNewRefusesAddressesAndKeysItCannotSpeak(t *testing.T) {
	for name, d := range map[string]adapter.Device{
		"wildcard":       {ID: "a", Address: "living/+", Keys: []string{"power"}},
		"reserved":       {ID: "a", Address: "lamp/set", Keys: []string{"power"}},
		"bridge":         {ID: "a", Address: "bridge/x", Keys: []string{"power"}},
		"empty level":    {ID: "a", Address: "a//b", Keys: []string{"power"}},
		"unknown key":    {ID: "a", Address: "speaker", Keys: []string{"playlist"}},
		"lock and power": {ID: "a", Address: "lock", Keys: []string{"locked", "power"}},
	} {
		if _, err := New(Settings{Base: DefaultBase}, []adapter.Device{d}); err == nil {
			t.Errorf("%s: New accepted %+v", name, d)
		}
	}
}

func FuzzDecode(f *testing.F) {
	for _, name := range []string{"state-light.json", "state-lock.json", "state-cover-moving.json", "state-thermostat.json",
		"logging-2x-mock.json", "logging-2x-capture.json", "log-1x-legacy.json", "logging-no-converter.json", "availability-2x.json"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		for _, topic := range []string{"zigbee2mqtt/Hall/Bulb", "zigbee2mqtt/bridge/logging", "zigbee2mqtt/bridge/log", "zigbee2mqtt/bridge/state", "zigbee2mqtt/Front door/availability"} {
			f.Add(topic, b)
		}
	}
	f.Fuzz(func(t *testing.T, topic string, payload []byte) {
		p, err := New(Settings{Base: DefaultBase}, []adapter.Device{
			{ID: "bulb", Address: "Hall/Bulb", Keys: []string{"brightness", "power"}},
			{ID: "door", Address: "Front door", Keys: []string{"locked"}},
		})
		if err != nil {
			t.Fatal(err)
		}
		reports, err := p.Decode(adapter.Message{Topic: topic, Payload: payload})
		if err != nil && reports != nil {
			t.Fatalf("reports with an error: %v", err)
		}
		for _, r := range reports {
			if r.Device != "bulb" && r.Device != "door" {
				t.Fatalf("a report for %q, not one of the bridge's devices", r.Device)
			}
			if b, ok := r.State["brightness"].(int64); ok && (b < 0 || b > 100) {
				t.Fatalf("brightness %d out of 0..100", b)
			}
		}
	})
}
