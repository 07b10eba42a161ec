package agent

import (
	"context"
	"log/slog"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/scenes"
	"github.com/sortie-edge/sortie/store"
)

// terminalCounts counts finished missions by state, for the gauge, from
// the counts the store keeps (no walk of the history).
func terminalCounts(ctx context.Context, db *store.DB) (map[driver.State]int, error) {
	all, err := db.StateCounts(ctx)
	if err != nil {
		return nil, err
	}
	counts := map[driver.State]int{}
	for s, n := range all {
		if s.Terminal() {
			counts[s] = n
		}
	}
	return counts, nil
}

// logObserver writes one structured log line per meaningful transition,
// with mission and trace IDs, so logs can be joined with the hub and
// device logs.
type logObserver struct{ log *slog.Logger }

func (o logObserver) Observe(ev driver.Event, m *driver.Mission) {
	lvl, msg := slog.LevelDebug, "transition"
	switch {
	case ev.Input == driver.InStepWait:
		// Waiting is normal (a delay step, an offline device); say so
		// quietly.
		lvl, msg = slog.LevelInfo, "step waiting"
		if ev.Code == scenes.DelayCode {
			lvl = slog.LevelDebug
		}
	case ev.Input == driver.InStepError:
		lvl, msg = slog.LevelWarn, "step failed"
	case ev.To.Terminal():
		lvl, msg = slog.LevelInfo, "mission finished"
		if ev.To != driver.StateSucceeded {
			lvl = slog.LevelWarn
		}
	case ev.Input == driver.InCompResult && ev.Error != "":
		lvl, msg = slog.LevelWarn, "compensation attempt failed"
	}
	// Checked before the record is built: this runs for every transition,
	// and building the record costs more than the rest of the observer.
	if !o.log.Enabled(context.Background(), lvl) {
		return
	}
	args := []any{"mission", m.ID, "trace", m.Meta.TraceID, "scene", m.Type}
	switch msg {
	case "step waiting":
		args = append(args, "step", ev.StepID, "code", ev.Code, "reason", ev.Error)
	case "step failed":
		args = append(args, "step", ev.StepID, "attempt", ev.Attempt, "class", ev.Detail, "code", ev.Code, "err", ev.Error)
	case "mission finished":
		args = append(args, "state", ev.To, "reason", m.Reason, "err", m.Error)
	case "compensation attempt failed":
		args = append(args, "step", ev.StepID, "err", ev.Error)
	default:
		args = append(args, "input", ev.Input, "from", ev.From, "to", ev.To, "step", ev.StepID, "attempt", ev.Attempt)
	}
	o.log.Log(context.Background(), lvl, msg, args...)
}

// deviceTypes maps device IDs to their types, for metric labels.
func deviceTypes(reg *devices.Registry) map[string]string {
	out := make(map[string]string, len(reg.Devices))
	for _, d := range reg.Devices {
		out[d.ID] = d.Type
	}
	return out
}
