package store

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
)

// openOutboxAt opens a store with the outbox on and the given bound.
func openOutboxAt(tb testing.TB, path string, max int) *DB {
	tb.Helper()
	opts := testOptions()
	opts.Outbox, opts.OutboxMax = true, max
	return openWith(tb, path, opts)
}

func openOutboxTest(tb testing.TB, max int) *DB {
	tb.Helper()
	return openOutboxAt(tb, filepath.Join(tb.TempDir(), "sortie.db"), max)
}

func readOutbox(tb testing.TB, db *DB, after uint64) []OutboxEntry {
	tb.Helper()
	var out []OutboxEntry
	for {
		page, err := db.Outbox(context.Background(), after, 7) // odd page size: exercise paging
		if err != nil {
			tb.Fatalf("Outbox(%d): %v", after, err)
		}
		if len(page) == 0 {
			return out
		}
		out = append(out, page...)
		after = page[len(page)-1].Seq
	}
}

// refs lists entries as "mission/seq" in outbox order.
func refs(es []OutboxEntry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = fmt.Sprintf("%s/%d", e.Event.MissionID, e.Event.Seq)
	}
	return out
}

func sameStrings(tb testing.TB, what string, got, want []string) {
	tb.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		tb.Errorf("%s:\ngot  %v\nwant %v", what, got, want)
	}
}

func TestOutboxWrittenWithCommits(t *testing.T) {
	db := openOutboxTest(t, 0)
	ctx := context.Background()
	a, b := newMission("a"), newMission("b")
	b.Meta.RequestKey = "req-b"
	mustCreate(t, db, a)
	mustCreate(t, db, b)
	a2 := mustSave(t, db, a, driver.StateRunning)

	// A stale save, a known request key and an unknown mission write no
	// entry, and neither does a batch-mate's success make them.
	stale, staleEv := advance(a, driver.StatePaused)
	if err := db.Save(ctx, stale, staleEv); !errors.Is(err, driver.ErrConflict) {
		t.Fatalf("stale save: %v, want ErrConflict", err)
	}
	dup := newMission("b-again")
	dup.Meta.RequestKey = "req-b"
	if _, created, err := db.Create(ctx, dup, []driver.Event{event(dup, 1, driver.StatePending)}); err != nil || created {
		t.Fatalf("duplicate create: created %v, %v", created, err)
	}
	ghost, ghostEv := advance(newMission("ghost"), driver.StateRunning)
	if err := db.Save(ctx, ghost, ghostEv); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("save of unknown mission: %v", err)
	}
	// Two events in one save keep their order.
	a3, evs := advance(a2, driver.StateStepRunning)
	evs = append(evs, event(a3, a3.Seq+1, driver.StateStepSucceeded))
	a3.Seq++
	a3.Progress.Step = 1
	if err := db.Save(ctx, a3, evs); err != nil {
		t.Fatal(err)
	}

	got := readOutbox(t, db, 0)
	sameStrings(t, "outbox", refs(got), []string{"a/1", "b/1", "a/2", "a/3", "a/4"})
	for i, e := range got {
		if e.Seq != uint64(i+1) {
			t.Errorf("entry %d has seq %d, want %d", i, e.Seq, i+1)
		}
		if e.Compacted {
			t.Errorf("entry %d is marked compacted", e.Seq)
		}
	}
	// Each entry carries the summary after its write, the step table
	// with the mission's creation only (and its end).
	if s := got[2].Mission; s.State != driver.StateRunning || s.Scene != "leave_home" || s.StepIDs != nil {
		t.Errorf("summary of a/2 = %+v", s)
	}
	if s := got[0].Mission; len(s.StepIDs) != 3 || len(s.StepNames) != 3 || len(s.StepTargets) != 3 || s.StepStatus != nil {
		t.Errorf("summary of a/1 = %+v, want the step table", s)
	}
	if s := got[4].Mission; s.State != driver.StateStepRunning || s.Step != 1 {
		t.Errorf("summary of a/4 = %+v (the mission after the save, not the event)", s)
	}
	if e := got[4].Event; e.To != driver.StateStepSucceeded || !e.Time.Equal(t0.Add(4*time.Second)) {
		t.Errorf("event a/4 = %+v", e)
	}
	if n := db.OutboxLen(); n != 5 {
		t.Errorf("OutboxLen = %d, want 5", n)
	}
	sameStrings(t, "after 3", refs(readOutbox(t, db, 3)), []string{"a/3", "a/4"})
	if es, err := db.Outbox(ctx, ^uint64(0), 10); err != nil || len(es) != 0 {
		t.Errorf("Outbox(max) = %v, %v", es, err)
	}
}

func TestOutboxOffWritesNothing(t *testing.T) {
	db := openTest(t)
	m := newMission("a")
	mustCreate(t, db, m)
	mustSave(t, db, m, driver.StateRunning)
	if es := readOutbox(t, db, 0); len(es) != 0 || db.OutboxLen() != 0 {
		t.Errorf("outbox off: %d entries, len %d", len(es), db.OutboxLen())
	}
}

func TestOutboxAck(t *testing.T) {
	db := openOutboxTest(t, 0)
	ctx := context.Background()
	m := newMission("a")
	mustCreate(t, db, m)
	for range 1200 { // more than one ack transaction's worth
		m = mustSave(t, db, m, driver.StateRunning)
	}
	var acked uint64
	for _, tc := range []struct {
		upto uint64
		want int
	}{
		{0, 0}, {3, 3}, {3, 0}, {2, 0}, {1100, 1097}, {5000, 101},
	} {
		n, err := db.AckOutbox(ctx, tc.upto)
		if err != nil || n != tc.want {
			t.Errorf("AckOutbox(%d) = %d, %v; want %d", tc.upto, n, err, tc.want)
		}
		acked = max(acked, tc.upto)
		es := readOutbox(t, db, 0)
		if len(es) > 0 && es[0].Seq != acked+1 {
			t.Errorf("after AckOutbox(%d) the first entry is %d, want %d", tc.upto, es[0].Seq, acked+1)
		}
		if len(es) != db.OutboxLen() {
			t.Errorf("after AckOutbox(%d): %d entries, OutboxLen %d", tc.upto, len(es), db.OutboxLen())
		}
	}
	if s := db.OutboxStats(); s.Acked != 1201 || s.Len != 0 {
		t.Errorf("stats = %+v", s)
	}
	// Seqs are never reused, even once the outbox is empty.
	mustSave(t, db, m, driver.StatePaused)
	if es := readOutbox(t, db, 0); len(es) != 1 || es[0].Seq != 1202 {
		t.Errorf("after emptying, new entry = %+v", es)
	}
}

func TestOutboxSurvivesReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sortie.db")
	opts := testOptions()
	opts.Outbox = true
	db, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	m := newMission("a")
	mustCreate(t, db, m)
	m = mustSave(t, db, m, driver.StateRunning)
	m = mustSave(t, db, m, driver.StateStepRunning)
	if _, err := db.AckOutbox(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Outbox(context.Background(), 0, 0); !errors.Is(err, driver.ErrClosed) {
		t.Errorf("Outbox after Close: %v, want ErrClosed", err)
	}

	db = openOutboxAt(t, path, 0)
	if n := db.OutboxLen(); n != 2 {
		t.Errorf("OutboxLen after reopen = %d, want 2", n)
	}
	mustSave(t, db, m, driver.StateStepSucceeded)
	sameStrings(t, "after reopen", refs(readOutbox(t, db, 0)), []string{"a/2", "a/3", "a/4"})
	if es := readOutbox(t, db, 3); len(es) != 1 || es[0].Seq != 4 {
		t.Errorf("new entry after reopen: %+v", es)
	}
}

func TestOutboxGroupCommit(t *testing.T) {
	db := openOutboxTest(t, 0)
	a, b := newMission("a"), newMission("b")
	mustCreate(t, db, a)
	mustCreate(t, db, b)
	before, _ := db.Stats()

	release := holdWriter(t, db)
	a2, a2ev := advance(a, driver.StateRunning)
	a3, a3ev := advance(a2, driver.StateStepRunning)
	b2, b2ev := advance(b, driver.StateRunning)
	b2stale, b2staleEv := advance(b, driver.StatePaused)
	errs := make(chan error, 4)
	saves := []struct {
		m   *driver.Mission
		evs []driver.Event
	}{{a2, a2ev}, {b2, b2ev}, {b2stale, b2staleEv}, {a3, a3ev}}
	for i, s := range saves {
		go func() { errs <- db.Save(context.Background(), s.m, s.evs) }()
		// The first leads and blocks on the writer; the rest queue behind it.
		waitUntil(t, "queued", func() bool { l, q := db.queueState(); return l && q == i })
	}
	release()
	conflicts := 0
	for range saves {
		if err := <-errs; errors.Is(err, driver.ErrConflict) {
			conflicts++
		} else if err != nil {
			t.Error(err)
		}
	}
	if conflicts != 1 {
		t.Errorf("%d conflicts, want 1", conflicts)
	}
	after, _ := db.Stats()
	if c, w := after.Commits-before.Commits, after.Writes-before.Writes; c != 2 || w != 4 {
		t.Errorf("%d commits carried %d writes, want 2 and 4", c, w)
	}
	sameStrings(t, "outbox", refs(readOutbox(t, db, 0)), []string{"a/1", "b/1", "a/2", "b/2", "a/3"})
	if n := db.OutboxLen(); n != 5 {
		t.Errorf("OutboxLen = %d, want 5", n)
	}
}

func TestOutboxCompaction(t *testing.T) {
	db := openOutboxTest(t, -1) // compaction by hand only
	ctx := context.Background()
	ms := map[string]*driver.Mission{}
	// m0 has 1 event, m1 has 2, ... m5 has 6; m6 has 700 (more than one
	// compaction transaction); they interleave.
	counts := []int{1, 2, 3, 4, 5, 6, 700}
	for i := range counts {
		m := newMission(mid(i))
		mustCreate(t, db, m)
		ms[m.ID] = m
	}
	for round := 1; round < 700; round++ {
		for i, n := range counts {
			if round < n {
				ms[mid(i)] = mustSave(t, db, ms[mid(i)], driver.StateRunning)
			}
		}
	}
	if _, err := db.AckOutbox(ctx, 2); err != nil { // m0's only entry and m1's first
		t.Fatal(err)
	}
	total := db.OutboxLen()
	dropped, err := db.CompactOutbox(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := total - 6; dropped != want {
		t.Errorf("dropped %d, want %d", dropped, want)
	}
	got := readOutbox(t, db, 0)
	var want []string
	for i := 1; i < len(counts); i++ {
		want = append(want, fmt.Sprintf("%s/%d", mid(i), counts[i]))
	}
	sameStrings(t, "compacted outbox", refs(got), want)
	for _, e := range got {
		// m1 lost only an acknowledged entry, so nothing of it was dropped.
		if wantFlag := e.Event.MissionID != mid(1); e.Compacted != wantFlag {
			t.Errorf("%s/%d: compacted %v, want %v", e.Event.MissionID, e.Event.Seq, e.Compacted, wantFlag)
		}
	}
	if s := db.OutboxStats(); s.Len != 6 || s.Compacted != uint64(dropped) || s.Compactions != 1 {
		t.Errorf("stats = %+v", s)
	}
	if n, err := db.CompactOutbox(ctx); n != 0 || err != nil {
		t.Errorf("second compaction = %d, %v", n, err)
	}
}

// TestOutboxCompactionRandom writes, acknowledges and compacts at once
// and checks what the bound promises: every mission's latest unacked
// entry survives, entries stay in per-mission order, and the count is
// exact.
func TestOutboxCompactionRandom(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	const bound, writers, saves = 40, 8, 60
	db := openOutboxTest(t, bound)
	ctx := context.Background()

	latest := make([]uint64, writers) // event seq of each writer's last save
	var wg sync.WaitGroup
	for w := range writers {
		m := newMission(mid(w))
		mustCreate(t, db, m)
		n := saves/2 + rng.IntN(saves)
		wg.Go(func() {
			for range n {
				next, evs := advance(m, driver.StateRunning)
				if err := db.Save(ctx, next, evs); err != nil {
					t.Error(err)
					return
				}
				m = next
			}
			latest[w] = m.Seq
		})
	}
	stop := make(chan struct{})
	acker := make(chan uint64)
	go func() {
		var upto uint64
		defer func() { acker <- upto }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			es, err := db.Outbox(ctx, upto, 3)
			if err != nil {
				t.Error(err)
				return
			}
			if len(es) > 0 {
				upto = es[len(es)-1].Seq
				if _, err := db.AckOutbox(ctx, upto); err != nil {
					t.Error(err)
					return
				}
			}
		}
	}()
	wg.Wait()
	close(stop)
	acked := <-acker
	// Let a background compaction finish, then run one more by hand.
	waitUntil(t, "background compaction ends", func() bool { return !db.ob.running.Load() })
	if _, err := db.CompactOutbox(ctx); err != nil {
		t.Fatal(err)
	}

	es := readOutbox(t, db, 0)
	if len(es) != db.OutboxLen() {
		t.Errorf("%d entries, OutboxLen %d", len(es), db.OutboxLen())
	}
	last := map[string]OutboxEntry{}
	for _, e := range es {
		if e.Seq <= acked {
			t.Errorf("entry %d survived its ack (upto %d)", e.Seq, acked)
		}
		if p, ok := last[e.Event.MissionID]; ok && p.Event.Seq >= e.Event.Seq {
			t.Errorf("%s: event %d after %d", e.Event.MissionID, e.Event.Seq, p.Event.Seq)
		}
		last[e.Event.MissionID] = e
	}
	if len(es) > writers {
		t.Errorf("%d entries after compaction, want at most one per mission (%d)", len(es), writers)
	}
	// Every mission's latest event is either still there or was acked.
	all := readTimelineLatest(t, db, writers)
	for w := range writers {
		e, ok := last[mid(w)]
		switch {
		case ok && e.Event.Seq != latest[w]:
			t.Errorf("%s: outbox keeps event %d, latest is %d", mid(w), e.Event.Seq, latest[w])
		case !ok && all[mid(w)] != latest[w]:
			t.Errorf("%s: latest event %d lost", mid(w), latest[w])
		}
	}
	s := db.OutboxStats()
	if s.Compacted == 0 {
		t.Logf("no compaction happened (acks kept up); stats %+v", s)
	}
}

func readTimelineLatest(tb testing.TB, db *DB, n int) map[string]uint64 {
	tb.Helper()
	out := map[string]uint64{}
	for w := range n {
		tl, err := db.Timeline(context.Background(), mid(w))
		if err != nil {
			tb.Fatal(err)
		}
		out[mid(w)] = tl[len(tl)-1].Seq
	}
	return out
}

func TestOutboxCompactsOnItsOwn(t *testing.T) {
	db := openOutboxTest(t, 20)
	ms := make([]*driver.Mission, 3)
	for i := range ms {
		ms[i] = newMission(mid(i))
		mustCreate(t, db, ms[i])
	}
	for range 10 {
		for i := range ms {
			ms[i] = mustSave(t, db, ms[i], driver.StateRunning)
		}
	}
	waitUntil(t, "a compaction", func() bool { return db.OutboxStats().Compactions > 0 && !db.ob.running.Load() })
	es := readOutbox(t, db, 0)
	if len(es) > 20 {
		t.Errorf("%d entries after the automatic compaction, bound 20", len(es))
	}
	seen := map[string]uint64{}
	for _, e := range es {
		seen[e.Event.MissionID] = e.Event.Seq
	}
	for _, m := range ms {
		if seen[m.ID] != m.Seq {
			t.Errorf("%s: latest in outbox %d, want %d", m.ID, seen[m.ID], m.Seq)
		}
	}
}
