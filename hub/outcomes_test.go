package hub

import (
	"context"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/uplink"
)

// TestOutcomesCountEachMissionOnce feeds the store finished missions of
// two gateways and two scenes over two days, a batch sent twice, a
// mission retried by an operator (failed, then running, then
// succeeded: counted once, as it ended) and a step that gave way, and
// reads the roll-up back by scope and range.
func TestOutcomesCountEachMissionOnce(t *testing.T) {
	st := testStore(t)
	now := time.Date(2026, 12, 6, 21, 30, 0, 0, time.UTC)
	// finished is mission id of scene, created at, lasting d, ending in
	// state with undone steps.
	finished := func(oseq uint64, id, scene string, seq uint64, at time.Time, d time.Duration, state driver.State, undone int) uplink.Entry {
		e := entry(oseq, id, seq, state)
		e.Mission.Scene, e.Mission.Created, e.Mission.Updated, e.Mission.Undone = scene, at.Add(-d), at, undone
		e.Mission.Finished = time.Time{}
		if state.Terminal() {
			e.Mission.Finished = at
		}
		e.Event.Time = at
		return e
	}
	h := func(d time.Duration) time.Time { return now.Add(-d) }
	a := batch("a",
		finished(1, "a1", "go_home", 1, h(30*time.Minute), 100*time.Millisecond, driver.StateSucceeded, 0),
		finished(2, "a2", "go_home", 1, h(40*time.Minute), 120*time.Millisecond, driver.StateSucceeded, 0),
		finished(3, "a3", "go_home", 1, h(2*time.Hour), 2*time.Second, driver.StateFailed, 2),
		finished(4, "a4", "movie", 1, h(26*time.Hour), time.Second, driver.StateFailed, 0),
		finished(5, "a5", "movie", 1, h(50*time.Minute), time.Second, driver.StateCancelled, 0),
	)
	gaveWay := finished(6, "a6", "movie", 1, h(20*time.Minute), 0, driver.StateRunning, 0)
	gaveWay.Event.Input, gaveWay.Event.Code, gaveWay.Event.Step = driver.InStepError, driver.CodeSuperseded, 0
	a.Entries = append(a.Entries, gaveWay)
	b := batch("b",
		finished(1, "b1", "go_home", 1, h(10*time.Minute), 400*time.Millisecond, driver.StateFailed, 0),
		finished(2, "b1", "go_home", 2, h(9*time.Minute), 0, driver.StateRunning, 0), // an operator's retry
		finished(3, "b1", "go_home", 3, h(5*time.Minute), 500*time.Millisecond, driver.StateSucceeded, 0),
	)
	b.Entries[1].Mission.Created, b.Entries[2].Mission.Created = b.Entries[0].Mission.Created, b.Entries[0].Mission.Created
	for _, in := range []struct {
		gw string
		b  uplink.Batch
	}{{"a", a}, {"a", a}, {"b", batch("b", b.Entries[0])}, {"b", batch("b", b.Entries[1:]...)}} {
		if _, err := ingest(st, now, in.gw, in.b); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	read := func(gw, scene, rng, step string) Outcomes {
		t.Helper()
		o, err := BuildOutcomes(ctx, st, gw, scene, rng, step, now)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	type counts struct{ finished, succeeded, failed, undone, cancelled, superseded int64 }
	of := func(b OutcomeBucket) counts {
		return counts{b.Finished, b.Succeeded, b.Failed, b.Undone, b.Cancelled, b.Superseded}
	}
	for _, c := range []struct {
		name, gw, scene, rng string
		want                 counts
		buckets              int
	}{
		{"everything, a day", "", "", "24h", counts{5, 3, 0, 1, 1, 1}, 24},
		{"everything, a week", "", "", "7d", counts{6, 3, 1, 1, 1, 1}, 7},
		{"gateway a, a week", "a", "", "7d", counts{5, 2, 1, 1, 1, 1}, 7},
		{"gateway b, retried and succeeded once", "b", "", "24h", counts{1, 1, 0, 0, 0, 0}, 24},
		{"scene movie, a month", "", "movie", "30d", counts{2, 0, 1, 0, 1, 1}, 30},
	} {
		o := read(c.gw, c.scene, c.rng, "")
		if got := of(o.Total); got != c.want || len(o.Buckets) != c.buckets {
			t.Errorf("%s: total %+v in %d buckets, want %+v in %d", c.name, got, len(o.Buckets), c.want, c.buckets)
		}
		var sum counts
		for _, bk := range o.Buckets {
			x := of(bk)
			sum = counts{sum.finished + x.finished, sum.succeeded + x.succeeded, sum.failed + x.failed, sum.undone + x.undone, sum.cancelled + x.cancelled, sum.superseded + x.superseded}
		}
		if sum != of(o.Total) {
			t.Errorf("%s: buckets add up to %+v, total %+v", c.name, sum, of(o.Total))
		}
	}
	// The last hour holds the two missions that ended in it: a1 (100 ms)
	// and the retried b1 (created 10 min ago, done 5 min ago: 300.4 s),
	// each percentile within the histogram's 19%.
	day := read("", "", "24h", "")
	last := day.Buckets[23]
	if !last.Start.Equal(now.Truncate(time.Hour)) || last.Finished != 2 || last.Superseded != 1 {
		t.Errorf("last hour = %+v, want 2 missions and a step that gave way from %s", last, now.Truncate(time.Hour))
	}
	near := func(got, want float64) bool { return got > want/1.19 && got < want*1.19 }
	if !near(last.P50MS, 100) || !near(last.P95MS, 300400) {
		t.Errorf("last hour p50 %v ms, p95 %v ms; want about 100 ms and 300.4 s", last.P50MS, last.P95MS)
	}
	if o := read("", "", "7d", "hour"); len(o.Buckets) != 168 {
		t.Errorf("7d by hour: %d buckets, want 168", len(o.Buckets))
	}
	for _, bad := range [][4]string{{"a", "movie", "24h", ""}, {"", "", "1y", ""}, {"", "", "24h", "minute"}} {
		if _, err := BuildOutcomes(ctx, st, bad[0], bad[1], bad[2], bad[3], now); err == nil {
			t.Errorf("BuildOutcomes%v: no error", bad)
		}
	}
	// Pruning keeps 35 days of rows.
	if _, err := st.Prune(ctx, now.Add(36*24*time.Hour), Retention{}); err != nil {
		t.Fatal(err)
	}
	if rows, err := st.OutcomeHours(ctx, scopeAll(), 0, now.Unix()/3600+1); err != nil || len(rows) != 0 {
		t.Errorf("after pruning 36 days on: %d rows (%v), want none", len(rows), err)
	}
}
