package hub

import (
	"context"
	"fmt"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/uplink"
)

// tGlance is the week the glance's store cases count in: apart from the
// other cases' hours, which the PostgreSQL run's roll-up keeps.
var tGlance = time.Date(2027, 1, 15, 12, 30, 0, 0, time.UTC)

// finishedEntry is an outbox entry of mission id of scene, finished in
// state at at.
func finishedEntry(oseq uint64, id, scene string, at time.Time, state driver.State) uplink.Entry {
	e := entry(oseq, id, 1, state)
	e.Mission.Scene, e.Mission.Created, e.Mission.Updated, e.Mission.Finished = scene, at.Add(-time.Second), at, at
	e.Event.Time = at
	return e
}

// missionsOf stores n missions of gw and scene finished at at, failed
// of them failed, the rest succeeded.
func missionsOf(tb testing.TB, st Backing, gw, scene string, at time.Time, n, failed int) {
	tb.Helper()
	var es []uplink.Entry
	for i := range n {
		state := driver.StateSucceeded
		if i < failed {
			state = driver.StateFailed
		}
		es = append(es, finishedEntry(uint64(i+1), fmt.Sprintf("%s-%s-%d", scene, at.Format("0102T15"), i), scene, at, state))
	}
	if _, err := ingest(st, at, gw, batch(gw, es...)); err != nil {
		tb.Fatal(err)
	}
}

// TestWorstRanksByFailureRateWithTheCountsBehindIt: the ranking reads
// the week's roll-up of every gateway (and scene): 1 failed of 1 does
// not outrank 30 of 100, a scope under the minimum count is counted but
// not ranked, a failure older than the week is not counted, and a
// scope kind the roll-up does not keep (devices, for now) answers no
// rows.
func TestWorstRanksByFailureRateWithTheCountsBehindIt(t *testing.T) {
	st := testStore(t)
	now := tGlance
	day := func(d int) time.Time { return now.Add(-time.Duration(d) * 24 * time.Hour) }
	missionsOf(t, st, "big", "wake_up", day(1), 100, 30)  // 30%, from 100
	missionsOf(t, st, "one", "wake_up", day(2), 1, 1)     // 100%, from 1: below the minimum
	missionsOf(t, st, "half", "movie", day(3), 12, 6)     // 50%, from 12
	missionsOf(t, st, "clean", "movie", day(1), 50, 0)    // no failure
	missionsOf(t, st, "old", "go_home", day(9), 20, 20)   // before the week
	missionsOf(t, st, "mixed", "go_home", day(2), 40, 10) // 25%, from 40
	ctx := context.Background()

	w, err := BuildWorst(ctx, st.(totalsReader), "gateway", "7d", worstMin, 10, now)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range w.Entries {
		got = append(got, fmt.Sprintf("%s %d/%d", e.Name, e.Failures, e.Finished))
	}
	if want := []string{"half 6/12", "big 30/100", "mixed 10/40"}; !slices.Equal(got, want) {
		t.Errorf("worst gateways %v, want %v", got, want)
	}
	if w.Scopes != 5 || w.Failing != 4 || w.BelowMin != 1 {
		t.Errorf("scopes %d, failing %d, below the minimum %d; want 5, 4, 1", w.Scopes, w.Failing, w.BelowMin)
	}
	if e := w.Entries[1]; e.Rate != 0.3 || e.Succeeded != 70 || e.Failed != 30 || e.RateLow <= 0.2 || e.RateLow >= 0.3 {
		t.Errorf("big: %+v, want rate 0.3 of 70 succeeded and 30 failed, its lower bound between 0.2 and 0.3", e)
	}

	// With a minimum of 1, the single failure ranks, but below 30 of 100.
	w, err = BuildWorst(ctx, st.(totalsReader), "gateway", "7d", 1, 10, now)
	if err != nil {
		t.Fatal(err)
	}
	rank := map[string]int{}
	for i, e := range w.Entries {
		rank[e.Name] = i
	}
	if _, ok := rank["one"]; !ok || rank["one"] < rank["big"] {
		t.Errorf("with min 1 the ranking is %+v: want one (1 of 1) ranked, below big (30 of 100)", w.Entries)
	}

	w, err = BuildWorst(ctx, st.(totalsReader), "scene", "7d", worstMin, 10, now)
	if err != nil {
		t.Fatal(err)
	}
	got = nil
	for _, e := range w.Entries {
		got = append(got, fmt.Sprintf("%s %d/%d", e.Name, e.Failures, e.Finished))
	}
	// movie: 6 of 62; wake_up: 31 of 101; go_home: 10 of 40 (the old 20 out of range).
	if want := []string{"wake_up 31/101", "go_home 10/40", "movie 6/62"}; !slices.Equal(got, want) {
		t.Errorf("worst scenes %v, want %v", got, want)
	}

	w, err = BuildWorst(ctx, st.(totalsReader), "device", "7d", worstMin, 10, now)
	if err != nil || len(w.Entries) != 0 || w.Scopes != 0 {
		t.Errorf("devices: %+v, %v; want no rows", w, err)
	}
	if _, err := BuildWorst(ctx, st.(totalsReader), "room", "7d", worstMin, 10, now); err == nil || !strings.Contains(err.Error(), "device, gateway, scene") {
		t.Errorf("by=room: %v, want an error naming the scope kinds", err)
	}
}

// report has gateway gw say state, then (online) a heartbeat with
// backlog.
func report(tb testing.TB, st Backing, at time.Time, gw, state string, backlog int) {
	tb.Helper()
	in := []Inbound{{Gateway: gw, Status: &uplink.Status{Gateway: gw, State: state, Time: at}, Received: at}}
	if state == StateOnline {
		in = append(in, Inbound{Gateway: gw, Heartbeat: &uplink.Heartbeat{Gateway: gw, Version: "v1", Backlog: backlog, Time: at}, Received: at})
	}
	if _, err := st.Apply(context.Background(), in); err != nil {
		tb.Fatal(err)
	}
}

// TestGatewaysListIsPagedAndFilteredOnTheHub: the overview counts the
// gateways by presence and backlog, and the list answers a page of the
// gateways of a state or an ID's part, with the count of all that
// match, and the next page from where the last ended; without a page
// asked, every gateway, as before.
func TestGatewaysListIsPagedAndFilteredOnTheHub(t *testing.T) {
	st := testStore(t)
	now := time.Now()
	ids := make([]string, 30)
	for i := range ids {
		ids[i] = fmt.Sprintf("site-%02d", i)
	}
	if err := st.Register(t.Context(), now, ids...); err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		switch {
		case i < 20:
			report(t, st, now, id, StateOnline, i%5) // 16 with a backlog
		case i < 25:
			report(t, st, now, id, StateOffline, 0)
		}
	}
	e := newEnv(t)
	api := NewAPIOn(e.svc, st, APIOptions{Token: testToken})
	srv := httptest.NewServer(api)
	t.Cleanup(func() { api.Close(); srv.Close() })
	e.http = srv

	var o FleetOverview
	e.do(t, "GET", "/api/fleet/overview", "", &o)
	if o.Gateways != 30 || o.States[StateOnline] != 20 || o.States[StateOffline] != 5 || o.States[StateUnknown] != 5 || o.Conditions[CondBacklog] != 16 {
		t.Errorf("overview %+v, want 30 gateways: 20 online, 5 offline, 5 unknown, 16 with a backlog", o)
	}
	page := func(q string) GatewayPage {
		t.Helper()
		var p GatewayPage
		if code := e.do(t, "GET", "/api/gateways?"+q, "", &p); code != 200 {
			t.Fatalf("GET /api/gateways?%s: %d", q, code)
		}
		return p
	}
	idsOf := func(p GatewayPage) []string {
		var out []string
		for _, g := range p.Gateways {
			out = append(out, g.ID)
		}
		return out
	}
	if p := page(""); len(p.Gateways) != 30 || p.Total != 30 || p.Next != "" {
		t.Errorf("the whole list: %d gateways, total %d, next %q; want 30, 30, none", len(p.Gateways), p.Total, p.Next)
	}
	p := page("state=online&limit=8")
	if got := idsOf(p); len(got) != 8 || got[0] != "site-00" || p.Total != 20 || p.Next != "site-07" {
		t.Errorf("online, 8: %v, total %d, next %q; want site-00.., 20, site-07", got, p.Total, p.Next)
	}
	var all []string
	for after := ""; ; {
		p := page("state=online&limit=8&after=" + url.QueryEscape(after))
		all = append(all, idsOf(p)...)
		if after = p.Next; after == "" {
			break
		}
	}
	if !slices.Equal(all, ids[:20]) {
		t.Errorf("online, page by page: %v, want the 20 online", all)
	}
	if p := page("state=backlog&q=SITE-1&limit=50"); !slices.Equal(idsOf(p), []string{"site-11", "site-12", "site-13", "site-14", "site-16", "site-17", "site-18", "site-19"}) || p.Total != 8 {
		t.Errorf("backlog, ID with site-1: %v (total %d)", idsOf(p), p.Total)
	}
	if p := page("state=unknown"); p.Total != 5 || p.Gateways[0].State != StateUnknown {
		t.Errorf("unknown: %+v", p)
	}
	for _, q := range []string{"state=asleep", "limit=0", "limit=5000"} {
		if code := e.do(t, "GET", "/api/gateways?"+q, "", nil); code != 400 {
			t.Errorf("GET /api/gateways?%s: %d, want 400", q, code)
		}
	}
}

// glanceRig is a hub of n gateways, online in its store and known to a
// rollout engine (a fleetRig's, its offers caught at the Send seam),
// and the API over both.
func glanceRig(t *testing.T, n int) (*fleetRig, Release, *env, []string) {
	t.Helper()
	r := newFleetRig(t)
	st := r.st.(Backing)
	if pg, ok := st.(*PGStore); ok {
		// Under TestPGFleetStoreKeepsTheSameRollouts the other cases'
		// rigs know only the gateways they report to the engine: the
		// store's are emptied before and after.
		empty := func() {
			if _, err := pg.pool.Exec(context.Background(), `TRUNCATE sortie_gateways`); err != nil {
				t.Error(err)
			}
		}
		empty()
		t.Cleanup(empty)
	}
	base := r.push(testBundle(t, "", ""))
	r.push(testBundle(t, "v2", ""))
	ids := gatewayIDs(n)
	now := r.clock.Now()
	for _, id := range ids {
		report(t, st, now, id, StateOnline, 0)
	}
	r.online(base.Hash, ids...)
	e := newEnv(t)
	api := NewAPIOn(rigBackend{e.svc, r.f}, st, APIOptions{Token: testToken})
	srv := httptest.NewServer(api)
	t.Cleanup(func() { api.Close(); srv.Close() })
	e.http = srv
	return r, base, e, ids
}

// driftFiles has gateways report that they run hash from config files
// edited by hand since.
func driftFiles(r *fleetRig, hash string, gws ...string) {
	for _, id := range gws {
		r.f.NoteGateway(Gateway{ID: id, State: StateOnline, Heartbeat: &uplink.Heartbeat{Gateway: id, Time: r.clock.Now(),
			Config: &uplink.ConfigState{Hash: hash, Source: uplink.SourceFiles, Files: "edited"}}})
	}
	r.step()
}

// canaryOf4 starts a rollout of the rig's second release to the
// gateways of tag ("" all) with a canary of 4, of which 3 become healthy
// and the last fails (rejected as invalid), a minute apart; 50% failed
// of at least 3 would abort it.
func canaryOf4(r *fleetRig, tag string) (RolloutView, []outgoing) {
	r.t.Helper()
	v, err := r.f.StartRollout(r.t.Context(), RolloutSpec{Tag: tag, Canary: 4, AbortPercent: 50, AbortMin: 3, Soak: driver.Duration(time.Hour)})
	if err != nil {
		r.t.Fatal(err)
	}
	r.step()
	canary := r.take()
	if len(canary) != 4 {
		r.t.Fatalf("%d offers, want the canary's 4", len(canary))
	}
	for _, o := range canary[:3] {
		r.clock.add(time.Minute)
		r.answer(o, uplink.BundleReceived, uplink.BundleApplied, uplink.BundleHealthy)
	}
	r.clock.add(time.Minute)
	r.answer(canary[3], uplink.BundleReceived, uplink.BundleRejected)
	r.step()
	return r.view(v.ID), canary
}

// TestOverviewCountsDriftAndRolloutsAndTheListFiltersByThem: the
// glance counts the gateways drifted, in an active rollout without an
// outcome, and failed by their rollout, and by tag; the list filters
// by each.
func TestOverviewCountsDriftAndRolloutsAndTheListFiltersByThem(t *testing.T) {
	r, base, e, ids := glanceRig(t, 30)
	ctx := t.Context()
	kitchen := ids[10:20]
	for _, id := range kitchen {
		if _, err := r.f.SetTags(ctx, id, []string{"kitchen"}); err != nil {
			t.Fatal(err)
		}
	}
	driftFiles(r, base.Hash, ids[:2]...)
	_, canary := canaryOf4(r, "kitchen")

	var o FleetOverview
	e.do(t, "GET", "/api/fleet/overview", "", &o)
	want := map[string]int{CondBacklog: 0, CondDrifted: 2, CondRollout: 6, CondRolloutFailed: 1}
	if !o.Rollouts || o.States[StateOnline] != 30 || fmt.Sprint(o.Conditions) != fmt.Sprint(want) || o.Tags["kitchen"] != 10 {
		t.Errorf("overview %+v, want 30 online, conditions %v, 10 kitchen", o, want)
	}
	for _, c := range []struct {
		q    string
		want []string
	}{
		{"state=drifted", ids[:2]},
		{"state=rollout_failed", []string{canary[3].gw}},
		{"state=rollout&tag=kitchen&limit=100", func() []string {
			var out []string
			for _, id := range kitchen {
				if !slices.ContainsFunc(canary, func(o outgoing) bool { return o.gw == id }) {
					out = append(out, id)
				}
			}
			return out
		}()},
		{"tag=kitchen&q=gw-1&limit=3", kitchen[:3]},
	} {
		var p GatewayPage
		e.do(t, "GET", "/api/gateways?"+c.q, "", &p)
		var got []string
		for _, g := range p.Gateways {
			got = append(got, g.ID)
			if strings.Contains(c.q, "state=") && !slices.Contains(g.Conditions, strings.Split(strings.TrimPrefix(c.q, "state="), "&")[0]) {
				t.Errorf("%s: %s has conditions %v", c.q, g.ID, g.Conditions)
			}
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("GET /api/gateways?%s: %v, want %v", c.q, got, c.want)
		}
	}
}

// TestRolloutPageCountsEveryGatewayAndPagesSome: a rollout's page
// answers the gateways asked for (by status, kind, ID, a page at a
// time) with the counts of all of them, the same as the whole view's;
// without a page asked, every gateway, as the CLI reads it.
func TestRolloutPageCountsEveryGatewayAndPagesSome(t *testing.T) {
	r, _, e, _ := glanceRig(t, 250)
	v, canary := canaryOf4(r, "")
	r.clock.add(time.Minute)

	var whole RolloutView
	e.do(t, "GET", "/api/rollouts/"+v.ID, "", &whole)
	if len(whole.Gateways) != 250 || whole.Kinds != nil {
		t.Fatalf("the whole view has %d gateways (kinds %v), want 250 and no page's counts", len(whole.Gateways), whole.Kinds)
	}
	get := func(q string) RolloutView {
		t.Helper()
		var p RolloutView
		if code := e.do(t, "GET", "/api/rollouts/"+v.ID+"?"+q, "", &p); code != 200 {
			t.Fatalf("GET ?%s: %d", q, code)
		}
		if fmt.Sprint(p.Counts) != fmt.Sprint(whole.Counts) || p.Targets != 250 {
			t.Errorf("?%s counts %v of %d, want the whole view's %v of 250", q, p.Counts, p.Targets, whole.Counts)
		}
		return p
	}
	p := get("limit=100")
	if len(p.Gateways) != 100 || p.Matched != 250 || p.Next != "99" || p.Gateways[0].Order != 0 {
		t.Errorf("first page: %d gateways, matched %d, next %q", len(p.Gateways), p.Matched, p.Next)
	}
	want := map[string]int{TargetHealthy: 3, TargetFailed: 1, TargetPending: 246}
	if fmt.Sprint(p.Kinds) != fmt.Sprint(want) {
		t.Errorf("kinds %v, want %v", p.Kinds, want)
	}
	perStage := 0
	for i, sk := range p.StageKinds {
		for _, n := range sk {
			perStage += n
		}
		if i == 0 && (sk[TargetHealthy] != 3 || sk[TargetFailed] != 1) {
			t.Errorf("the canary's kinds %v, want 3 healthy and 1 failed", sk)
		}
	}
	if perStage != 250 || len(p.StageKinds) != len(whole.Stages) {
		t.Errorf("%d stages of %d gateways, want %d of 250", len(p.StageKinds), perStage, len(whole.Stages))
	}
	if pr := p.Progress; pr == nil || pr.Totals[TargetHealthy] != 3 || pr.Totals[TargetFailed] != 1 ||
		pr.Series[TargetHealthy][len(pr.Series[TargetHealthy])-1] != 3 || pr.Series[TargetHealthy][0] != 0 {
		t.Errorf("progress %+v, want 3 healthy and 1 failed, none at the start", p.Progress)
	}
	var seen []string
	for after := ""; ; {
		p := get("limit=100&after=" + after)
		for _, g := range p.Gateways {
			seen = append(seen, g.Gateway)
		}
		if after = p.Next; after == "" {
			break
		}
	}
	if len(seen) != 250 || len(slices.Compact(slices.Sorted(slices.Values(seen)))) != 250 {
		t.Errorf("page by page: %d gateways, want each of the 250 once", len(seen))
	}
	if p := get("status=failed"); p.Matched != 1 || len(p.Gateways) != 1 || p.Gateways[0].Gateway != canary[3].gw || p.Gateways[0].Reason != uplink.ReasonInvalid {
		t.Errorf("status=failed: %+v", p.Gateways)
	}
	if p := get("kind=healthy,failed&limit=2"); p.Matched != 4 || len(p.Gateways) != 2 || p.Next == "" {
		t.Errorf("kind=healthy,failed&limit=2: matched %d, %d gateways, next %q", p.Matched, len(p.Gateways), p.Next)
	}
	if p := get("gateway=" + canary[0].gw); p.Matched != 1 {
		t.Errorf("gateway=%s: matched %d", canary[0].gw, p.Matched)
	}
	for _, q := range []string{"limit=0", "limit=5000", "after=x"} {
		if code := e.do(t, "GET", "/api/rollouts/"+v.ID+"?"+q, "", nil); code != 400 {
			t.Errorf("?%s: %d, want 400", q, code)
		}
	}
}

// FuzzGlanceQuery: the gateways list's and a rollout page's query
// strings are refused with an error or give a filter that pages
// without a panic; a page is never longer than its limit.
func FuzzGlanceQuery(f *testing.F) {
	for _, s := range []string{"state=drifted&tag=lab&q=gw&limit=5&after=gw-01", "status=failed,rollback_failed&kind=offered&gateway=x&limit=2&after=3", "limit=-1", "after=%zz", "state=asleep"} {
		f.Add(s)
	}
	gws := []GatewayBrief{{ID: "gw-01", State: StateOnline}, {ID: "gw-02", State: StateOffline, Backlog: 3}, {ID: "lab-1"}}
	targets := []*RolloutGateway{{Gateway: "gw-01", Order: 0, Status: TargetFailed}, {Gateway: "gw-02", Order: 1, Status: TargetPending, Refused: "x"},
		{Gateway: "gw-03", Order: 2, Status: TargetHealthy, Back: BackRolledBack}}
	f.Fuzz(func(t *testing.T, raw string) {
		v, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		if g, err := parseGatewayFilter(v); err == nil {
			for i := range gws {
				g.match(gws[i], gatewayFacts{tags: []string{"lab"}})
			}
		}
		s, _, err := parseRolloutSelect(v)
		if err != nil {
			return
		}
		fl := NewFleet(nil, FleetOptions{})
		run := &rolloutRun{r: &Rollout{ID: "r-1", Stages: []int{1, 3}}, targets: targets}
		var view RolloutView
		fl.pageLocked(run, &view, s)
		if len(view.Gateways) > s.Limit || view.Matched > len(targets) {
			t.Fatalf("%q: %d gateways of limit %d, %d matched", raw, len(view.Gateways), s.Limit, view.Matched)
		}
	})
}
