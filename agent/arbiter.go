package agent

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
)

// arbiter carries the device handlers' arbitrations between missions
// (a device taken over, a step queued, skipped or superseded, an undo
// left alone) onto both missions' timelines, and tells the handlers when
// a mission ends so that the steps queued behind it go on.
type arbiter struct {
	log     *slog.Logger
	drv     *driver.Driver
	hs      *devices.Handlers
	q       chan devices.Conflict
	dropped atomic.Int64
}

// arbiterQueue bounds the notes waiting to be written; a burst beyond it
// loses notes (logged), never a mission's own outcome, which its step's
// event records.
const arbiterQueue = 1024

func newArbiter(log *slog.Logger, drv *driver.Driver) *arbiter {
	return &arbiter{log: log, drv: drv, q: make(chan devices.Conflict, arbiterQueue)}
}

// conflict is HandlerOptions.OnConflict: it must not block.
func (a *arbiter) conflict(c devices.Conflict) {
	select {
	case a.q <- c:
	default:
		if a.dropped.Add(1)%100 == 1 {
			a.log.Warn("arbitration notes dropped: queue full", "dropped", a.dropped.Load())
		}
	}
}

// Observe frees a finished mission's devices.
func (a *arbiter) Observe(ev driver.Event, m *driver.Mission) {
	if ev.To.Terminal() && ev.From != ev.To && a.hs != nil {
		a.hs.Ended(m.ID)
	}
}

// Run writes the notes until ctx ends.
func (a *arbiter) Run(ctx context.Context) error {
	for {
		select {
		case c := <-a.q:
			a.note(ctx, c)
		case <-ctx.Done():
			return nil
		}
	}
}

// note writes one arbitration on the timelines: the deciding mission's
// own step event already says what happened to its step, so each side
// gets what it would not otherwise know.
func (a *arbiter) note(ctx context.Context, c devices.Conflict) {
	type line struct {
		id   string
		step int
		text string
	}
	var lines []line
	switch c.Kind {
	case devices.ConflictTookOver:
		lines = []line{
			{c.Mission, c.Step, fmt.Sprintf("took %s over from mission %s", c.Device, c.Other)},
			{c.Other, -1, fmt.Sprintf("%s taken over by newer mission %s; a step of this mission not yet sent to it will end superseded", c.Device, c.Mission)},
		}
	case devices.ConflictQueued:
		lines = []line{
			{c.Mission, c.Step, fmt.Sprintf("waits for mission %s to release %s", c.Other, c.Device)},
			{c.Other, -1, fmt.Sprintf("mission %s waits for %s until this mission ends", c.Mission, c.Device)},
		}
	case devices.ConflictSkipped:
		lines = []line{{c.Other, -1, fmt.Sprintf("mission %s skipped %s, held by this mission", c.Mission, c.Device)}}
	case devices.ConflictGaveWay:
		lines = []line{{c.Other, -1, fmt.Sprintf("a step of older mission %s on %s gave way to this mission", c.Mission, c.Device)}}
	case devices.ConflictLeftAlone:
		lines = []line{{c.Other, -1, fmt.Sprintf("older mission %s left %s to this mission rather than undo it", c.Mission, c.Device)}}
	}
	for _, l := range lines {
		if err := a.drv.Note(ctx, l.id, l.step, l.text); err != nil && ctx.Err() == nil {
			a.log.Warn("arbitration note", "mission", l.id, "err", err)
		}
	}
}

// seedOwners tells the handlers which missions changed which devices
// before this start (their steps that succeeded): the live missions, and
// those created since the oldest live one (a newer mission that has since finished still means an
// older one's undo must leave its devices alone). Oldest first, so the
// newest owner wins.
func seedOwners(ctx context.Context, hs *devices.Handlers, st driver.Reader, active []*driver.Mission) error {
	if len(active) == 0 {
		return nil
	}
	oldest := active[0].Meta.Created
	for _, m := range active {
		if m.Meta.Created.Before(oldest) {
			oldest = m.Meta.Created
		}
	}
	var all []*driver.Mission
	for cursor := ""; ; {
		page, next, err := st.List(ctx, driver.Filter{Since: oldest, After: cursor, Limit: 500})
		if err != nil {
			return fmt.Errorf("seed device owners: %w", err)
		}
		all = append(all, page...)
		if next == "" {
			break
		}
		cursor = next
	}
	for i := len(all) - 1; i >= 0; i-- { // List is newest first
		m := all[i]
		for k, s := range m.Steps {
			// Only changes known to be on the device: a step begun but not
			// finished is sent again, and claims its device then.
			if s.Kind != devices.KindCommand || k >= len(m.Results) || m.Results[k].Status != driver.StepSucceeded {
				continue
			}
			if dev, _ := devices.RanTarget(s, m.Results[k].Outputs); dev != "" {
				hs.Seed(dev, m.ID, m.Type, m.Meta.Created, m.State.Terminal())
			}
		}
	}
	return nil
}
