package view

import (
	"testing"
	"time"

	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/devices/adapter"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/scenes"
)

func TestRenderList(t *testing.T) {
	list := api.MissionList{
		Missions: []api.MissionItem{
			{ID: "0195508a1f400003c0ffee00", Scene: "go_home", State: driver.StateStepRunning, Step: 1, Steps: 3, Done: 1, Source: "alexa", Created: at(60000)},
			{ID: "0195508a1f400002c0ffee00", Scene: "movie_night", State: driver.StateFailed, Step: 2, Steps: 5, Done: 2, Undone: 2, Source: "cli", Created: at(30000), Finished: at(34310),
				Error: "step 3-front-door failed: gave up after 3 attempts: device jammed; compensation of 2-living-ac failed: ack timeout"},
			{ID: "0195508a1f400001c0ffee00", Scene: "go_home", State: driver.StateSucceeded, Step: 3, Steps: 3, Done: 3, Created: t0, Finished: at(1250)},
		},
		NextCursor: "0000000000000007",
	}
	golden(t, "list.golden", List(list, time.UTC, " -state FAILED -limit 3"))
	if got := List(api.MissionList{}, time.UTC, ""); got != "no missions\n" {
		t.Errorf("empty list: %q", got)
	}
}

func TestControlLine(t *testing.T) {
	for _, c := range []struct {
		action string
		it     api.MissionItem
		want   string
	}{
		{"cancel", api.MissionItem{ID: "m", State: driver.StateCompensating, Control: driver.Control{Cancel: true}}, "mission m: cancelled; undoing its completed steps (COMPENSATING)"},
		{"cancel", api.MissionItem{ID: "m", State: driver.StateStepRunning, Control: driver.Control{Cancel: true}}, "mission m: cancel requested; it stops when the running step ends (STEP_RUNNING)"},
		{"cancel", api.MissionItem{ID: "m", State: driver.StateCancelled}, "mission m: CANCELLED"},
		{"pause", api.MissionItem{ID: "m", State: driver.StateStepRunning, Control: driver.Control{Pause: true}}, "mission m: pause requested; it holds when the running step ends (STEP_RUNNING)"},
	} {
		if got := ControlLine(c.action, c.it); got != c.want {
			t.Errorf("ControlLine(%s, %s) = %q, want %q", c.action, c.it.State, got, c.want)
		}
	}
}

func TestRenderDevicesAndScenes(t *testing.T) {
	devs := api.DeviceList{Connected: true, Devices: []api.DeviceItem{
		{ID: "living-light", Type: "light", Room: "living", Name: "Living room light", Available: true, State: map[string]any{"power": "on", "brightness": 80}},
		{ID: "front-door", Type: "lock", Available: false},
	}, Announced: []devices.Announcement{
		{Found: adapter.Found{Protocol: "zigbee2mqtt", Address: "Porch/Light", Kind: "light", Name: "Porch/Light"}},
		{Found: adapter.Found{Protocol: "zigbee2mqtt", Address: "Hall/Bulb", Kind: "light"}, Device: "hall-bulb", Gone: true,
			Since: time.Date(2026, 12, 6, 21, 4, 0, 0, time.UTC)},
	}}
	sl := api.SceneList{Scenes: []api.SceneItem{
		{Name: "go_home", Mode: scenes.ModeRestart, Priority: 60, Deadline: driver.Duration(2 * time.Minute), Steps: 3,
			Description: "Welcome home.", Params: []api.SceneParam{{Name: "temperature", Default: 24}, {Name: "room", Required: true}}},
		{Name: "good_night", Mode: scenes.ModeSingle, Priority: 70, Deadline: driver.Duration(3 * time.Minute), Steps: 6, Params: []api.SceneParam{}},
	}}
	golden(t, "devices_scenes.golden", Devices(devs)+"\n"+Scenes(sl))
}
