package hub

import (
	"time"

	"github.com/sortie-edge/sortie/driver/waterfall"
)

// withWaterfall adds the chart of d's timeline (docs/hub.md, "The
// mission's waterfall"). Each step's command and device are its Name
// and Target in the mission's step table (absent from older gateways,
// whose bars are labelled by their IDs only). An unfinished
// mission's open bars are drawn up to now, the hub's clock, which is the
// gateway's give or take their skew.
func withWaterfall(d *Detail, now time.Time) {
	steps := make([]waterfall.Step, max(d.Summary.Steps, len(d.Summary.StepIDs)))
	for i := range steps {
		if i < len(d.Summary.StepIDs) {
			steps[i].ID = d.Summary.StepIDs[i]
		}
		if i < len(d.Summary.StepNames) {
			steps[i].Command = d.Summary.StepNames[i]
		}
		if i < len(d.Summary.StepTargets) {
			steps[i].Device = d.Summary.StepTargets[i]
		}
	}
	if d.Summary.State.Terminal() {
		now = time.Time{}
	}
	c := waterfall.Build(steps, d.Timeline, d.Summary.Created, now)
	d.Waterfall = &c
}
