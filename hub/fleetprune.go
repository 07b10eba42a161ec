package hub

import "time"

// Retention of ended rollouts, by default: the engine holds every
// rollout it keeps in memory with each of its gateways, so a hub that
// never forgot would load them all at every start.
const (
	defaultKeepRollouts         = 90 * 24 * time.Hour
	defaultKeepRolloutsPerGroup = 50
	// forgetPerStep bounds the rollouts one step deletes (each with up
	// to every gateway of the fleet).
	forgetPerStep = 4
)

// prune forgets ended rollouts past retention: those that ended more
// than KeepRollouts ago, and those beyond the newest
// KeepRolloutsPerGroup of their group. The newest rollout of a group
// is always kept (rollout IDs then never go back after a restart), and
// so is a rollout still active or following its target. The records go
// with the next write, a few rollouts at a time.
func (f *Fleet) prune(now time.Time) {
	cutoff := now.Add(-f.o.KeepRollouts)
	seen := map[string]int{}
	kept := f.order[:0]
	var gone []*rolloutRun
	for i := len(f.order) - 1; i >= 0; i-- {
		run := f.order[i]
		r := run.r
		seen[r.Spec.Group]++
		n := seen[r.Spec.Group]
		if n > 1 && !r.active() && !r.Following && (r.Ended.Before(cutoff) || n > f.o.KeepRolloutsPerGroup) {
			gone = append(gone, run)
		}
	}
	if len(gone) == 0 {
		return
	}
	if len(gone) > forgetPerStep {
		// The oldest first, a few per step: a long history (the first
		// start after an upgrade) must not make one write too big to pass.
		gone = gone[len(gone)-forgetPerStep:]
	}
	forget := make(map[*rolloutRun]bool, len(gone))
	for _, run := range gone {
		forget[run] = true
		delete(f.runs, run.r.ID)
		delete(f.dirtyR, run.r)
		for _, t := range run.targets {
			delete(f.dirtyT, t)
			for _, c := range []string{t.Control, t.BackControl} {
				if ref, ok := f.controls[c]; ok && ref.run == run {
					delete(f.controls, c)
				}
			}
		}
		f.forget = append(f.forget, run.r.ID)
	}
	for _, run := range f.order {
		if !forget[run] {
			kept = append(kept, run)
		}
	}
	clear(f.order[len(kept):])
	f.order = kept
	f.log.Info("rollouts: forgot ended rollouts past retention", "count", len(gone))
}
