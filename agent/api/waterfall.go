package api

import (
	"time"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/driver/waterfall"
)

// Waterfall is the chart of m's timeline (docs/api.md, "waterfall"),
// with each step's command and device, which only the agent knows. A
// step still running or waiting is drawn up to now.
func Waterfall(m *driver.Mission, evs []driver.Event, now time.Time) *waterfall.Chart {
	steps := make([]waterfall.Step, len(m.Steps))
	for i, st := range m.Steps {
		dev, action := devices.ParamsTarget(st.Params)
		if action == "" && dev == "" {
			action = st.Kind
		}
		steps[i] = waterfall.Step{ID: st.ID, Command: action, Device: dev}
	}
	if m.State.Terminal() {
		now = time.Time{}
	}
	c := waterfall.Build(steps, evs, m.Meta.Created, now)
	return &c
}
