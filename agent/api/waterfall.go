package api

import (
	"cmp"
	"time"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/driver/waterfall"
)

// Waterfall is the chart of m's timeline (docs/api.md, "waterfall"),
// with each step's command and device: its Name and Target, the ones
// the hub has in the mission's step table, so the two charts say the
// same. A step stored before steps had a Name is named by its params'
// action (or its kind) and device. A step still running or waiting is
// drawn up to now.
func Waterfall(m *driver.Mission, evs []driver.Event, now time.Time) *waterfall.Chart {
	steps := make([]waterfall.Step, len(m.Steps))
	for i, st := range m.Steps {
		name, dev := st.Name, st.Target
		if name == "" {
			var action string
			dev, action = devices.ParamsTarget(st.Params)
			name = cmp.Or(action, st.Kind)
		}
		steps[i] = waterfall.Step{ID: st.ID, Command: name, Device: dev}
	}
	if m.State.Terminal() {
		now = time.Time{}
	}
	c := waterfall.Build(steps, evs, m.Meta.Created, now)
	return &c
}
