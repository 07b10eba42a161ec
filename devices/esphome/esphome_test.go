package esphome

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/sortie-edge/sortie/devices/adapter"
)

// The golden payloads in testdata/ follow ESPHome's MQTT documentation
// and source (components/mqtt, components/light/light_json_schema.cpp):
//
//	light-state.json    a JSON-schema light's state
//	lock-jammed.txt     a lock's state when it cannot move
//	cover-position.txt  a position cover's .../position/state
//	switch-on.txt       a switch's state
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
	p, err := New([]adapter.Device{
		{ID: "ceiling", Address: "living/room/light/ceiling", Keys: []string{"brightness", "color_temp", "power"}},
		{ID: "door", Address: "hall/lock/front_door", Keys: []string{"locked"}},
		{ID: "blind", Address: "hall/cover/blind", Keys: []string{"position"}},
		{ID: "fan", Address: "hall/switch/fan", Keys: []string{"power"}},
		{ID: "trv", Address: "hall/climate/radiator", Keys: []string{"mode", "target"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDecodeTranslatesGoldenPayloads(t *testing.T) {
	p := newTestProtocol(t)
	for _, tc := range []struct {
		name, topic, file string
		want              []adapter.Report
	}{
		{"light", "living/room/light/ceiling/state", "light-state.json",
			[]adapter.Report{{Device: "ceiling", State: map[string]any{"power": "on", "brightness": int64(50), "color_temp": int64(2703)}}}},
		{"jammed lock", "hall/lock/front_door/state", "lock-jammed.txt",
			[]adapter.Report{{Device: "door", Failure: &adapter.Failure{Code: "jammed", Message: "the lock reports JAMMED"}}}},
		{"cover position", "hall/cover/blind/position/state", "cover-position.txt",
			[]adapter.Report{{Device: "blind", State: map[string]any{"position": int64(42)}}}},
		{"switch", "hall/switch/fan/state", "switch-on.txt", []adapter.Report{{Device: "fan", State: map[string]any{"power": "on"}}}},
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
	got, err := p.Decode(adapter.Message{Topic: "hall/status", Payload: []byte("offline")})
	if err != nil || len(got) != 4 {
		t.Fatalf("the node's will: %+v, %v; want its four entities offline", got, err)
	}
}

func TestCommandsPerComponent(t *testing.T) {
	p := newTestProtocol(t)
	for _, tc := range []struct {
		dev   string
		want  map[string]any
		topic string
		body  string
	}{
		{"ceiling", map[string]any{"power": "on", "brightness": 50}, "living/room/light/ceiling/command", `{"brightness":128,"state":"ON"}`},
		{"ceiling", map[string]any{"power": "off", "brightness": 50}, "living/room/light/ceiling/command", `{"state":"OFF"}`},
		{"door", map[string]any{"locked": false}, "hall/lock/front_door/command", "UNLOCK"},
		{"blind", map[string]any{"position": 30}, "hall/cover/blind/position/command", "30"},
		{"fan", map[string]any{"power": "off"}, "hall/switch/fan/command", "OFF"},
		{"trv", map[string]any{"target": 21.5}, "hall/climate/radiator/target_temperature/command", "21.5"},
	} {
		got, err := p.Command(tc.dev, tc.want, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].Topic != tc.topic || string(got[0].Payload) != tc.body {
			t.Errorf("Command(%s, %v) = %+v, want %s %s", tc.dev, tc.want, got, tc.topic, tc.body)
		}
	}
	if _, err := New([]adapter.Device{{ID: "x", Address: "node/fan/x", Keys: []string{"power"}}}); err == nil {
		t.Error("a component ESPHome's MQTT has no command for was accepted")
	}
}

func FuzzDecode(f *testing.F) {
	for _, name := range []string{"light-state.json", "lock-jammed.txt", "cover-position.txt", "switch-on.txt"} {
		for _, topic := range []string{"living/room/light/ceiling/state", "hall/lock/front_door/state", "hall/cover/blind/position/state", "hall/climate/radiator/target_temperature/state", "hall/status"} {
			f.Add(topic, golden(f, name))
		}
	}
	p := newTestProtocol(f)
	f.Fuzz(func(t *testing.T, topic string, payload []byte) {
		reports, err := p.Decode(adapter.Message{Topic: topic, Payload: payload})
		if err != nil && reports != nil {
			t.Fatalf("reports with an error: %v", err)
		}
		for _, r := range reports {
			if p.byID[r.Device] == nil {
				t.Fatalf("a report for %q", r.Device)
			}
		}
	})
}
