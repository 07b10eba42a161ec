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
