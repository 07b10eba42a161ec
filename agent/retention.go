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
	r := a.opts.Retention
	if r.Interval <= 0 || (r.MaxAge <= 0 && r.MaxCount <= 0) {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(r.Interval)
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
	n, err := prune(ctx, a.db, a.opts.Retention, time.Now())
	if err != nil {
		a.log.Error("retention", "err", err)
	}
	if n > 0 {
		a.log.Info("retention deleted finished missions", "count", n)
		if counts, err := terminalCounts(ctx, a.db); err == nil {
			a.metrics.setTerminal(counts)
		}
	}
}

// prune applies the retention policy: a finished mission is deleted when
// it is older than max_age, or when more than max_count finished missions
// are stored (oldest first). The count is a hard cap so that a busy
// gateway's database stays bounded on small flash, whatever the age.
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
	return total, nil
}
