package hub

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"
)

// TestDashboardShowsTheFleetAtAGlance: a hub of 130 gateways (online,
// offline, never reported, with a backlog, drifted, in a rollout whose
// canary failed on one) and finished missions of several gateways and
// scenes. The page's counts are the API's, each a link to the gateways
// of that state; the worst gateways and scenes are in the API's order
// with the counts behind each rate, and a gateway's link lists its
// failed missions; the device panel says it has no data yet.
// Screenshots, light and dark, go to $SORTIE_ARTIFACTS.
func TestDashboardShowsTheFleetAtAGlance(t *testing.T) {
	bin := needChromium(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	r, base, e, ids := glanceRig(t, 120)
	st := r.st.(Backing)
	now := time.Now()
	for _, id := range ids[100:115] {
		report(t, st, now, id, StateOffline, 0)
	}
	for _, id := range ids[:7] {
		report(t, st, now, id, StateOnline, 3)
	}
	if err := st.Register(ctx, now, "new-1", "new-2", "new-3", "new-4", "new-5", "new-6", "new-7", "new-8", "new-9", "new-10"); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids[20:30] {
		if _, err := r.f.SetTags(ctx, id, []string{"kitchen"}); err != nil {
			t.Fatal(err)
		}
	}
	driftFiles(r, base.Hash, ids[40:43]...)
	canaryOf4(r, "kitchen")
	hour := func(h int) time.Time { return now.Add(-time.Duration(h) * time.Hour) }
	missionsOf(t, st, ids[5], "wake_up", hour(3), 40, 20)   // 50% of 40
	missionsOf(t, st, ids[6], "wake_up", hour(30), 100, 30) // 30% of 100
	missionsOf(t, st, ids[7], "movie", hour(2), 1, 1)       // 1 of 1: below the minimum
	missionsOf(t, st, ids[8], "go_home", hour(50), 60, 3)   // 5% of 60
	missionsOf(t, st, ids[9], "go_home", hour(1), 30, 0)

	var o FleetOverview
	e.do(t, "GET", "/api/fleet/overview", "", &o)
	if o.Gateways != 130 || o.States[StateOffline] != 15 || o.States[StateUnknown] != 10 || o.Conditions[CondBacklog] != 7 || o.Conditions[CondDrifted] != 3 || o.Conditions[CondRolloutFailed] != 1 {
		t.Fatalf("the hub's overview %+v is not the fleet the test made", o)
	}
	var worst, scenes Worst
	e.do(t, "GET", "/api/fleet/worst?by=gateway", "", &worst)
	e.do(t, "GET", "/api/fleet/worst?by=scene", "", &scenes)
	if len(worst.Entries) != 3 || worst.Entries[0].Name != ids[5] || worst.BelowMin != 1 {
		t.Fatalf("the hub's worst gateways %+v", worst)
	}

	page := openDashboard(t, ctx, bin, e.http.URL+"/?token="+testToken)
	page.waitFor(t, ctx, `document.querySelectorAll("#fl-states li.tile").length === 7 && document.querySelector("#fl-worst-scene table") !== null`)

	// The counts drawn are the API's; the bar's parts add up to them.
	raw, err := page.evaluate(ctx, `(() => {
	  const out = {};
	  for (const li of document.querySelectorAll("#fl-states li.tile")) out[li.dataset.state] = +li.querySelector("a").textContent.replace(/\D/g, "");
	  out.bar = [...document.querySelectorAll("#fl-states svg rect.seg")].reduce((n, r) => n + +r.dataset.count, 0);
	  return out;
	})()`)
	if err != nil {
		t.Fatal(err)
	}
	var drawn map[string]int
	if err := json.Unmarshal(raw, &drawn); err != nil {
		t.Fatal(err)
	}
	for k, n := range o.States {
		if drawn[k] != n {
			t.Errorf("%s: the page shows %d, the API counts %d", k, drawn[k], n)
		}
	}
	for k, n := range o.Conditions {
		if drawn[k] != n {
			t.Errorf("%s: the page shows %d, the API counts %d", k, drawn[k], n)
		}
	}
	if drawn["bar"] != o.Gateways {
		t.Errorf("the presence bar draws %d gateways, the API has %d", drawn["bar"], o.Gateways)
	}

	// The rankings, in the API's order, with their counts.
	for _, c := range []struct {
		by string
		w  Worst
	}{{"gateway", worst}, {"scene", scenes}} {
		var want []string
		for _, x := range c.w.Entries {
			want = append(want, fmt.Sprintf("%s %d %d", x.Name, x.Failures, x.Finished))
		}
		got := page.str(t, ctx, `[...document.querySelectorAll("#fl-worst-`+c.by+` tbody tr")].map((tr) => tr.dataset.name + " " + tr.cells[3].textContent.replace(/\D/g, "") + " " + tr.cells[4].textContent.replace(/\D/g, "")).join("|")`)
		if got != strings.Join(want, "|") {
			t.Errorf("worst %ss drawn %q, the API ranks %q", c.by, got, strings.Join(want, "|"))
		}
	}
	if got := page.str(t, ctx, `document.querySelector("#fl-worst-device .body").textContent`); got != "No device data yet." {
		t.Errorf("the device panel says %q", got)
	}
	if got := page.str(t, ctx, `document.querySelector("#fl-worst-gateway p.meta").textContent`); !strings.Contains(got, "at least 10 finished missions") || !strings.Contains(got, "1 more") {
		t.Errorf("the ranking's note says %q, want its minimum and the one below it", got)
	}

	// The worst gateway's link lists its failed missions.
	page.eval(t, ctx, `document.querySelector("#fl-worst-gateway tbody tr a").click()`)
	page.waitFor(t, ctx, `document.querySelector("#f-gateway").value === "`+ids[5]+`" && document.querySelectorAll("#missions tbody tr").length === 20`)
	if got := page.str(t, ctx, `[...new Set([...document.querySelectorAll("#missions tbody tr")].map((tr) => tr.dataset.gateway + " " + tr.dataset.state))].join("|")`); got != ids[5]+" FAILED" {
		t.Errorf("the link lists missions of %q, want only %s FAILED", got, ids[5])
	}
	link := url.Values{"gateway": {ids[5]}, "state": {"FAILED"}}
	if h := page.str(t, ctx, `location.hash`); h != "#/missions?"+link.Encode() {
		t.Errorf("the link's address is %q", h)
	}

	// A count's link lists the gateways of its state, from the hub.
	for _, c := range []struct {
		state string
		n     int
	}{{StateOffline, 15}, {CondDrifted, 3}, {CondRolloutFailed, 1}, {StateOnline, 50}} {
		page.eval(t, ctx, `document.querySelector('#fl-states li[data-state="`+c.state+`"] a').click()`)
		cond := `document.querySelector("#gw-state").value === "` + c.state + `" && document.querySelectorAll("#gateways .gw").length === ` + fmt.Sprint(c.n)
		switch c.state {
		case StateOffline, StateOnline:
			cond += ` && [...document.querySelectorAll("#gateways .gw")].every((g) => g.dataset.state === "` + c.state + `")`
		}
		page.waitFor(t, ctx, cond)
	}
	// Online is a page of 50 of the 105, and More reads the next.
	if got := page.str(t, ctx, `document.querySelector("#gw-count").textContent`); got != "50 of 105" {
		t.Errorf("online gateways: %q, want 50 of 105", got)
	}
	page.eval(t, ctx, `document.querySelector("#gw-more").click()`)
	page.waitFor(t, ctx, `document.querySelectorAll("#gateways .gw").length === 100 && !document.querySelector("#gw-more").hidden`)

	// The keyboard reaches every count and ranked row: each is a link.
	if got := page.str(t, ctx, `String([...document.querySelectorAll("#fl-states li.tile, #fl-worst tbody tr")].every((x) => x.querySelector("a[href]") !== null))`); got != "true" {
		t.Error("a count or a ranked row has no link to reach it by")
	}

	dir := artifactDir(t)
	if err := page.call(ctx, "Emulation.setDeviceMetricsOverride", map[string]any{"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": false}, nil); err != nil {
		t.Fatal(err)
	}
	// A short page for the picture: the one gateway its rollout failed.
	page.eval(t, ctx, `document.querySelector('#fl-states li[data-state="rollout_failed"] a').click()`)
	page.waitFor(t, ctx, `document.querySelectorAll("#gateways .gw").length === 1`)
	page.eval(t, ctx, `window.scrollTo(0, 0)`)
	page.screenshot(t, ctx, dir, "fleet")
	page.setDark(t, ctx)
	page.screenshot(t, ctx, dir, "fleet-dark")
	t.Logf("screenshots in %s", dir)
}
