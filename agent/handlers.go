package agent

import (
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/scenes"
)

// registerHandlers plugs the step kinds scenes produce into the driver.
func registerHandlers(a *Agent) {
	a.arb = newArbiter(a.log.With("component", "arbiter"), a.drv)
	hs := devices.NewHandlers(a.dev, a.reg, devices.HandlerOptions{OnTurn: a.metrics.turn, OnConflict: a.arb.conflict})
	a.arb.hs = hs
	a.metrics.watchLinks(hs.Links)
	hs.Register(func(kind string, h driver.Handler) {
		if kind == devices.KindCommand {
			h = a.metrics.instrument(h)
		}
		a.drv.Register(kind, h)
	})
	a.drv.Register(scenes.DelayKind, scenes.DelayHandler{})
	for kind, h := range a.opts.Handlers {
		a.drv.Register(kind, h)
	}
}
