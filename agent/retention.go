package agent

import (
	"context"
	"time"

	"github.com/sortie-edge/sortie/store"
)

// retention deletes finished missions by the policy of prune, in the
// background; the store prunes in small transactions so the loop's
// commits are never held up for long.
func (a *Agent) retention(ctx context.Context) error {
	// Trigger records are always bounded (TraceOptions has defaults), so
	// the loop runs without a mission retention too.
	interval := a.opts.Retention.Interval
	if interval <= 0 {
		interval = tracePruneInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		a.pruneOnce(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (a *Agent) pruneOnce(ctx context.Context) {
	to := a.opts.Traces
	if n, err := a.db.PruneTraces(ctx, store.TraceLimits{MaxAge: to.MaxAge, FailedMaxAge: to.FailedMaxAge, MaxBytes: to.MaxBytes}, a.opts.Clock.Now()); err != nil {
		a.log.Error("retention: trigger traces", "err", err)
	} else if n > 0 {
		a.metrics.prunedTraces(n)
		a.log.Info("retention deleted trigger traces", "count", n)
	}
	if r := a.opts.Retention; r.Interval <= 0 || r.MaxAge <= 0 && r.MaxCount <= 0 && r.MaxBytes <= 0 {
		return
	}
	n, err := prune(ctx, a.db, a.opts.Retention, time.Now())
	if err != nil {
		a.log.Error("retention", "err", err)
	}
	if n > 0 {
		// The metrics heard of each deletion from the store (OnPrune).
		a.log.Info("retention deleted finished missions", "count", n)
	}
	if err := reclaim(ctx, a.db, a.opts.Retention.MaxBytes); err != nil {
		a.log.Error("retention: giving space back", "err", err)
	}
}

// tracePruneInterval is how often trigger records are pruned when the
// missions' retention does not run.
const tracePruneInterval = 10 * time.Minute

// reclaimFloor: a file smaller than this is not worth rewriting.
const reclaimFloor = 1 << 20

// reclaim rewrites the store without its free pages when they are half
// the file or more, or when the file is over maxBytes and a quarter of it
// is free: bbolt reuses free pages, so under a steady retention the file
// stays flat (a little over its data) and this is for after a burst, or a
// tighter retention. Each rewrite writes the whole file to flash, so the
// thresholds are far from the free pages a steady state keeps.
func reclaim(ctx context.Context, db *store.DB, maxBytes int64) error {
	st, err := db.Stats()
	if err != nil {
		return err
	}
	over := maxBytes > 0 && st.FileSize > maxBytes && st.FreeBytes*4 >= st.FileSize
	if st.FileSize < reclaimFloor || !over && st.FreeBytes*2 < st.FileSize {
		return nil
	}
	_, _, err = db.Reclaim(ctx)
	return err
}

// prune applies the retention policy: a finished mission is deleted when
// it is older than max_age, when more than max_count finished missions
// are stored, or while the data is over max_bytes (oldest first). The
// count and the bytes are hard caps so that a busy gateway's database
// stays bounded on small flash, whatever the age.
func prune(ctx context.Context, db *store.DB, r RetentionOptions, now time.Time) (int, error) {
	total := 0
	if r.MaxAge > 0 {
		n, err := db.Prune(ctx, now.Add(-r.MaxAge), 0)
		total += n
		if err != nil {
			return total, err
		}
	}
	if r.MaxCount > 0 {
		// Everything finished up to now is a candidate; keep the newest.
		n, err := db.Prune(ctx, now.Add(time.Second), r.MaxCount)
		total += n
		if err != nil {
			return total, err
		}
	}
	if r.MaxBytes > 0 {
		// To 90%: room for the missions of the next interval, so that
		// the file, at its data plus the pages bbolt keeps free, is not
		// over the budget again at once.
		n, err := db.PruneBytes(ctx, r.MaxBytes/10*9)
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}
