package main

import (
	"context"
	"time"
)

// retention deletes finished missions older than max_age beyond the
// newest max_count, in the background; the store prunes in small
// transactions so the loop's commits are never held up for long.
func (a *agent) retention(ctx context.Context) error {
	r := a.cfg.Retention
	if r.Interval <= 0 || (r.MaxAge <= 0 && r.MaxCount <= 0) {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(r.Interval.D())
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

func (a *agent) pruneOnce(ctx context.Context) {
	r := a.cfg.Retention
	cutoff := time.Now()
	if r.MaxAge > 0 {
		cutoff = cutoff.Add(-r.MaxAge.D())
	}
	n, err := a.db.Prune(ctx, cutoff, r.MaxCount)
	if err != nil {
		a.log.Error("retention", "err", err)
		return
	}
	if n > 0 {
		a.log.Info("retention deleted finished missions", "count", n)
		if counts, err := terminalCounts(ctx, a.db); err == nil {
			a.metrics.setTerminal(counts)
		}
	}
}
