package driver

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Every Wake (the agent calls it on every device state report) re-runs
// every not-ready step, e.g. a delay, and commits two events each time.
func TestReviewWakeAmplifiesTimeline(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{})
	sc.do["wait"] = func(req StepRequest) (map[string]any, error) { // like scenes.DelayHandler
		if rem := req.Started.Add(2 * time.Minute).Sub(clk.Now()); rem > 0 {
			return nil, NotReadyError("delay", rem, errors.New("left"))
		}
		return nil, nil
	}
	m := submit(t, d, Spec{Type: "t", Steps: steps("wait")})
	d.Step(context.Background())
	for range 120 { // a sensor reporting once a second
		clk.Advance(time.Second)
		d.Wake("sensor")
		d.Step(context.Background())
	}
	drain(t, d, clk)
	evs, _ := d.Timeline(context.Background(), m.ID)
	got := get(t, d, m.ID)
	t.Logf("state %s, %d events, waits %d for one 2-minute delay", got.State, len(evs), got.Results[0].Waits)
	if len(evs) > 20 {
		t.Errorf("timeline grows with device chatter: %d events", len(evs))
	}
}
