package tasmota

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/sortie-edge/sortie/devices/adapter"
)

// The golden payloads in testdata/ come from Tasmota's documentation
// (MQTT.md "Command flow", Commands.md, Blinds-and-Shutters.md) and its
// issues:
//
//	result-power.json                MQTT.md: stat/<t>/RESULT after Power
//	result-ct.json                   arendst/Tasmota PR #5702: CT 153
//	result-dimmer.json               arendst/Tasmota #2184: Dimmer 73
//	result-shutter-moving.json       Blinds-and-Shutters.md, with Tilt as xdrv_27_shutter.ino prints it
//	result-shutterposition-echo.json Blinds-and-Shutters.md: the command's echo (its target)
//	result-unknown.json              arendst/Tasmota #5840: an unknown command
//	result-power2.json               Blinds-and-Shutters.md: a second relay
//	tele-state.json                  MQTT.md: tele/<t>/STATE every TelePeriod
func golden(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newTestProtocol(t testing.TB) *Protocol {
	t.Helper()
	s, err := ParseSettings(nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(s, []adapter.Device{
		{ID: "plug", Address: "tasmota_A1", Keys: []string{"power"}},
		{ID: "lamp", Address: "tasmota_B2", Keys: []string{"brightness", "color_temp", "power"}},
		{ID: "relay2", Address: "tasmota_C3:2", Keys: []string{"power"}},
		{ID: "shutter", Address: "tasmota_D4", Keys: []string{"position"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDecodeTranslatesGoldenPayloads(t *testing.T) {
	p := newTestProtocol(t)
	one := func(dev string, st map[string]any) []adapter.Report {
		return []adapter.Report{{Device: dev, State: st}}
	}
	for _, tc := range []struct {
		name, topic, file string
		want              []adapter.Report
	}{
		{"power", "stat/tasmota_A1/RESULT", "result-power.json", one("plug", map[string]any{"power": "on"})},
		{"ct", "stat/tasmota_B2/RESULT", "result-ct.json", one("lamp", map[string]any{"power": "on", "brightness": int64(100), "color_temp": int64(6536)})},
		{"dimmer", "stat/tasmota_B2/RESULT", "result-dimmer.json", one("lamp", map[string]any{"power": "on", "brightness": int64(73)})},
		{"setoption4 topic", "stat/tasmota_B2/DIMMER", "result-dimmer.json", one("lamp", map[string]any{"power": "on", "brightness": int64(73)})},
		{"second relay", "stat/tasmota_C3/RESULT", "result-power2.json", one("relay2", map[string]any{"power": "off"})},
		{"moving shutter", "stat/tasmota_D4/RESULT", "result-shutter-moving.json", one("shutter", map[string]any{"position": int64(98), "moving": true})},
		{"shutter's echo is its target, not its position", "stat/tasmota_D4/RESULT", "result-shutterposition-echo.json", nil},
		{"unknown command", "stat/tasmota_A1/RESULT", "result-unknown.json",
			[]adapter.Report{{Device: "plug", State: nil, Failure: &adapter.Failure{Code: "internal", Message: `Tasmota answered {"Command":"Unknown"}`}}}},
		{"telemetry", "tele/tasmota_A1/STATE", "tele-state.json", one("plug", map[string]any{"power": "off"})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := p.Decode(adapter.Message{Topic: tc.topic, Payload: golden(t, tc.file)})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestDecodeReadsThePlainPowerTopicAndTheWill(t *testing.T) {
	p := newTestProtocol(t)
	got, err := p.Decode(adapter.Message{Topic: "stat/tasmota_A1/POWER", Payload: []byte("ON")})
	if err != nil || len(got) != 1 || got[0].State["power"] != "on" {
		t.Fatalf("plain POWER: %+v, %v", got, err)
	}
	got, err = p.Decode(adapter.Message{Topic: "tele/tasmota_A1/LWT", Payload: []byte("Offline"), Retained: true})
	if err != nil || len(got) != 1 || got[0].Availability != adapter.Offline {
		t.Fatalf("LWT: %+v, %v", got, err)
	}
	if _, err := p.Decode(adapter.Message{Topic: "tele/tasmota_A1/LWT", Payload: []byte("maybe")}); err == nil {
		t.Error("an LWT that is neither Online nor Offline was accepted")
	}
	// POWER1 on a plug is another relay's, not the plug's POWER.
	got, _ = p.Decode(adapter.Message{Topic: "stat/tasmota_C3/POWER1", Payload: []byte("ON")})
	if len(got) != 0 {
		t.Errorf("relay 2 took POWER1: %+v", got)
	}
}

func TestCommandSendsAbsoluteCommandsInOrderAndOffAlone(t *testing.T) {
	p := newTestProtocol(t)
	render := func(ms []adapter.Message) []string {
		var out []string
		for _, m := range ms {
			out = append(out, m.Topic+" "+string(m.Payload))
		}
		return out
	}
	for _, tc := range []struct {
		dev  string
		want map[string]any
		msgs []string
	}{
		{"lamp", map[string]any{"power": "on", "brightness": 40, "color_temp": 2700},
			[]string{"cmnd/tasmota_B2/POWER ON", "cmnd/tasmota_B2/Dimmer 40", "cmnd/tasmota_B2/CT 370"}},
		{"lamp", map[string]any{"power": "off", "brightness": 40}, []string{"cmnd/tasmota_B2/POWER OFF"}},
		{"relay2", map[string]any{"power": "on"}, []string{"cmnd/tasmota_C3/POWER2 ON"}},
		{"shutter", map[string]any{"position": 30}, []string{"cmnd/tasmota_D4/ShutterPosition1 30"}},
	} {
		got, err := p.Command(tc.dev, tc.want, "")
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(render(got), tc.msgs) {
			t.Errorf("Command(%s, %v) = %q, want %q", tc.dev, tc.want, render(got), tc.msgs)
		}
	}
	if _, err := p.Command("plug", map[string]any{"locked": true}, ""); err == nil {
		t.Error("a key Tasmota has no command for was accepted")
	}
}

func TestSettingsBuildTopicsFromFullTopic(t *testing.T) {
	s, err := ParseSettings(map[string]any{"full_topic": "tasmota/%topic%/%prefix%/", "prefixes": []any{"c", "s", "t"}})
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(s, []adapter.Device{{ID: "plug", Address: "kitchen", Keys: []string{"power"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Filters(); !reflect.DeepEqual(got, []string{"tasmota/kitchen/s/+", "tasmota/kitchen/t/+"}) {
		t.Errorf("filters %v", got)
	}
	msgs, _ := p.Command("plug", map[string]any{"power": "on"}, "")
	if msgs[0].Topic != "tasmota/kitchen/c/POWER" {
		t.Errorf("command topic %s", msgs[0].Topic)
	}
	for _, bad := range []map[string]any{{"full_topic": "%topic%/"}, {"prefixes": []any{"a", "b"}}, {"colour": "x"}} {
		if _, err := ParseSettings(bad); err == nil {
			t.Errorf("ParseSettings(%v) accepted", bad)
		}
	}
}

func FuzzDecode(f *testing.F) {
	for _, name := range []string{"result-power.json", "result-ct.json", "result-dimmer.json", "result-shutter-moving.json",
		"result-shutterposition-echo.json", "result-unknown.json", "result-power2.json", "tele-state.json"} {
		f.Add("stat/tasmota_B2/RESULT", golden(f, name))
		f.Add("tele/tasmota_D4/STATE", golden(f, name))
	}
	f.Add("tele/tasmota_A1/LWT", []byte("Online"))
	f.Add("stat/tasmota_A1/POWER", []byte("OFF"))
	p := newTestProtocol(f)
	f.Fuzz(func(t *testing.T, topic string, payload []byte) {
		reports, err := p.Decode(adapter.Message{Topic: topic, Payload: payload})
		if err != nil && reports != nil {
			t.Fatalf("reports with an error: %v", err)
		}
		for _, r := range reports {
			if p.byID[r.Device] == nil {
				t.Fatalf("a report for %q, not one of the adapter's devices", r.Device)
			}
			if pos, ok := r.State["position"].(int64); ok && (pos < 0 || pos > 100) {
				t.Fatalf("position %d out of 0..100", pos)
			}
		}
	})
}
