package api

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
)

// TestWaterfallNamesCommandAndDevice: the agent's chart carries what the
// hub's cannot, each step's command and device (a delay its kind), and
// draws a running mission's open bar up to now, a finished one's to its
// last event.
func TestWaterfallNamesCommandAndDevice(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 21, 0, 0, 0, time.UTC)
	params, _ := json.Marshal(map[string]any{"device": "front-door", "action": "lock"})
	m := &driver.Mission{
		ID: "m1", State: driver.StateStepRunning, Meta: driver.Metadata{Created: t0},
		Steps: []driver.Step{{ID: "1-delay", Kind: "delay", Params: json.RawMessage(`{"duration":"1s"}`)}, {ID: "2-front-door", Kind: "device.command", Params: params}},
	}
	evs := []driver.Event{
		{Input: driver.InBeginStep, Step: 0, Attempt: 1, Time: t0},
		{Input: driver.InStepOK, Step: 0, Attempt: 1, Time: t0.Add(time.Second)},
		{Input: driver.InBeginStep, Step: 1, Attempt: 1, Time: t0.Add(time.Second)},
	}
	now := t0.Add(3 * time.Second)
	c := Waterfall(m, evs, now)
	if b := c.Bars[0]; b.Command != "delay" || b.Device != "" {
		t.Errorf("delay bar = %+v, want its kind as the command", b)
	}
	if b := c.Bars[1]; b.Command != "lock" || b.Device != "front-door" || b.EndUS != 3e6 || b.Outcome != "running" {
		t.Errorf("lock bar = %+v, want lock of front-door running until now (3 s)", b)
	}
	m.State = driver.StateFailed
	if b := Waterfall(m, evs, now).Bars[1]; b.EndUS != 1e6 {
		t.Errorf("finished mission's open bar ends at %d µs, want its last event (1 s)", b.EndUS)
	}
}

// TestWaterfallNamesStepsAsTheHubDoes: a step's command and device in
// the agent's chart are those the mission's step table sends the hub
// (its Name and Target), so `agent missions show` and the dashboard
// name a step alike; a step stored before steps had a Name keeps its
// params' action.
func TestWaterfallNamesStepsAsTheHubDoes(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 6, 0, 0, 0, time.UTC)
	params, _ := json.Marshal(map[string]any{"device": "living-light", "action": "turn_on", "params": map[string]any{"brightness": 40}})
	old, _ := json.Marshal(map[string]any{"device": "front-door", "action": "lock"})
	m := &driver.Mission{
		ID: "m2", State: driver.StateSucceeded, Meta: driver.Metadata{Created: t0},
		Steps: []driver.Step{
			{ID: "1-living-light", Kind: "device.command", Name: "turn_on living-light brightness=40", Target: "living-light", Params: params},
			{ID: "2-delay", Kind: "delay", Name: "delay 1s", Params: json.RawMessage(`{"duration":"1s"}`)},
			{ID: "3-front-door", Kind: "device.command", Params: old},
		},
	}
	evs := []driver.Event{
		{Input: driver.InBeginStep, Step: 0, Attempt: 1, Time: t0},
		{Input: driver.InStepOK, Step: 0, Attempt: 1, Time: t0.Add(time.Millisecond)},
	}
	c := Waterfall(m, evs, t0)
	table := m.Summarize(true)
	for i, b := range c.Bars[:2] {
		if b.Command != table.StepNames[i] || b.Device != table.StepTargets[i] {
			t.Errorf("bar %d: command %q on %q, the hub's step table has %q on %q", i, b.Command, b.Device, table.StepNames[i], table.StepTargets[i])
		}
	}
	if b := c.Bars[2]; b.Command != "lock" || b.Device != "front-door" {
		t.Errorf("a step with no name: command %q on %q, want its params' lock on front-door", b.Command, b.Device)
	}
}
