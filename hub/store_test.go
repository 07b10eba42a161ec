package hub

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/uplink"
)

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// testStore opens an empty store: a bbolt file, or, in the run of the
// store cases that TestPGStoreKeepsTheSameRules starts, its PostgreSQL
// database (pgStoreEnv names it), emptied. A test or fuzz target that
// calls it in its own body is a store case: it runs on both backends.
func testStore(tb testing.TB) Backing {
	tb.Helper()
	var st Backing
	var err error
	if dsn := os.Getenv(pgStoreEnv); dsn != "" {
		var pg *PGStore
		if pg, err = OpenPG(context.Background(), dsn); err == nil {
			_, err = pg.pool.Exec(context.Background(), `TRUNCATE sortie_gateways, sortie_missions, sortie_events, sortie_traces, sortie_outcomes`)
			st = pg
		}
	} else {
		st, err = Open(filepath.Join(tb.TempDir(), "hub.db"), Options{NoSync: true})
	}
	if err != nil {
		tb.Fatalf("open: %v", err)
	}
	tb.Cleanup(func() { _ = st.Close() })
	return st
}

// ingest stores one batch from gateway gw.
func ingest(st Backing, now time.Time, gw string, b uplink.Batch) (Result, error) {
	return st.Apply(context.Background(), []Inbound{{Gateway: gw, Batch: &b, Received: now}})
}

// entry builds an outbox entry: outbox seq oseq carrying event seq of
// mission id, with a summary in state.
func entry(oseq uint64, id string, seq uint64, state driver.State) uplink.Entry {
	created := t0.Add(time.Duration(len(id)) * time.Second)
	sum := driver.Summary{Scene: "go_home", State: state, Steps: 2, StepIDs: []string{"lights", "ac"}, Created: created, Updated: created.Add(time.Duration(seq) * time.Second)}
	if state.Terminal() {
		sum.Finished = sum.Updated
	}
	return uplink.Entry{
		Seq:     oseq,
		Event:   driver.Event{MissionID: id, Seq: seq, Type: "transition", To: state, Step: -1, Time: sum.Updated},
		Mission: sum,
	}
}

func batch(gw string, es ...uplink.Entry) uplink.Batch { return uplink.Batch{Gateway: gw, Entries: es} }

func compacted(e uplink.Entry) uplink.Entry { e.Compacted = true; return e }

func TestIngest(t *testing.T) {
	type want struct {
		stored, dups, late int
		seq                uint64
		events             int
		gaps               []Gap // Detected is ignored
		state              driver.State
		acks               []uint64 // ack per Ingest call
	}
	cases := []struct {
		name    string
		batches []uplink.Batch
		want    want
	}{
		{
			name:    "in order",
			batches: []uplink.Batch{batch("gw", entry(1, "m1", 1, driver.StatePending), entry(2, "m1", 2, driver.StateRunning))},
			want:    want{stored: 2, seq: 2, events: 2, state: driver.StateRunning, acks: []uint64{2}},
		},
		{
			name: "redelivered batch changes nothing",
			batches: []uplink.Batch{
				batch("gw", entry(1, "m1", 1, driver.StatePending), entry(2, "m1", 2, driver.StateRunning)),
				batch("gw", entry(1, "m1", 1, driver.StatePending), entry(2, "m1", 2, driver.StateRunning)),
			},
			want: want{stored: 2, dups: 2, seq: 2, events: 2, state: driver.StateRunning, acks: []uint64{2, 2}},
		},
		{
			name:    "duplicate inside a batch",
			batches: []uplink.Batch{batch("gw", entry(1, "m1", 1, driver.StatePending), entry(1, "m1", 1, driver.StatePending))},
			want:    want{stored: 1, dups: 1, seq: 1, events: 1, state: driver.StatePending, acks: []uint64{1}},
		},
		{
			name:    "missing seq is a gap",
			batches: []uplink.Batch{batch("gw", entry(1, "m1", 1, driver.StatePending), entry(2, "m1", 4, driver.StateRunning))},
			want:    want{stored: 2, seq: 4, events: 2, gaps: []Gap{{From: 2, To: 3}}, state: driver.StateRunning, acks: []uint64{2}},
		},
		{
			name:    "first seen mid-mission is a gap",
			batches: []uplink.Batch{batch("gw", entry(7, "m1", 3, driver.StateRunning))},
			want:    want{stored: 1, seq: 3, events: 1, gaps: []Gap{{From: 1, To: 2}}, state: driver.StateRunning, acks: []uint64{7}},
		},
		{
			name:    "compacted gap is expected",
			batches: []uplink.Batch{batch("gw", entry(1, "m1", 1, driver.StatePending), compacted(entry(9, "m1", 6, driver.StateSucceeded)))},
			want:    want{stored: 2, seq: 6, events: 2, gaps: []Gap{{From: 2, To: 5, Compacted: true}}, state: driver.StateSucceeded, acks: []uint64{9}},
		},
		{
			name: "late event fills the gap and keeps the newest summary",
			batches: []uplink.Batch{
				batch("gw", entry(1, "m1", 1, driver.StatePending), entry(3, "m1", 3, driver.StateSucceeded)),
				batch("gw", entry(2, "m1", 2, driver.StateRunning)),
			},
			want: want{stored: 3, late: 1, seq: 3, events: 3, state: driver.StateSucceeded, acks: []uint64{3, 2}},
		},
		{
			name: "late event splits a wide gap",
			batches: []uplink.Batch{
				batch("gw", entry(1, "m1", 1, driver.StatePending), entry(2, "m1", 6, driver.StateRunning)),
				batch("gw", entry(3, "m1", 3, driver.StateRunning)),
			},
			want: want{stored: 3, late: 1, seq: 6, events: 3, gaps: []Gap{{From: 2, To: 2, Origin: 2}, {From: 4, To: 5, Origin: 2}}, state: driver.StateRunning, acks: []uint64{2, 3}},
		},
		{
			name: "the pieces of a split gap filled count one gap filled",
			batches: []uplink.Batch{
				batch("gw", entry(1, "m1", 1, driver.StatePending), entry(2, "m1", 5, driver.StateRunning)),
				batch("gw", entry(3, "m1", 3, driver.StateRunning)),
				batch("gw", entry(4, "m1", 2, driver.StateRunning)),
				batch("gw", entry(5, "m1", 4, driver.StateRunning)),
			},
			want: want{stored: 5, late: 3, seq: 5, events: 5, state: driver.StateRunning, acks: []uint64{2, 3, 4, 5}},
		},
		{
			name: "reversed order",
			batches: []uplink.Batch{
				batch("gw", entry(2, "m1", 2, driver.StateRunning)),
				batch("gw", entry(1, "m1", 1, driver.StatePending)),
			},
			want: want{stored: 2, late: 1, seq: 2, events: 2, state: driver.StateRunning, acks: []uint64{2, 1}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := testStore(t)
			var got want
			for i, b := range tc.batches {
				res, err := ingest(st, t0.Add(time.Duration(i)*time.Second), "gw", b)
				if err != nil {
					t.Fatalf("ingest %d: %v", i, err)
				}
				if len(res.Rejected) > 0 {
					t.Fatalf("ingest %d rejected: %v", i, res.Rejected)
				}
				got.stored += res.Stored
				got.dups += res.Duplicates
				got.late += res.Late
				got.acks = append(got.acks, res.Acks["gw"].Upto)
			}
			d, err := st.Mission(t.Context(), "gw", "m1")
			if err != nil {
				t.Fatalf("mission: %v", err)
			}
			got.seq, got.events, got.state = d.Seq, d.Events, d.Summary.State
			for _, g := range d.Gaps {
				g.Detected = time.Time{}
				got.gaps = append(got.gaps, g)
			}
			if _, shared := st.(*PGStore); shared {
				// These batches have no After (protocol 1): the cluster's
				// store keeps them and acks none.
				tc.want.acks = make([]uint64, len(tc.want.acks))
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
			if len(d.Timeline) != d.Events {
				t.Errorf("timeline has %d events, record says %d", len(d.Timeline), d.Events)
			}
			for i := 1; i < len(d.Timeline); i++ {
				if d.Timeline[i].Seq <= d.Timeline[i-1].Seq {
					t.Errorf("timeline out of order: %d after %d", d.Timeline[i].Seq, d.Timeline[i-1].Seq)
				}
			}
			g, err := st.Gateway(t.Context(), "gw")
			if err != nil {
				t.Fatal(err)
			}
			if g.Events != uint64(tc.want.stored) || g.Duplicates != uint64(tc.want.dups) {
				t.Errorf("gateway counters events=%d dups=%d, want %d %d", g.Events, g.Duplicates, tc.want.stored, tc.want.dups)
			}
			// A gap every missing event later arrived for counts as filled.
			if wantFilled := map[bool]uint64{true: g.Gaps, false: 0}[len(tc.want.gaps) == 0]; g.GapsFilled != wantFilled {
				t.Errorf("gateway counts %d gaps, %d filled; want %d filled", g.Gaps, g.GapsFilled, wantFilled)
			}
		})
	}
}

func TestIngestRejects(t *testing.T) {
	st := testStore(t)
	bad := []struct {
		name string
		in   Inbound
	}{
		{"batch for another gateway", Inbound{Gateway: "gw", Batch: &uplink.Batch{Gateway: "other", Entries: []uplink.Entry{entry(1, "m1", 1, driver.StatePending)}}}},
		{"zero seq", Inbound{Gateway: "gw", Batch: &uplink.Batch{Gateway: "gw", Entries: []uplink.Entry{entry(1, "m1", 1, driver.StatePending), entry(0, "m1", 2, driver.StatePending)}}}},
		{"bad mission id", Inbound{Gateway: "gw", Batch: &uplink.Batch{Gateway: "gw", Entries: []uplink.Entry{entry(1, "m/1", 1, driver.StatePending)}}}},
		{"bad gateway id", Inbound{Gateway: "g w", Status: &uplink.Status{State: StateOnline}}},
		{"status for another gateway", Inbound{Gateway: "gw", Status: &uplink.Status{Gateway: "x", State: StateOnline}}},
		{"empty", Inbound{Gateway: "gw"}},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			res, err := st.Apply(t.Context(), []Inbound{tc.in})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Rejected) != 1 || !errors.Is(res.Rejected[0], ErrInvalid) {
				t.Fatalf("rejected = %v, want one ErrInvalid", res.Rejected)
			}
			if res.Stored != 0 || len(res.Acks) != 0 || len(res.Missions) != 0 {
				t.Fatalf("a rejected message changed something: %+v", res)
			}
		})
	}
	if _, err := st.Mission(t.Context(), "gw", "m1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("mission of a rejected batch: err = %v, want ErrNotFound", err)
	}
}

func TestPresence(t *testing.T) {
	st := testStore(t)
	if err := st.Register(t.Context(), t0, "gw", "idle"); err != nil {
		t.Fatal(err)
	}
	hb := uplink.Heartbeat{Gateway: "gw", Version: "1.2", Backlog: 3, Devices: []uplink.DeviceState{{ID: "lamp", Type: "light", Online: true}}}
	_, err := st.Apply(t.Context(), []Inbound{
		{Gateway: "gw", Status: &uplink.Status{Gateway: "gw", State: StateOnline, Version: "1.1"}, Received: t0},
		{Gateway: "gw", Heartbeat: &hb, Received: t0.Add(time.Second)},
	})
	if err != nil {
		t.Fatal(err)
	}
	gws, err := st.Gateways(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(gws) != 2 {
		t.Fatalf("got %d gateways, want 2", len(gws))
	}
	g := gws[0]
	if g.ID != "gw" || g.State != StateOnline || g.Version != "1.2" || g.Heartbeat == nil || g.Heartbeat.Backlog != 3 || !g.LastHeartbeat.Equal(t0.Add(time.Second)) {
		t.Errorf("gateway = %+v", g)
	}
	if gws[1].ID != "idle" || gws[1].State != StateUnknown {
		t.Errorf("registered gateway = %+v, want unknown", gws[1])
	}
	if _, err := st.Apply(t.Context(), []Inbound{{Gateway: "gw", Status: &uplink.Status{Gateway: "gw", State: StateOffline}, Received: t0.Add(time.Minute)}}); err != nil {
		t.Fatal(err)
	}
	if g, _ := st.Gateway(t.Context(), "gw"); g.State != StateOffline || !g.Since.Equal(t0.Add(time.Minute)) {
		t.Errorf("after offline: %+v", g)
	}
	if _, err := st.Gateway(t.Context(), "nope"); !errors.Is(err, ErrUnknownGateway) {
		t.Errorf("unknown gateway: err = %v", err)
	}
}

func TestMissionsPaging(t *testing.T) {
	st := testStore(t)
	var in []Inbound
	for i := range 25 {
		gw := []string{"a", "b"}[i%2]
		e := entry(uint64(i+1), fmt.Sprintf("m%02d", i), 1, driver.StateRunning)
		e.Mission.Created = t0.Add(time.Duration(i) * time.Minute)
		if i%5 == 0 {
			e.Mission.Scene = "leave"
		}
		in = append(in, Inbound{Gateway: gw, Batch: &uplink.Batch{Gateway: gw, Entries: []uplink.Entry{e}}, Received: t0})
	}
	if _, err := st.Apply(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	var all []string
	cursor := ""
	for page := 0; ; page++ {
		ms, next, err := st.Missions(t.Context(), Query{Limit: 10, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			all = append(all, m.ID)
		}
		if next == "" {
			break
		}
		cursor = next
		if page > 5 {
			t.Fatal("paging does not end")
		}
	}
	if len(all) != 25 || all[0] != "m24" || all[24] != "m00" {
		t.Fatalf("paged ids = %v", all)
	}
	for i := 1; i < len(all); i++ {
		if all[i] >= all[i-1] {
			t.Fatalf("not newest first: %v", all)
		}
	}
	check := func(q Query, want int) {
		t.Helper()
		ms, _, err := st.Missions(t.Context(), q)
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) != want {
			t.Errorf("%+v: got %d missions, want %d", q, len(ms), want)
		}
	}
	check(Query{Gateway: "a", Limit: 100}, 13)
	check(Query{Scene: "leave"}, 5)
	check(Query{States: []driver.State{driver.StateSucceeded}}, 0)
	check(Query{Since: t0.Add(20 * time.Minute)}, 5)
	check(Query{Until: t0.Add(5 * time.Minute)}, 5)
	check(Query{Since: t0.Add(5 * time.Minute), Until: t0.Add(10 * time.Minute), Gateway: "b"}, 3)
	if _, _, err := st.Missions(t.Context(), Query{Cursor: "%%%"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("bad cursor: err = %v", err)
	}
}

func TestPrune(t *testing.T) {
	st := testStore(t)
	var in []Inbound
	for i := range 6 {
		state := driver.StateSucceeded
		if i == 0 {
			state = driver.StateRunning // old but active: never pruned
		}
		e := entry(uint64(i+1), fmt.Sprintf("m%d", i), 1, state)
		e.Mission.Created = t0.Add(time.Duration(i) * time.Hour)
		e.Mission.Finished = e.Mission.Created
		in = append(in, Inbound{Gateway: "gw", Batch: &uplink.Batch{Gateway: "gw", Entries: []uplink.Entry{e}}, Received: t0})
	}
	if _, err := st.Apply(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	n, err := st.Prune(t.Context(), t0.Add(5*time.Hour), Retention{MaxAge: 150 * time.Minute})
	if err != nil || n != 2 { // m1, m2 finished more than 2.5h before
		t.Fatalf("prune by age removed %d (%v), want 2", n, err)
	}
	n, err = st.Prune(t.Context(), t0.Add(5*time.Hour), Retention{MaxCount: 2})
	if err != nil || n != 1 { // m3 is the oldest of m3..m5
		t.Fatalf("prune by count removed %d (%v), want 1", n, err)
	}
	ms, _, err := st.Missions(t.Context(), Query{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range ms {
		ids = append(ids, m.ID)
	}
	if want := []string{"m5", "m4", "m0"}; !reflect.DeepEqual(ids, want) {
		t.Fatalf("left %v, want %v", ids, want)
	}
	if _, err := st.Mission(t.Context(), "gw", "m1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("pruned mission: %v", err)
	}
}

func TestTimings(t *testing.T) {
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	sum := driver.Summary{State: driver.StateFailed, Steps: 3, StepIDs: []string{"a", "b", "c"}}
	evs := []driver.Event{
		{Seq: 1, Input: driver.InStart, Step: -1, Time: at(0)},
		{Seq: 2, Input: driver.InBeginStep, Step: 0, StepID: "a", Attempt: 1, Time: at(1)},
		{Seq: 3, Input: driver.InStepOK, Step: 0, StepID: "a", Attempt: 1, Time: at(3)},
		{Seq: 4, Input: driver.InNext, Step: 0, Time: at(3)},
		{Seq: 5, Input: driver.InBeginStep, Step: 1, StepID: "b", Attempt: 1, Time: at(4)},
		{Seq: 6, Input: driver.InStepError, Step: 1, StepID: "b", Attempt: 1, Error: "busy", Time: at(5)},
		{Seq: 7, Input: driver.InBeginStep, Step: 1, StepID: "b", Attempt: 2, Time: at(6)},
		{Seq: 8, Input: driver.InStepError, Step: 1, StepID: "b", Attempt: 2, Error: "jammed", Code: "jam", Time: at(8)},
		{Seq: 9, Input: driver.InFail, Step: -1, Time: at(8)},
	}
	got := Timings(sum, evs)
	want := []StepTiming{
		{Index: 0, ID: "a", Status: driver.StepSucceeded, Attempts: 1, Started: at(1), Finished: at(3), DurationMS: 2000, DurationUS: 2e6},
		{Index: 1, ID: "b", Status: driver.StepFailed, Attempts: 2, Started: at(4), Finished: at(8), DurationMS: 4000, DurationUS: 4e6, Error: "jammed", Code: "jam"},
		{Index: 2, ID: "c", Status: driver.StepPending},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
}

func TestOpenTwiceTimesOut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hub.db")
	st, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := st.Close(); err != nil {
			t.Error(err)
		}
	}()
	if _, err := Open(path, Options{Timeout: 50 * time.Millisecond}); err == nil {
		t.Fatal("second open of a locked file succeeded")
	}
}

// TestFailedSinceCountsRecentFailuresPerGateway pins the dashboard's
// "failed in the last 24 h": failures finished in the window, per
// gateway; not older ones, not other outcomes.
func TestFailedSinceCountsRecentFailuresPerGateway(t *testing.T) {
	st := testStore(t)
	finished := func(oseq uint64, id string, state driver.State, at time.Time) uplink.Entry {
		e := entry(oseq, id, 1, state)
		e.Mission.Updated, e.Mission.Finished, e.Event.Time = at, at, at
		return e
	}
	now := t0.Add(48 * time.Hour)
	for gw, es := range map[string][]uplink.Entry{
		"a": {finished(1, "old", driver.StateFailed, now.Add(-25*time.Hour)), finished(2, "f1", driver.StateFailed, now.Add(-time.Hour)),
			finished(3, "f2", driver.StateFailed, now.Add(-23*time.Hour)), finished(4, "ok", driver.StateSucceeded, now.Add(-time.Minute))},
		"b": {finished(1, "c", driver.StateCancelled, now.Add(-time.Minute))},
	} {
		if _, err := ingest(st, now, gw, batch(gw, es...)); err != nil {
			t.Fatal(err)
		}
	}
	got, err := st.FailedSince(t.Context(), now.Add(-24*time.Hour), []string{"a", "b", "c"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got["a"] != 2 {
		t.Fatalf("FailedSince = %v, want a: 2 only", got)
	}
}

// TestPresenceIgnoresOlderNews: replicas of a clustered hub apply
// messages out of order; a heartbeat sent before the gateway's last
// will must not mark it online again when it is applied after.
func TestPresenceIgnoresOlderNews(t *testing.T) {
	st := testStore(t)
	hb := uplink.Heartbeat{Gateway: "gw"}
	_, err := st.Apply(t.Context(), []Inbound{
		{Gateway: "gw", Status: &uplink.Status{Gateway: "gw", State: StateOnline}, Received: t0},
		{Gateway: "gw", Status: &uplink.Status{Gateway: "gw", State: StateOffline}, Received: t0.Add(2 * time.Second)},
		{Gateway: "gw", Heartbeat: &hb, Received: t0.Add(time.Second)},
		{Gateway: "gw", Status: &uplink.Status{Gateway: "gw", State: StateOnline}, Received: t0.Add(time.Second)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if g, _ := st.Gateway(t.Context(), "gw"); g.State != StateOffline || !g.Since.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("after late news: %s since %s, want offline since the will", g.State, g.Since)
	}
}

// TestNewestStatusSaysWhereTheGatewayIs: a heartbeat sent after the
// gateway's status but applied first (another replica's) decides its
// state; the status, applied late, still says which node it is on and
// when it started.
func TestNewestStatusSaysWhereTheGatewayIs(t *testing.T) {
	st := testStore(t)
	hb := uplink.Heartbeat{Gateway: "gw"}
	started := t0.Add(-time.Minute)
	_, err := st.Apply(t.Context(), []Inbound{
		{Gateway: "gw", Status: &uplink.Status{Gateway: "gw", State: StateOnline, Broker: "tcp://n1:1883", Started: started.Add(-time.Hour)}, Received: t0},
		{Gateway: "gw", Heartbeat: &hb, Received: t0.Add(2 * time.Second)},
		{Gateway: "gw", Status: &uplink.Status{Gateway: "gw", State: StateOnline, Broker: "tcp://n2:1883", Started: started, Protocol: uplink.Protocol}, Received: t0.Add(time.Second)},
		{Gateway: "gw", Status: &uplink.Status{Gateway: "gw", State: StateOnline, Broker: "tcp://n3:1883"}, Received: t0.Add(time.Second / 2)},
	})
	if err != nil {
		t.Fatal(err)
	}
	g, _ := st.Gateway(t.Context(), "gw")
	if g.State != StateOnline || !g.PresenceAt.Equal(t0.Add(2*time.Second)) || g.Broker != "tcp://n2:1883" || !g.Started.Equal(started) || g.Protocol != uplink.Protocol {
		t.Fatalf("record %+v: want online as of the heartbeat, on n2 (the newest status), started %v, protocol %d", g, started, uplink.Protocol)
	}
}

// TestStoreCallsStopWhenTheirContextIsDone: every call of a store given
// a context that is done returns its error and changes nothing.
func TestStoreCallsStopWhenTheirContextIsDone(t *testing.T) {
	st := testStore(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	b := uplink.Batch{Gateway: "gw", Entries: []uplink.Entry{entry(1, "m1", 1, driver.StatePending)}}
	calls := map[string]func() error{
		"Apply": func() error {
			_, err := st.Apply(ctx, []Inbound{{Gateway: "gw", Batch: &b, Received: t0}})
			return err
		},
		"Register":      func() error { return st.Register(ctx, t0, "idle") },
		"Prune":         func() error { _, err := st.Prune(ctx, t0, Retention{MaxCount: 1}); return err },
		"Gateways":      func() error { _, err := st.Gateways(ctx); return err },
		"Gateway":       func() error { _, err := st.Gateway(ctx, "gw"); return err },
		"Missions":      func() error { _, _, err := st.Missions(ctx, Query{}); return err },
		"Mission":       func() error { _, err := st.Mission(ctx, "gw", "m1"); return err },
		"FailedSince":   func() error { _, err := st.FailedSince(ctx, t0, []string{"gw"}); return err },
		"GatewayBriefs": func() error { _, err := st.GatewayBriefs(ctx); return err },
		"GatewaysByID":  func() error { _, err := st.GatewaysByID(ctx, []string{"gw"}); return err },
		"Trace":         func() error { _, err := st.Trace(ctx, "gw", "r-1"); return err },
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a cancelled context: %v, want context.Canceled", name, err)
		}
	}
	if gws, err := st.Gateways(t.Context()); err != nil || len(gws) != 0 {
		t.Errorf("after the cancelled calls the store holds %v (%v), want nothing", gws, err)
	}
}

// TestPendingKeepsTheBatchesNearestTheCursor: past maxPending batches
// stored beyond a missing one, the farthest is forgotten, not the
// nearest, so once the missing batch comes the cursor runs across all
// that are kept (a replica held back on one batch while another stored
// many is the usual way there).
func TestPendingKeepsTheBatchesNearestTheCursor(t *testing.T) {
	g := &Gateway{Acked: 3}
	for i := uint64(1); i <= maxPending+10; i++ {
		g.advance(3*i+3, 3*i+6) // batches 6..9, 9..12, ...; 3..6 is missing
	}
	if len(g.Pending) != maxPending {
		t.Fatalf("%d pending, want %d", len(g.Pending), maxPending)
	}
	g.advance(3, 6)
	if want := uint64(3*maxPending + 6); g.Acked != want || len(g.Pending) != 0 {
		t.Errorf("after the missing batch: acked %d, %d pending; want %d, 0", g.Acked, len(g.Pending), want)
	}
	// A nearer batch still displaces a farther one when full.
	g = &Gateway{Acked: 0}
	for i := uint64(2); i < maxPending+2; i++ {
		g.advance(10*i, 10*i+10)
	}
	g.advance(10, 20)
	g.advance(0, 10)
	if want := uint64(10*maxPending + 10); g.Acked != want {
		t.Errorf("acked %d, want %d: the nearer batch was not kept", g.Acked, want)
	}
}
