package store

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/store/internal/wal"
)

// waitUntil spins until cond holds; it stands in for hooks in the commit
// queue, whose states are otherwise invisible.
func waitUntil(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting until %s", what)
		}
		runtime.Gosched()
	}
}

func (db *DB) queueState() (leading bool, queued int) {
	db.mu.Lock()
	defer db.mu.Unlock()
	return db.leading, len(db.queue)
}

// holdWriter holds the lock the commit leader writes under until the
// returned func is called, so that writes pile up behind a leader
// deterministically. A goroutine of its own holds it, as a leader
// would: the test's goroutine may then call the DB, which takes gate,
// without breaking the lock order (lockorder.go).
func holdWriter(tb testing.TB, db *DB) (release func()) {
	tb.Helper()
	return holdLock(&db.wmu)
}

// holdCheckpoints holds the checkpoint lock, as holdWriter holds the
// writer's: no checkpoint applies the log until release.
func holdCheckpoints(tb testing.TB, db *DB) (release func()) {
	tb.Helper()
	return holdLock(&db.ckMu)
}

// holdLock locks m on a goroutine of its own until release is called,
// and waits for the unlock then.
func holdLock(m *mutex) (release func()) {
	held, done, freed := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		m.Lock()
		close(held)
		<-done
		m.Unlock()
		close(freed)
	}()
	<-held
	return func() { close(done); <-freed }
}

func TestGroupCommitBatches(t *testing.T) {
	db := openTest(t)
	a, b, c := newMission("a"), newMission("b"), newMission("c")
	for _, m := range []*driver.Mission{a, b, c} {
		mustCreate(t, db, m)
	}
	before, _ := db.Stats()

	a2, a2ev := advance(a, driver.StateRunning)
	a3, a3ev := advance(a2, driver.StateStepRunning)
	b2, b2ev := advance(b, driver.StateRunning)
	b3, b3ev := advance(b2, driver.StateStepRunning)
	b3stale, b3staleEv := advance(b2, driver.StatePaused)
	c2, c2ev := advance(c, driver.StateRunning)

	type result struct {
		name string
		err  error
	}
	results := make(chan result, 6)
	submit := func(name string, ctx context.Context, m *driver.Mission, evs []driver.Event) {
		go func() { results <- result{name, db.Save(ctx, m, evs)} }()
	}
	queued := func(n int) func() bool {
		return func() bool { _, q := db.queueState(); return q == n }
	}

	release := holdWriter(t, db)
	// The leader takes its batch of one and blocks on the writer lock.
	submit("a2", context.Background(), a2, a2ev)
	waitUntil(t, "a leader took a2", func() bool { l, q := db.queueState(); return l && q == 0 })
	// Followers queue in a known order for the next leader.
	cctx, cancel := context.WithCancel(context.Background())
	for i, w := range []struct {
		name string
		ctx  context.Context
		m    *driver.Mission
		evs  []driver.Event
	}{
		{"b2", context.Background(), b2, b2ev},
		{"b3", context.Background(), b3, b3ev}, // sees b2 in the same batch
		{"b3stale", context.Background(), b3stale, b3staleEv},
		{"c2", cctx, c2, c2ev},
		{"a3", context.Background(), a3, a3ev}, // sees the leader's commit
	} {
		submit(w.name, w.ctx, w.m, w.evs)
		waitUntil(t, w.name+" queued", queued(i+1))
	}
	cancel()
	if r := <-results; r.name != "c2" || !errors.Is(r.err, context.Canceled) {
		t.Fatalf("first result = %s %v, want c2 cancelled", r.name, r.err)
	}
	waitUntil(t, "c2 left the queue", queued(4))
	release()

	got := map[string]error{}
	for range 5 {
		r := <-results
		got[r.name] = r.err
	}
	for name, err := range got {
		if want := name == "b3stale"; errors.Is(err, driver.ErrConflict) != want || (!want && err != nil) {
			t.Errorf("%s: %v (conflict expected: %v)", name, err, want)
		}
	}
	sameJSON(t, mustGet(t, db, "a"), a3)
	sameJSON(t, mustGet(t, db, "b"), b3)
	sameJSON(t, mustGet(t, db, "c"), c)

	after, _ := db.Stats()
	if commits, writes := after.Commits-before.Commits, after.Writes-before.Writes; commits != 2 || writes != 5 {
		t.Errorf("%d commits carried %d writes, want 2 carrying 5 (a2 alone, then the four queued)", commits, writes)
	}
	if l, q := db.queueState(); l || q != 0 {
		t.Errorf("after the commits: leading %v, %d queued", l, q)
	}
}

func TestGroupCommitConcurrent(t *testing.T) {
	db := openTest(t)
	const distinct, hot = 48, 16
	var missions []*driver.Mission
	for i := range distinct + 1 {
		m := newMission(mid(i))
		mustCreate(t, db, m)
		missions = append(missions, m)
	}
	hotM := missions[distinct]
	before, _ := db.Stats()

	start := make(chan struct{})
	errs := make([]error, distinct+hot)
	saved := make([]*driver.Mission, distinct+hot)
	var wg sync.WaitGroup
	for i := range distinct + hot {
		m := missions[min(i, distinct)]
		// The hot writers all save version 2 of one mission, each to a
		// different step attempt, so the winner is recognisable.
		n, evs := advance(m, driver.StateRunning)
		n.Progress.Attempt = i
		evs = append(evs, event(n, n.Seq+1, driver.StateStepRunning), event(n, n.Seq+2, driver.StateStepSucceeded))
		n.Seq += 2
		saved[i] = n
		wg.Go(func() {
			<-start
			errs[i] = db.Save(context.Background(), n, evs)
		})
	}
	close(start)
	wg.Wait()

	winner := -1
	for i, err := range errs {
		switch {
		case i < distinct && err != nil:
			t.Errorf("save of distinct mission %d: %v", i, err)
		case i >= distinct && err == nil:
			if winner >= 0 {
				t.Errorf("hot saves %d and %d both succeeded", winner, i)
			}
			winner = i
		case i >= distinct && !errors.Is(err, driver.ErrConflict):
			t.Errorf("hot save %d: %v, want ErrConflict", i, err)
		}
	}
	if winner < 0 {
		t.Fatal("no hot save succeeded")
	}
	for i := range distinct {
		sameJSON(t, mustGet(t, db, mid(i)), saved[i])
		if tl, _ := db.Timeline(context.Background(), mid(i)); len(tl) != 4 {
			t.Errorf("mission %d has %d events, want 4", i, len(tl))
		}
	}
	sameJSON(t, mustGet(t, db, hotM.ID), saved[winner])
	if tl, _ := db.Timeline(context.Background(), hotM.ID); len(tl) != 4 {
		t.Errorf("hot mission has %d events, want 4", len(tl))
	}
	after, _ := db.Stats()
	commits, writes := after.Commits-before.Commits, after.Writes-before.Writes
	if writes != distinct+hot {
		t.Errorf("%d writes committed, want %d", writes, distinct+hot)
	}
	t.Logf("%d writes in %d commits", writes, commits)
}

// TestGroupCommitCancel cancels writes at random moments: a write that
// reports cancellation is never stored, one that reports success is.
func TestGroupCommitCancel(t *testing.T) {
	db := openTest(t)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	const n = 200
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		ctx, cancel := context.WithCancel(context.Background())
		delay := time.Duration(rng.IntN(3000)) * time.Microsecond
		if rng.IntN(4) == 0 {
			cancel()
		} else {
			stop := time.AfterFunc(delay, cancel)
			defer stop.Stop()
		}
		wg.Go(func() {
			defer cancel()
			_, _, errs[i] = db.Create(ctx, newMission(mid(i)), nil)
		})
	}
	wg.Wait()
	cancelled := 0
	for i, err := range errs {
		_, gerr := db.Get(context.Background(), mid(i))
		switch {
		case err == nil && gerr != nil:
			t.Errorf("create %d succeeded but Get = %v", i, gerr)
		case errors.Is(err, context.Canceled):
			cancelled++
			if !errors.Is(gerr, driver.ErrNotFound) {
				t.Errorf("create %d was cancelled but Get = %v", i, gerr)
			}
		case err != nil:
			t.Errorf("create %d: %v", i, err)
		}
	}
	t.Logf("%d of %d cancelled", cancelled, n)
	if l, q := db.queueState(); l || q != 0 {
		t.Errorf("after the writes: leading %v, %d queued", l, q)
	}
}

func TestCloseWaitsForQueuedWrites(t *testing.T) {
	db := openTest(t)
	a, b := newMission("a"), newMission("b")
	mustCreate(t, db, a)
	mustCreate(t, db, b)
	release := holdWriter(t, db)
	errs := make(chan error, 2)
	for _, m := range []*driver.Mission{a, b} {
		n, evs := advance(m, driver.StateRunning)
		go func() { errs <- db.Save(context.Background(), n, evs) }()
	}
	waitUntil(t, "one write leads and one waits", func() bool { l, q := db.queueState(); return l && q == 1 })
	closed := make(chan error, 1)
	go func() { closed <- db.Close() }()
	waitUntil(t, "Close started", func() bool { db.mu.Lock(); defer db.mu.Unlock(); return db.closed })
	if err := db.Save(context.Background(), a, nil); !errors.Is(err, driver.ErrClosed) {
		t.Errorf("Save during Close = %v, want ErrClosed", err)
	}
	release()
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("queued save: %v", err)
		}
	}
	if err := <-closed; err != nil {
		t.Errorf("Close: %v", err)
	}
}

// TestCreateRefusesRecordTheLogCannotRead: a mission whose log record
// would be longer than wal.MaxRecord is refused with ErrInvalid, or, if
// accepted, survives a crash.
//
// Found by review (as TestReviewOversizedRecordReplayed): the log
// accepted and acknowledged such a record, but reading stops at any
// frame longer than wal.MaxRecord, so after a crash before the next
// commit (whose makeRoom would checkpoint it, the log being past
// walLimit) the acknowledged write was lost.
func TestCreateRefusesRecordTheLogCannotRead(t *testing.T) {
	if testing.Short() {
		t.Skip("writes a 64 MiB record")
	}
	db, path := openPaused(t)
	big := newMission(mid(1))
	big.Meta.Labels["blob"] = strings.Repeat("x", wal.MaxRecord)
	_, created, err := db.Create(t.Context(), big, []driver.Event{event(big, 1, driver.StatePending)})
	if errors.Is(err, driver.ErrInvalid) {
		return // refused up front: nothing acknowledged, nothing to lose
	}
	if err != nil || !created {
		t.Fatalf("Create = created %v, %v", created, err)
	}
	big = nil
	crash(t, db)

	db = openAt(t, path)
	if _, found := inBolt(t, db, mid(1)); !found {
		t.Errorf("acknowledged create of %s lost after a crash", mid(1))
	}
}

// commitFailing commits batch as one leader does, with the log's append
// failing.
func commitFailing(tb testing.TB, db *DB, batch ...*write) {
	tb.Helper()
	spy := spyOn(db)
	spy.fail = true
	db.commitBatch(batch)
	db.wmu.Lock()
	spy.fail = false
	db.wmu.Unlock()
	if batch[0].err == nil {
		tb.Fatal("test premise: the batch's append did not fail")
	}
}

// TestFailedBatchFailsDuplicateCreateOfItsOwnCreate: two Creates with
// the same request key in one batch whose append fails both fail; the
// second does not report success (created=false) with the first, which
// was never stored.
//
// Found by review (as TestReviewFailedBatchPhantomExisting): the second
// Create's check found the key owned by the first, staged in the same
// batch, and recorded it as existing; when the append failed, the first
// was told so, but the second kept existing and no error.
func TestFailedBatchFailsDuplicateCreateOfItsOwnCreate(t *testing.T) {
	db := openTest(t)
	x, y := newMission(mid(1)), newMission(mid(2))
	x.Meta.RequestKey, y.Meta.RequestKey = "req-1", "req-1"
	wx, err := newWrite(true, x, []driver.Event{event(x, 1, driver.StatePending)})
	if err != nil {
		t.Fatal(err)
	}
	wy, err := newWrite(true, y, []driver.Event{event(y, 1, driver.StatePending)})
	if err != nil {
		t.Fatal(err)
	}
	commitFailing(t, db, wx, wy)
	if wy.err == nil && wy.existing != nil {
		t.Errorf("Create(%s) would return created=false, err=nil and existing mission %s, but that mission's create failed (%v)", y.ID, x.ID, wx.err)
	}
	if _, err := db.Lookup(t.Context(), "req-1"); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Lookup(req-1) after the failed batch = %v, want ErrNotFound", err)
	}
}

// TestFailedBatchDuplicateCreateReportsNoUnsavedVersion: a duplicate
// Create in a batch whose append fails, of a key whose acknowledged
// owner the same batch also saves, does not report success with the
// owner's version from that save, which was never stored.
//
// Found by review (as TestReviewFailedBatchPhantomVersion): the key was
// not in the batch's stage, so inBatch stayed false, and when the append
// failed the duplicate Create still reported success with the staged
// version.
func TestFailedBatchDuplicateCreateReportsNoUnsavedVersion(t *testing.T) {
	db := openTest(t)
	x := newMission(mid(1))
	x.Meta.RequestKey = "req-1"
	mustCreate(t, db, x) // acknowledged, version 1

	x2, xev := advance(x, driver.StateRunning)
	ws, err := newWrite(false, x2, xev)
	if err != nil {
		t.Fatal(err)
	}
	y := newMission(mid(2))
	y.Meta.RequestKey = "req-1"
	wy, err := newWrite(true, y, []driver.Event{event(y, 1, driver.StatePending)})
	if err != nil {
		t.Fatal(err)
	}
	commitFailing(t, db, ws, wy)
	stored := mustGet(t, db, x.ID)
	if wy.err == nil && wy.existing != nil {
		m, err := decodeMission(wy.existing)
		if err != nil {
			t.Fatal(err)
		}
		if m.Version != stored.Version {
			t.Errorf("Create(%s) reports created=false, err=nil with %s at version %d (state %s), a save that failed; the store holds version %d", y.ID, m.ID, m.Version, m.State, stored.Version)
		}
	}
}

// TestWriteErrorReportsFailingCommitsUntilOneSucceeds: a store whose
// appends fail (a full disk) says so, for /readyz, and stops saying so
// once a commit succeeds again.
func TestWriteErrorReportsFailingCommitsUntilOneSucceeds(t *testing.T) {
	db := openTest(t)
	if err := db.WriteError(); err != nil {
		t.Fatalf("a fresh store: %v", err)
	}
	m := newMission(mid(1))
	w, err := newWrite(true, m, []driver.Event{event(m, 1, m.State)})
	if err != nil {
		t.Fatal(err)
	}
	commitFailing(t, db, w)
	if err := db.WriteError(); err == nil {
		t.Fatal("no write error after a failed append")
	}
	mustCreate(t, db, newMission(mid(2)))
	if err := db.WriteError(); err != nil {
		t.Fatalf("after a commit that succeeded: %v", err)
	}
}
