package store

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sortie-edge/sortie/driver"
)

// finish stores a terminal mission that finished at t0 plus i minutes,
// with a request key and three events.
func finish(tb testing.TB, db *DB, i int) {
	tb.Helper()
	if err := tryFinish(db, i); err != nil {
		tb.Fatal(err)
	}
}

// tryFinish is finish for goroutines other than the test's.
func tryFinish(db *DB, i int) error {
	ctx := context.Background()
	m := newMission(mid(i))
	m.Meta.RequestKey = "req-" + mid(i)
	if _, _, err := db.Create(ctx, m, []driver.Event{event(m, 1, driver.StatePending)}); err != nil {
		return err
	}
	for _, to := range []driver.State{driver.StateRunning, driver.StateSucceeded} {
		next, evs := advance(m, to)
		next.Meta.Finished = t0.Add(time.Duration(i) * time.Minute)
		if err := db.Save(ctx, next, evs); err != nil {
			return err
		}
		m = next
	}
	return nil
}

func stored(tb testing.TB, db *DB) []string {
	tb.Helper()
	page, _, err := db.List(context.Background(), driver.Filter{Limit: MaxLimit})
	if err != nil {
		tb.Fatal(err)
	}
	got := ids(page)
	slices.Sort(got)
	return got
}

func TestPrune(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		olderThan time.Duration // after t0
		keep      int
		want      []int // surviving finished missions
	}{
		{"age decides", 4 * time.Minute, 0, []int{4, 5, 6, 7, 8, 9}},
		{"keep decides", 10 * time.Minute, 3, []int{7, 8, 9}},
		{"both", 6 * time.Minute, 2, []int{6, 7, 8, 9}},
		{"keep all", time.Hour, 10, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
		{"keep more than exist", time.Hour, 50, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
		{"nothing old", -time.Minute, 0, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
		{"everything", time.Hour, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := openTest(t)
			for i := range 10 {
				finish(t, db, i)
			}
			live := newMission("live") // never pruned, however old
			live.Meta.Created = t0.Add(-time.Hour)
			mustCreate(t, db, live)

			n, err := db.Prune(ctx, t0.Add(tc.olderThan), tc.keep)
			if err != nil {
				t.Fatal(err)
			}
			if n != 10-len(tc.want) {
				t.Errorf("Prune deleted %d, want %d", n, 10-len(tc.want))
			}
			want := []string{"live"}
			for _, i := range tc.want {
				want = append(want, mid(i))
			}
			slices.Sort(want)
			if got := stored(t, db); !slices.Equal(got, want) {
				t.Errorf("left %v, want %v", got, want)
			}
			s, _ := db.Stats()
			if s.Missions != len(want) || s.Finished != len(tc.want) || s.Active != 1 ||
				s.Requests != len(tc.want) || s.Events != 3*len(tc.want)+1 {
				t.Errorf("Stats = %+v", s)
			}
			// A pruned mission is gone everywhere; its request key is free.
			for i := range 10 {
				if slices.Contains(tc.want, i) {
					continue
				}
				if _, err := db.Timeline(ctx, mid(i)); !errors.Is(err, driver.ErrNotFound) {
					t.Errorf("Timeline(%s) = %v", mid(i), err)
				}
				again := newMission("again-" + mid(i))
				again.Meta.RequestKey = "req-" + mid(i)
				if _, created, err := db.Create(ctx, again, nil); err != nil || !created {
					t.Errorf("Create with pruned key: created %v, %v", created, err)
				}
			}
		})
	}
}

// TestPruneBatches prunes more missions than one transaction takes, with
// writers running alongside.
func TestPruneBatches(t *testing.T) {
	db := openTest(t)
	ctx := context.Background()
	const n = 3*pruneBatch + 5
	var g errgroup.Group
	for i := range n {
		g.Go(func() error { return tryFinish(db, i) })
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	live := newMission("live")
	mustCreate(t, db, live)

	stop := make(chan struct{})
	saver := make(chan error, 1)
	go func() { // saves keep committing while Prune runs
		m := live
		for {
			select {
			case <-stop:
				saver <- nil
				return
			default:
			}
			next, evs := advance(m, driver.StateRunning)
			if err := db.Save(ctx, next, evs); err != nil {
				saver <- err
				return
			}
			m = next
		}
	}()
	deleted, err := db.Prune(ctx, t0.Add(time.Duration(n)*time.Minute), 10)
	close(stop)
	if err := <-saver; err != nil {
		t.Errorf("save during prune: %v", err)
	}
	if err != nil || deleted != n-10 {
		t.Fatalf("Prune = %d, %v; want %d", deleted, err, n-10)
	}
	if got := len(stored(t, db)); got != 11 {
		t.Errorf("%d missions left, want 11", got)
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := db.Prune(cctx, t0.Add(time.Hour*24), 0); !errors.Is(err, context.Canceled) {
		t.Errorf("Prune(cancelled) = %v", err)
	}
	if n, err := db.Prune(ctx, time.Time{}, 0); n != 0 || err != nil {
		t.Errorf("Prune(zero time) = %d, %v", n, err)
	}
}
