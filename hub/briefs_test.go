package hub

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/uplink"
)

// briefsMatchRecords fails t unless the store's briefs are its
// gateways' records, brief for brief.
func briefsMatchRecords(t *testing.T, st Backing, want map[string]GatewayBrief) {
	t.Helper()
	briefs, err := st.GatewayBriefs(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	gws, err := st.Gateways(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var fromRecords []GatewayBrief
	for i := range gws {
		fromRecords = append(fromRecords, briefOf(&gws[i]))
	}
	if !slices.Equal(briefs, fromRecords) {
		t.Errorf("briefs %+v, records say %+v", briefs, fromRecords)
	}
	got := map[string]GatewayBrief{}
	for _, b := range briefs {
		got[b.ID] = b
	}
	if !maps.Equal(got, want) {
		t.Errorf("briefs %+v, want %+v", got, want)
	}
}

// TestGatewayBriefsFollowEachChangeOfAGateway: what the fleet's counts
// and the list's filters read (briefs.go) follows each gateway through
// registration, coming online with a backlog, the backlog cleared, a
// will, a goodbye and a restart of the hub, always equal to what its
// whole record says.
func TestGatewayBriefsFollowEachChangeOfAGateway(t *testing.T) {
	st := testStore(t)
	at := t0
	next := func() time.Time { at = at.Add(time.Second); return at }
	if err := st.Register(t.Context(), next(), "a", "b", "c"); err != nil {
		t.Fatal(err)
	}
	want := map[string]GatewayBrief{"a": {ID: "a", State: StateUnknown}, "b": {ID: "b", State: StateUnknown}, "c": {ID: "c", State: StateUnknown}}
	briefsMatchRecords(t, st, want)

	report(t, st, next(), "a", StateOnline, 3)
	report(t, st, next(), "b", StateOnline, 0)
	want["a"], want["b"] = GatewayBrief{ID: "a", State: StateOnline, Backlog: 3}, GatewayBrief{ID: "b", State: StateOnline}
	briefsMatchRecords(t, st, want)

	report(t, st, next(), "a", StateOnline, 0) // the backlog sent
	want["a"] = GatewayBrief{ID: "a", State: StateOnline}
	briefsMatchRecords(t, st, want)

	report(t, st, next(), "b", StateOnline, 7)
	report(t, st, next(), "b", StateOffline, 0) // its will: the last heartbeat's backlog stays
	want["b"] = GatewayBrief{ID: "b", State: StateOffline, Backlog: 7}
	briefsMatchRecords(t, st, want)

	// A gateway first heard of in a batch (never registered).
	if _, err := ingest(st, next(), "d", batch("d", entry(1, "m1", 1, driver.StateRunning))); err != nil {
		t.Fatal(err)
	}
	d, err := st.Gateway(t.Context(), "d")
	if err != nil {
		t.Fatal(err)
	}
	want["d"] = briefOf(&d)
	briefsMatchRecords(t, st, want)

	// A hub restarting registers its gateways again: online ones become
	// unknown until they report.
	if err := st.Register(t.Context(), next(), "a", "b", "c"); err != nil {
		t.Fatal(err)
	}
	if _, ok := st.(*Store); ok {
		want["a"] = GatewayBrief{ID: "a", State: StateUnknown}
	}
	briefsMatchRecords(t, st, want)

	recs, err := st.GatewaysByID(t.Context(), []string{"c", "nobody", "a"})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[0].ID != "c" || recs[1].ID != "a" {
		t.Errorf("GatewaysByID(c, nobody, a) = %+v, want c then a", recs)
	}
}

// TestFailedInTheLastDayFollowsRetriesAndPruning: the list's "failed
// in 24 h" of a gateway counts its missions finished FAILED in the
// window: one an operator retried to success no longer counts, one
// failed on retry counts at its new time, and a pruned one is gone.
func TestFailedInTheLastDayFollowsRetriesAndPruning(t *testing.T) {
	st := testStore(t)
	now := t0.Add(72 * time.Hour)
	fin := func(oseq uint64, id string, seq uint64, state driver.State, at time.Time) uplink.Entry {
		e := entry(oseq, id, seq, state)
		e.Mission.Updated, e.Mission.Finished, e.Event.Time = at, time.Time{}, at
		if state.Terminal() {
			e.Mission.Finished = at
		}
		return e
	}
	send := func(gw string, es ...uplink.Entry) {
		t.Helper()
		if _, err := ingest(st, now, gw, batch(gw, es...)); err != nil {
			t.Fatal(err)
		}
	}
	failed := func() map[string]int {
		t.Helper()
		got, err := st.FailedSince(t.Context(), now.Add(-24*time.Hour), []string{"a", "b", "c"})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	send("a", fin(1, "f1", 1, driver.StateFailed, now.Add(-time.Hour)), fin(2, "old", 1, driver.StateFailed, now.Add(-30*time.Hour)),
		fin(3, "ok", 1, driver.StateSucceeded, now.Add(-time.Hour)))
	send("b", fin(1, "r1", 1, driver.StateFailed, now.Add(-2*time.Hour)), fin(2, "r2", 1, driver.StateFailed, now.Add(-40*time.Hour)))
	send("c", fin(1, "x", 1, driver.StateCancelled, now.Add(-time.Hour)))
	if got := failed(); !maps.Equal(got, map[string]int{"a": 1, "b": 1}) {
		t.Fatalf("failed in 24 h: %v, want a 1, b 1", got)
	}
	// An operator retries b's r1 (it succeeds) and r2 (it fails again,
	// now): r2 counts, r1 no longer does.
	send("b", fin(3, "r1", 2, driver.StateRunning, now.Add(-90*time.Minute)), fin(4, "r1", 3, driver.StateSucceeded, now.Add(-80*time.Minute)),
		fin(5, "r2", 2, driver.StateRunning, now.Add(-20*time.Minute)), fin(6, "r2", 3, driver.StateFailed, now.Add(-10*time.Minute)))
	if got := failed(); !maps.Equal(got, map[string]int{"a": 1, "b": 1}) {
		t.Fatalf("failed in 24 h after the retries: %v, want a 1, b 1 (r2)", got)
	}
	if got, err := st.FailedSince(t.Context(), now.Add(-15*time.Minute), []string{"a", "b"}); err != nil || !maps.Equal(got, map[string]int{"b": 1}) {
		t.Errorf("failed in 15 min: %v (%v), want b 1", got, err)
	}
	// Retention of 30 minutes leaves r2 alone.
	if _, err := st.Prune(t.Context(), now, Retention{MaxAge: 30 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	if got := failed(); !maps.Equal(got, map[string]int{"b": 1}) {
		t.Errorf("failed in 24 h after pruning: %v, want b 1", got)
	}
}

// TestGlanceFollowsGatewaysChangingState: the overview's counts and
// the list's filters and its "failed in 24 h" stay what the gateways'
// records say as gateways come, lose and clear a backlog, go offline
// and fail missions (each read by a fresh API: the overview is cached
// for 5 s).
func TestGlanceFollowsGatewaysChangingState(t *testing.T) {
	st := testStore(t)
	e := newEnv(t)
	now := time.Now()
	at := now.Add(-time.Hour)
	next := func() time.Time { at = at.Add(time.Second); return at }
	ids := make([]string, 12)
	for i := range ids {
		ids[i] = fmt.Sprintf("gw-%02d", i)
	}
	if err := st.Register(t.Context(), next(), ids...); err != nil {
		t.Fatal(err)
	}
	read := func() (FleetOverview, GatewayPage, GatewayPage) {
		t.Helper()
		api := NewAPIOn(e.svc, st, APIOptions{Token: testToken})
		srv := httptest.NewServer(api)
		defer func() { api.Close(); srv.Close() }()
		e.http = srv
		var o FleetOverview
		var backlog, offline GatewayPage
		e.do(t, "GET", "/api/fleet/overview", "", &o)
		e.do(t, "GET", "/api/gateways?state=backlog&limit=3", "", &backlog)
		e.do(t, "GET", "/api/gateways?state=offline&limit=50", "", &offline)
		return o, backlog, offline
	}
	o, backlog, _ := read()
	if o.Gateways != 12 || o.States[StateUnknown] != 12 || o.Conditions[CondBacklog] != 0 || backlog.Total != 0 {
		t.Fatalf("registered: %+v, backlog %+v", o, backlog)
	}
	for i, id := range ids[:8] {
		report(t, st, next(), id, StateOnline, i%2) // gw-01, 03, 05, 07 with a backlog
	}
	o, backlog, _ = read()
	if o.States[StateOnline] != 8 || o.States[StateUnknown] != 4 || o.Conditions[CondBacklog] != 4 || backlog.Total != 4 ||
		len(backlog.Gateways) != 3 || backlog.Gateways[0].ID != "gw-01" || backlog.Next != "gw-05" {
		t.Fatalf("8 online, 4 with a backlog: %+v, backlog page %+v", o, backlog)
	}
	report(t, st, next(), "gw-01", StateOnline, 0)  // sent it
	report(t, st, next(), "gw-03", StateOffline, 0) // its will
	report(t, st, next(), "gw-04", StateOffline, 0)
	fail := uplink.Entry{Seq: 1, Event: driver.Event{MissionID: "m1", Seq: 1, Type: "transition", Time: now.Add(-time.Minute)},
		Mission: driver.Summary{Scene: "go_home", State: driver.StateFailed, Created: now.Add(-2 * time.Minute), Updated: now.Add(-time.Minute), Finished: now.Add(-time.Minute)}}
	if _, err := ingest(st, next(), "gw-04", batch("gw-04", fail)); err != nil {
		t.Fatal(err)
	}
	o, backlog, offline := read()
	if o.States[StateOnline] != 6 || o.States[StateOffline] != 2 || o.States[StateUnknown] != 4 || o.Conditions[CondBacklog] != 3 {
		t.Errorf("after the changes: %+v, want 6 online, 2 offline, 4 unknown, 3 with a backlog", o)
	}
	var got []string
	for _, g := range backlog.Gateways {
		got = append(got, g.ID)
	}
	if !slices.Equal(got, []string{"gw-03", "gw-05", "gw-07"}) || backlog.Total != 3 || backlog.Next != "" {
		t.Errorf("backlog page: %v (total %d, next %q), want gw-03 (offline, its last heartbeat's backlog), gw-05, gw-07", got, backlog.Total, backlog.Next)
	}
	if offline.Total != 2 || len(offline.Gateways) != 2 || offline.Gateways[1].ID != "gw-04" || offline.Gateways[1].Failed24h != 1 ||
		offline.Gateways[0].Failed24h != 0 || !slices.Equal(offline.Gateways[0].Conditions, []string{CondBacklog}) {
		t.Errorf("offline page: %+v, want gw-03 (backlog) and gw-04 (1 failed)", offline)
	}
}

// FuzzDecodeBrief: a stored brief decodes with an error or a brief,
// never a panic, and every brief encoded decodes to itself.
func FuzzDecodeBrief(f *testing.F) {
	for _, b := range []GatewayBrief{{ID: "a", State: StateOnline, Backlog: 3}, {ID: "b", State: StateUnknown}, {ID: "c", State: "", Backlog: 1 << 20}} {
		f.Add([]byte(b.ID), encodeBrief(b))
	}
	f.Add([]byte("x"), []byte{0xff})
	f.Fuzz(func(t *testing.T, id, v []byte) {
		b, err := decodeBrief(id, v)
		if err != nil {
			return
		}
		if again, err := decodeBrief(id, encodeBrief(b)); err != nil || again != b {
			t.Errorf("%+v encoded decodes to %+v (%v)", b, again, err)
		}
	})
}

// TestAStoreFromBeforeTheBriefsGetsThemAtItsFirstOpenAndSaysSo: a hub
// file written before the briefs (neither briefs nor the failed index)
// gets both from its records at its first open, and the log says so (a
// minute for a million missions is not to be taken for a hang); a new
// file says nothing.
func TestAStoreFromBeforeTheBriefsGetsThemAtItsFirstOpenAndSaysSo(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hub.db")
	var logs bytes.Buffer
	st, err := Open(path, Options{NoSync: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if logs.Len() != 0 {
		t.Errorf("a new store logged %q", logs.String())
	}
	failed := entry(1, "f1", 1, driver.StateFailed)
	if _, err := ingest(st, failed.Mission.Finished, "a", batch("a", failed)); err != nil {
		t.Fatal(err)
	}
	err = st.db.Update(func(tx *bolt.Tx) error { // as a store of before was
		return errors.Join(tx.DeleteBucket(bucketBriefs), tx.DeleteBucket(bucketFailed), tx.Bucket(bucketMeta).Put(keySchema, u64(1)))
	})
	if err != nil || st.Close() != nil {
		t.Fatalf("make a store of before: %v", err)
	}
	st, err = Open(path, Options{NoSync: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.Close() }()
	if !strings.Contains(logs.String(), "upgrading the store") || !strings.Contains(logs.String(), "store upgraded") {
		t.Errorf("the upgrade's log: %q", logs.String())
	}
	briefs, err := st.GatewayBriefs(t.Context())
	if err != nil || len(briefs) != 1 || briefs[0].ID != "a" {
		t.Errorf("briefs after the upgrade: %+v, %v; want gateway a's", briefs, err)
	}
	n, err := st.FailedSince(t.Context(), failed.Mission.Finished.Add(-time.Hour), []string{"a"})
	if err != nil || n["a"] != 1 {
		t.Errorf("failed since an hour before f1: %v, %v; want a 1", n, err)
	}
}

// TestBriefsAreRefilledAfterAnOlderHubWroteTheFile: the first hub with
// briefs kept them under schema 1, which the hub before them opens too;
// records that one wrote have no brief and no failed index entry, and
// entries of what it pruned stay. Such a file is refilled from its
// records at its next open by this hub, and a hub of schema 1 no longer
// opens the file (it refuses any other version).
func TestBriefsAreRefilledAfterAnOlderHubWroteTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hub.db")
	st, err := Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	failed := entry(1, "f1", 1, driver.StateFailed)
	for _, gw := range []string{"a", "b"} {
		if _, err := ingest(st, failed.Mission.Finished, gw, batch(gw, failed)); err != nil {
			t.Fatal(err)
		}
	}
	// The older hub at work: schema 1, gateway b's brief and failed
	// entry never written, and a brief of a gateway it no longer has.
	err = st.db.Update(func(tx *bolt.Tx) error {
		var gone error
		_ = tx.Bucket(bucketFailed).ForEach(func(k, _ []byte) error {
			if bytes.HasPrefix(k, []byte("b")) {
				gone = errors.Join(gone, tx.Bucket(bucketFailed).Delete(k))
			}
			return nil
		})
		return errors.Join(gone, tx.Bucket(bucketBriefs).Delete([]byte("b")),
			tx.Bucket(bucketBriefs).Put([]byte("ghost"), encodeBrief(GatewayBrief{ID: "ghost", State: StateOnline})),
			tx.Bucket(bucketMeta).Put(keySchema, u64(1)))
	})
	if err != nil || st.Close() != nil {
		t.Fatalf("make an older hub's file: %v", err)
	}
	st, err = Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	briefs, err := st.GatewayBriefs(t.Context())
	if err != nil || len(briefs) != 2 || briefs[0].ID != "a" || briefs[1].ID != "b" {
		t.Errorf("briefs after the refill: %+v, %v; want a's and b's", briefs, err)
	}
	n, err := st.FailedSince(t.Context(), failed.Mission.Finished.Add(-time.Hour), []string{"a", "b"})
	if err != nil || n["a"] != 1 || n["b"] != 1 {
		t.Errorf("failed since an hour before f1: %v, %v; want a 1 and b 1", n, err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	// A newer hub's file is refused, not read wrong.
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(keySchema, u64(schema+1)) }), db.Close()); err != nil {
		t.Fatal(err)
	}
	if st, err := Open(path, Options{NoSync: true}); !errors.Is(err, ErrInvalid) {
		if st != nil {
			_ = st.Close()
		}
		t.Errorf("a file of schema %d opened: %v, want ErrInvalid", schema+1, err)
	}
}
