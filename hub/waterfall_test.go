package hub

import (
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver/waterfall"
)

// TestMissionDetailHasWaterfall reads a compensated mission from the API:
// its waterfall has a bar per step, in order, then the five undos in the
// order they ran (reverse), all after the failure, and its total is the
// mission's length.
func TestMissionDetailHasWaterfall(t *testing.T) {
	e := newEnv(t, "home")
	g := newGateway(t, e.broker.URL(), "home")
	g.online(t)
	e.waitOnline(t, "home")
	t0 := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	entries := compensatedMission("m-undone", t0)
	g.send(t, entries...)
	g.waitAck(t, uint64(len(entries)))

	var d Detail
	if code := e.do(t, "GET", "/api/gateways/home/missions/m-undone", "", &d); code != 200 {
		t.Fatalf("GET mission: %d", code)
	}
	w := d.Waterfall
	if w == nil {
		t.Fatal("the mission detail has no waterfall")
	}
	want := []struct {
		step    int
		undo    bool
		outcome string
	}{
		{0, false, "succeeded"}, {1, false, "succeeded"}, {2, false, "succeeded"}, {3, false, "succeeded"}, {4, false, "succeeded"}, {5, false, "failed"},
		{4, true, waterfall.OutcomeUndone}, {3, true, waterfall.OutcomeUndone}, {2, true, waterfall.OutcomeUndone}, {1, true, waterfall.OutcomeUndone}, {0, true, waterfall.OutcomeUndone},
	}
	if len(w.Bars) != len(want) {
		t.Fatalf("%d bars, want %d: %+v", len(w.Bars), len(want), w.Bars)
	}
	for i, b := range w.Bars {
		if b.Step != want[i].step || b.Undo != want[i].undo || b.Outcome != want[i].outcome || b.ID != d.Summary.StepIDs[b.Step] {
			t.Errorf("bar %d = step %d %s undo=%v %s, want step %d undo=%v %s", i, b.Step, b.ID, b.Undo, b.Outcome, want[i].step, want[i].undo, want[i].outcome)
		}
		if b.Undo && b.StartUS < w.FailedUS {
			t.Errorf("undo of step %d starts at %d µs, before the failure at %d", b.Step, b.StartUS, w.FailedUS)
		}
	}
	if got := w.Bars[1].Segments; len(got) != 3 || got[1].Kind != waterfall.KindWait || got[1].Why != waterfall.WhyDelay {
		t.Errorf("the delay step's segments = %+v, want a run, its wait, a run", got)
	}
	last := entries[len(entries)-1].Event.Time
	if total := time.Duration(w.TotalUS) * time.Microsecond; total != last.Sub(t0) {
		t.Errorf("total = %s, want the mission's %s", total, last.Sub(t0))
	}
}
