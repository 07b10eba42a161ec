package store

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
)

func TestCreateGet(t *testing.T) {
	db := openTest(t)
	ctx := context.Background()
	m := newMission(mid(1))
	mustCreate(t, db, m)
	sameJSON(t, mustGet(t, db, m.ID), m)

	_, err := db.Get(ctx, "nope")
	if !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Get(unknown) = %v, want ErrNotFound", err)
	}
	_, _, err = db.Create(ctx, newMission(m.ID), nil)
	if !errors.Is(err, driver.ErrConflict) {
		t.Errorf("Create(same id) = %v, want ErrConflict", err)
	}
}

func TestCreateRejectsBadInput(t *testing.T) {
	db := openTest(t)
	bad := func(mut func(m *driver.Mission, evs []driver.Event) []driver.Event) error {
		m := newMission(mid(1))
		evs := mut(m, []driver.Event{event(m, 1, driver.StatePending)})
		_, _, err := db.Create(context.Background(), m, evs)
		return err
	}
	for name, mut := range map[string]func(m *driver.Mission, evs []driver.Event) []driver.Event{
		"empty id":        func(m *driver.Mission, evs []driver.Event) []driver.Event { m.ID = ""; return evs },
		"id with slash":   func(m *driver.Mission, evs []driver.Event) []driver.Event { m.ID = "a/b"; return evs },
		"bad request key": func(m *driver.Mission, evs []driver.Event) []driver.Event { m.Meta.RequestKey = "a b"; return evs },
		"event seq 0":     func(_ *driver.Mission, evs []driver.Event) []driver.Event { evs[0].Seq = 0; return evs },
		"duplicate seq":   func(_ *driver.Mission, evs []driver.Event) []driver.Event { return append(evs, evs[0]) },
		"foreign event":   func(_ *driver.Mission, evs []driver.Event) []driver.Event { evs[0].MissionID = "other"; return evs },
		"unencodable values": func(m *driver.Mission, evs []driver.Event) []driver.Event {
			m.Context.Values["f"] = func() {}
			return evs
		},
	} {
		t.Run(name, func(t *testing.T) {
			if err := bad(mut); err == nil {
				t.Fatal("Create succeeded")
			}
		})
	}
	if _, _, err := db.Create(context.Background(), nil, nil); !errors.Is(err, driver.ErrInvalid) {
		t.Errorf("Create(nil) = %v, want ErrInvalid", err)
	}
	if s, _ := db.Stats(); s.Missions != 0 {
		t.Errorf("%d missions stored after rejected creates", s.Missions)
	}
}

func TestCreateIdempotentByRequestKey(t *testing.T) {
	db := openTest(t)
	ctx := context.Background()
	first := newMission(mid(1))
	first.Meta.RequestKey = "req-42"
	mustCreate(t, db, first)

	again := newMission(mid(2))
	again.Meta.RequestKey = "req-42"
	existing, created, err := db.Create(ctx, again, []driver.Event{event(again, 1, driver.StatePending)})
	if err != nil || created {
		t.Fatalf("Create(known key) = created %v, %v; want false, nil", created, err)
	}
	sameJSON(t, existing, first)
	if _, err := db.Get(ctx, again.ID); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("second mission was stored: Get = %v", err)
	}
	if _, err := db.Timeline(ctx, again.ID); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("second mission's events were stored: Timeline = %v", err)
	}
	got, err := db.Lookup(ctx, "req-42")
	if err != nil || got.ID != first.ID {
		t.Errorf("Lookup(req-42) = %v, %v; want %s", got, err, first.ID)
	}
	if _, err := db.Lookup(ctx, "req-unknown"); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Lookup(unknown) = %v, want ErrNotFound", err)
	}
	// A key's owner is returned as it is now, not as it was created.
	saved := mustSave(t, db, first, driver.StateRunning)
	existing, _, _ = db.Create(ctx, again, nil)
	sameJSON(t, existing, saved)
}

func TestSaveCompareAndSwap(t *testing.T) {
	db := openTest(t)
	ctx := context.Background()
	m := newMission(mid(1))
	mustCreate(t, db, m)
	v2 := mustSave(t, db, m, driver.StateRunning)

	stale, evs := advance(m, driver.StatePaused) // also version 2
	if err := db.Save(ctx, stale, evs); !errors.Is(err, driver.ErrConflict) {
		t.Errorf("stale Save = %v, want ErrConflict", err)
	}
	skip := v2.Clone()
	skip.Version = 4
	if err := db.Save(ctx, skip, nil); !errors.Is(err, driver.ErrConflict) {
		t.Errorf("Save skipping a version = %v, want ErrConflict", err)
	}
	zero := v2.Clone()
	zero.Version = 0
	if err := db.Save(ctx, zero, nil); !errors.Is(err, driver.ErrConflict) {
		t.Errorf("Save at version 0 = %v, want ErrConflict", err)
	}
	ghost, _ := advance(newMission("ghost"), driver.StateRunning)
	if err := db.Save(ctx, ghost, nil); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Save(unknown) = %v, want ErrNotFound", err)
	}
	// A recorded event seq is never overwritten.
	dup := v2.Clone()
	dup.Version = 3
	if err := db.Save(ctx, dup, []driver.Event{event(v2, 2, driver.StateRunning)}); !errors.Is(err, driver.ErrInvalid) {
		t.Errorf("Save re-recording event 2 = %v, want ErrInvalid", err)
	}
	sameJSON(t, mustGet(t, db, m.ID), v2)
	tl, _ := db.Timeline(ctx, m.ID)
	if len(tl) != 2 || tl[1].To != driver.StateRunning {
		t.Errorf("timeline = %+v, want the create and the first save", tl)
	}
}

func TestActiveFollowsState(t *testing.T) {
	db := openTest(t)
	ctx := context.Background()
	ms := map[string]*driver.Mission{}
	for i := range 4 {
		m := newMission(mid(i))
		mustCreate(t, db, m)
		ms[m.ID] = m
	}
	active := func(want ...string) {
		t.Helper()
		got, err := db.Active(ctx)
		if err != nil {
			t.Fatalf("Active: %v", err)
		}
		if !slices.Equal(ids(got), want) {
			t.Errorf("Active = %v, want %v", ids(got), want)
		}
		for _, m := range got {
			sameJSON(t, m, ms[m.ID])
		}
	}
	active(mid(0), mid(1), mid(2), mid(3))

	ms[mid(1)] = mustSave(t, db, ms[mid(1)], driver.StateRunning)
	ms[mid(1)] = mustSave(t, db, ms[mid(1)], driver.StateSucceeded)
	ms[mid(2)] = mustSave(t, db, ms[mid(2)], driver.StateCancelled)
	ms[mid(3)] = mustSave(t, db, ms[mid(3)], driver.StateFailed)
	active(mid(0))

	ms[mid(3)] = mustSave(t, db, ms[mid(3)], driver.StateRunning) // operator retry
	active(mid(0), mid(3))
	ms[mid(3)] = mustSave(t, db, ms[mid(3)], driver.StateFailed)
	active(mid(0))

	s, err := db.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if s.Missions != 4 || s.Active != 1 || s.Finished != 3 || s.Events != 4+6 || s.FileSize == 0 || s.Schema != Schema {
		t.Errorf("Stats = %+v", s)
	}
}

func TestList(t *testing.T) {
	db := openTest(t)
	ctx := context.Background()
	// 30 missions created a minute apart; every third is a "water" one,
	// every fifth succeeded.
	var all []string
	for i := range 30 {
		m := newMission(mid(i))
		m.Meta.Created = t0.Add(time.Duration(i) * time.Minute)
		if i%3 == 0 {
			m.Type = "water"
		}
		mustCreate(t, db, m)
		if i%5 == 0 {
			mustSave(t, db, m, driver.StateSucceeded)
		}
		all = append(all, m.ID)
	}
	slices.Reverse(all)
	var succeeded, water, window []string
	for _, id := range all {
		var i int
		for i = 0; mid(i) != id; i++ {
		}
		if i%5 == 0 {
			succeeded = append(succeeded, id)
		}
		if i%3 == 0 {
			water = append(water, id)
		}
		if i >= 10 && i < 20 {
			window = append(window, id)
		}
	}

	for _, tc := range []struct {
		name string
		f    driver.Filter
		want []string
	}{
		{"all", driver.Filter{}, all},
		{"state", driver.Filter{States: []driver.State{driver.StateSucceeded}}, succeeded},
		{"type", driver.Filter{Type: "water"}, water},
		{"window", driver.Filter{Since: t0.Add(10 * time.Minute), Until: t0.Add(20 * time.Minute)}, window},
		{"none", driver.Filter{Type: "absent"}, nil},
	} {
		for _, limit := range []int{0, 1, 4, 5, 7, 30} {
			f := tc.f
			f.Limit = limit
			var got []string
			pages := 0
			for {
				page, next, err := db.List(ctx, f)
				if err != nil {
					t.Fatalf("%s limit %d: List: %v", tc.name, limit, err)
				}
				if limit > 0 && len(page) > limit {
					t.Fatalf("%s limit %d: page of %d", tc.name, limit, len(page))
				}
				for _, m := range page {
					if !tc.f.Match(m) {
						t.Errorf("%s: %s does not match", tc.name, m.ID)
					}
				}
				got = append(got, ids(page)...)
				pages++
				if next == "" {
					break
				}
				if len(page) == 0 {
					t.Fatalf("%s limit %d: empty page with cursor %q", tc.name, limit, next)
				}
				f.After = next
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("%s limit %d: got %v, want %v", tc.name, limit, got, tc.want)
			}
			if limit > 0 && len(tc.want) > 0 && pages != (len(tc.want)+limit-1)/limit {
				t.Errorf("%s limit %d: %d pages for %d missions", tc.name, limit, pages, len(tc.want))
			}
		}
	}

	// A cursor survives writes: new missions appear on the first page,
	// not in the middle of a walk.
	page, next, _ := db.List(ctx, driver.Filter{Limit: 10})
	mustCreate(t, db, newMission(mid(100)))
	rest, _, _ := db.List(ctx, driver.Filter{Limit: 100, After: next})
	if got := append(ids(page), ids(rest)...); !slices.Equal(got, all) {
		t.Errorf("walk across a create = %v, want %v", got, all)
	}

	for _, bad := range []string{"x", "00", "0000000000000000", "zzzzzzzzzzzzzzzz"} {
		if _, _, err := db.List(ctx, driver.Filter{After: bad}); !errors.Is(err, ErrCursor) {
			t.Errorf("List(After %q) = %v, want ErrCursor", bad, err)
		}
	}
}

func TestListLimitCap(t *testing.T) {
	db := openTest(t)
	ctx := context.Background()
	// Concurrent creates share commits, so a thousand missions are cheap.
	const n = MaxLimit + 5
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, _, err := db.Create(ctx, newMission(mid(i)), nil)
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	page, next, err := db.List(ctx, driver.Filter{Limit: 5000})
	if err != nil || len(page) != MaxLimit || next == "" {
		t.Fatalf("List(Limit 5000) = %d missions, cursor %q, %v; want %d and a cursor", len(page), next, err, MaxLimit)
	}
	page, _, _ = db.List(ctx, driver.Filter{})
	if len(page) != DefaultLimit {
		t.Errorf("List(Limit 0) = %d missions, want %d", len(page), DefaultLimit)
	}
}

func TestTimeline(t *testing.T) {
	db := openTest(t)
	ctx := context.Background()
	// m1's ID prefixes m10's: their timelines must not mix.
	a, b := newMission("m1"), newMission("m10")
	mustCreate(t, db, a)
	mustCreate(t, db, b)
	mustSave(t, db, b, driver.StateRunning)

	// Events of one save arrive in any order; the timeline is by seq.
	n := a.Clone()
	n.Version, n.Seq, n.State = 2, 4, driver.StateStepRunning
	evs := []driver.Event{event(a, 4, driver.StateStepRunning), event(a, 2, driver.StateRunning), event(a, 3, driver.StateStepRunning)}
	evs[2].MissionID = "" // filled in by the store
	if err := db.Save(ctx, n, evs); err != nil {
		t.Fatal(err)
	}
	mustSave(t, db, n, driver.StateStepSucceeded) // seq 5

	tl, err := db.Timeline(ctx, "m1")
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for _, ev := range tl {
		seqs = append(seqs, ev.Seq)
		if ev.MissionID != "m1" {
			t.Errorf("event %d has mission %q", ev.Seq, ev.MissionID)
		}
	}
	if !slices.Equal(seqs, []uint64{1, 2, 3, 4, 5}) {
		t.Errorf("timeline seqs = %v, want 1..5", seqs)
	}
	if tl[4].To != driver.StateStepSucceeded || !tl[4].Time.Equal(t0.Add(5*time.Second)) {
		t.Errorf("last event = %+v", tl[4])
	}
	tl, _ = db.Timeline(ctx, "m10")
	if len(tl) != 2 {
		t.Errorf("m10 timeline has %d events, want 2", len(tl))
	}
	if _, err := db.Timeline(ctx, "m2"); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Timeline(unknown) = %v, want ErrNotFound", err)
	}
}

func TestReopenPersists(t *testing.T) {
	path := t.TempDir() + "/sortie.db"
	ctx := context.Background()
	db, err := Open(path, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	a, b := newMission(mid(1)), newMission(mid(2))
	b.Meta.RequestKey = "req-b"
	mustCreate(t, db, a)
	mustCreate(t, db, b)
	a = mustSave(t, db, a, driver.StateRunning)
	b = mustSave(t, db, b, driver.StateSucceeded)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Get(ctx, a.ID); !errors.Is(err, driver.ErrClosed) {
		t.Errorf("Get after Close = %v, want ErrClosed", err)
	}
	if err := db.Save(ctx, a, nil); !errors.Is(err, driver.ErrClosed) {
		t.Errorf("Save after Close = %v, want ErrClosed", err)
	}
	if err := db.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}

	db = openAt(t, path)
	if db.Path() != path {
		t.Errorf("Path = %q, want %q", db.Path(), path)
	}
	sameJSON(t, mustGet(t, db, a.ID), a)
	sameJSON(t, mustGet(t, db, b.ID), b)
	act, _ := db.Active(ctx)
	if !slices.Equal(ids(act), []string{a.ID}) {
		t.Errorf("Active after reopen = %v", ids(act))
	}
	mustCreate(t, db, newMission(mid(9)))
	dup := newMission(mid(3))
	dup.Meta.RequestKey = "req-b"
	if got, created, err := db.Create(ctx, dup, nil); err != nil || created || got.ID != b.ID {
		t.Errorf("request key after reopen: got %v created %v err %v", got, created, err)
	}
	// The creation sequence continues: the new mission lists first.
	page, _, _ := db.List(ctx, driver.Filter{})
	if !slices.Equal(ids(page), []string{mid(9), b.ID, a.ID}) {
		t.Errorf("List after reopen = %v", ids(page))
	}
	tl, _ := db.Timeline(ctx, b.ID)
	if len(tl) != 2 {
		t.Errorf("timeline after reopen has %d events, want 2", len(tl))
	}
}
