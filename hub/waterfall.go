package hub

import (
	"time"

	"github.com/sortie-edge/sortie/driver/waterfall"
)

// withWaterfall adds the chart of d's timeline (docs/hub.md, "The
// mission's waterfall"). The hub knows the steps by their IDs only: the
// gateway's summaries carry no commands or devices. An unfinished
// mission's open bars are drawn up to now, the hub's clock, which is the
// gateway's give or take their skew.
func withWaterfall(d *Detail, now time.Time) {
	steps := make([]waterfall.Step, max(d.Summary.Steps, len(d.Summary.StepIDs)))
	for i := range steps {
		if i < len(d.Summary.StepIDs) {
			steps[i].ID = d.Summary.StepIDs[i]
		}
	}
	if d.Summary.State.Terminal() {
		now = time.Time{}
	}
	c := waterfall.Build(steps, d.Timeline, d.Summary.Created, now)
	d.Waterfall = &c
}
