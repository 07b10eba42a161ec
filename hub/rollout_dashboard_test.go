package hub

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/uplink"
)

// rigBackend is a hub whose rollout engine is a fleetRig's: its offers
// are caught at the Send seam and answered by the test.
type rigBackend struct {
	Backend
	f *Fleet
}

func (b rigBackend) Fleet() *Fleet { return b.f }

// TestDashboardShowsARolloutAndAbortsIt: a rollout of 250 gateways
// whose canary of 4 has 3 healthy and 1 failed (rejected as invalid)
// is listed, and its page draws each stage's gateways by status with
// the API's counts, lists the failed one with its reason, caps the
// table at 200 rows, and its Abort button (after a confirm) aborts it;
// the rollback of one healthy canary then shows as rolled back, and
// only the failure is red. Screenshots, light and dark, go to
// $SORTIE_ARTIFACTS.
func TestDashboardShowsARolloutAndAbortsIt(t *testing.T) {
	bin := needChromium(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	r := newFleetRig(t)
	r.clock.add(time.Now().Add(-10 * time.Minute).Sub(r.clock.Now()))
	base := r.push(testBundle(t, "", ""))
	r.push(testBundle(t, "v2", ""))
	r.online(base.Hash, gatewayIDs(250)...)
	v, canary := canaryOf4(r, "")
	if v.State != RolloutRunning || v.Counts[TargetHealthy] != 3 || v.Counts[TargetFailed] != 1 || v.Counts[TargetPending] != 246 {
		t.Fatalf("rollout %s %v, want running with 3 healthy, 1 failed, 246 pending", v.State, v.Counts)
	}

	e := newEnv(t)
	api := NewAPIOn(rigBackend{e.svc, r.f}, e.st, APIOptions{Token: testToken})
	srv := httptest.NewServer(api)
	t.Cleanup(func() { api.Close(); srv.Close() })
	page := openDashboard(t, ctx, bin, srv.URL+"/?token="+testToken+rolloutHashOf(v.ID))

	// The list, then the page.
	page.waitFor(t, ctx, `document.querySelector('#rollouts tr[data-rollout="`+v.ID+`"][data-state="running"]') !== null`)
	page.waitFor(t, ctx, `!document.querySelector("#rollout-panel").hidden && document.querySelectorAll("#r-stages g.bar").length === `+strconv.Itoa(len(v.Stages)))

	// drawn is what the stage bars show: gateways by kind, and by stage.
	type drawnStages struct {
		Kinds  map[string]int `json:"kinds"`
		Stages []int          `json:"stages"`
		Red    []string       `json:"red"`
	}
	drawn := func() drawnStages {
		t.Helper()
		raw, err := page.evaluate(ctx, `(() => {
		  const kinds = {}, fills = {};
		  for (const s of document.querySelectorAll("#r-stages rect.seg")) {
		    kinds[s.dataset.kind] = (kinds[s.dataset.kind] || 0) + +s.dataset.count;
		    (fills[getComputedStyle(s).fill] ||= new Set()).add(s.dataset.kind);
		  }
		  const n = parseInt(getComputedStyle(document.documentElement).getPropertyValue("--bad").trim().slice(1), 16);
		  const bad = "rgb(" + (n >> 16) + ", " + ((n >> 8) & 255) + ", " + (n & 255) + ")";
		  return { kinds, stages: [...document.querySelectorAll("#r-stages g.bar")].map((g) => +g.dataset.total), red: [...(fills[bad] || [])] };
		})()`)
		if err != nil {
			t.Fatal(err)
		}
		var d drawnStages
		if err := json.Unmarshal(raw, &d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	perStage := func(v RolloutView) []int {
		out := make([]int, len(v.Stages))
		for _, g := range v.Gateways {
			out[g.Stage]++
		}
		return out
	}
	d := drawn()
	if d.Kinds["healthy"] != v.Counts[TargetHealthy] || d.Kinds["failed"] != v.Counts[TargetFailed] || d.Kinds["pending"] != v.Counts[TargetPending] || len(d.Kinds) != 3 {
		t.Errorf("bars draw %v, the API counts %v", d.Kinds, v.Counts)
	}
	if want := perStage(v); !slices.Equal(d.Stages, want) {
		t.Errorf("bars draw stages of %v gateways, the API has %v", d.Stages, want)
	}
	if strings.Join(d.Red, ",") != "failed" {
		t.Errorf("red segments are %v, want only the failed", d.Red)
	}
	// The over-time strip has the 3 healthy and the failed one.
	page.waitFor(t, ctx, `document.querySelector('#r-time path[data-kind="healthy"]').dataset.count === "3" && document.querySelector('#r-time path[data-kind="failed"]').dataset.count === "1"`)

	// The table is capped; filtered by status it lists the failed one
	// with its reason.
	page.waitFor(t, ctx, `document.querySelectorAll("#r-gateways tbody tr").length === 200 && document.querySelector("#r-shown").textContent.includes("200 of 250")`)
	page.eval(t, ctx, `(() => { const s = document.querySelector("#r-kind"); s.value = "failed"; s.dispatchEvent(new Event("input")); })()`)
	page.waitFor(t, ctx, `document.querySelectorAll("#r-gateways tbody tr").length === 1`)
	row := page.str(t, ctx, `document.querySelector("#r-gateways tbody tr").dataset.gateway + " | " + document.querySelector("#r-gateways tbody tr").textContent`)
	if !strings.HasPrefix(row, canary[3].gw+" | ") || !strings.Contains(row, uplink.ReasonInvalid) {
		t.Errorf("the failed row reads %q, want %s with its reason %q", row, canary[3].gw, uplink.ReasonInvalid)
	}

	// Abort, after a confirm.
	page.eval(t, ctx, `window.confirm = (m) => { window.asked = m; return true; }; document.querySelector('#r-controls button[data-op="abort"]').click()`)
	page.waitFor(t, ctx, `document.querySelector("#r-result").textContent.includes("abort ok") && document.querySelector('#r-controls button[data-op="abort"]').disabled`)
	if asked := page.str(t, ctx, `window.asked`); !strings.Contains(asked, "rolled back") {
		t.Errorf("the confirm asked %q", asked)
	}
	if v = r.view(v.ID); v.State != RolloutAborting {
		t.Fatalf("after the Abort button the rollout is %s (%s), want aborting", v.State, v.Reason)
	}
	r.step()
	back := r.take()
	if len(back) != 3 {
		t.Fatalf("%d rollback offers, want the 3 healthy canaries'", len(back))
	}
	r.clock.add(time.Minute)
	r.answer(back[0], uplink.BundleReceived, uplink.BundleApplied, uplink.BundleHealthy)
	r.step()
	v = r.view(v.ID)
	if v.Counts["rollback_"+BackRolledBack] != 1 {
		t.Fatalf("counts %v, want one rolled back", v.Counts)
	}
	// The page polls: the rollback shows.
	page.eval(t, ctx, `(() => { const s = document.querySelector("#r-kind"); s.value = ""; s.dispatchEvent(new Event("input")); })()`)
	page.waitFor(t, ctx, `[...document.querySelectorAll('#r-stages rect.seg[data-kind="rolled_back"]')].reduce((n, s) => n + +s.dataset.count, 0) === 1`)
	d = drawn()
	if d.Kinds["rolled_back"] != 1 || d.Kinds["rolling_back"] != 2 || d.Kinds["failed"] != 1 || d.Kinds["not_sent"] != v.Counts[TargetNotSent] {
		t.Errorf("after the abort the bars draw %v, the API counts %v", d.Kinds, v.Counts)
	}
	if strings.Join(d.Red, ",") != "failed" {
		t.Errorf("red segments are %v after the abort, want only the failed", d.Red)
	}
	page.waitFor(t, ctx, `document.querySelector('#r-time path[data-kind="rolled_back"]').dataset.count === "1"`)

	// 10,000 gateways (the page's view, its counts 40 times): the hub
	// sends a page of 200 and the counts, which the page draws whole;
	// the time to draw is logged.
	big := page.str(t, ctx, `(() => {
	  const v = structuredClone(state.rollout.view);
	  const times = (c) => Object.fromEntries(Object.entries(c).map(([k, n]) => [k, n * 40]));
	  v.stage_kinds = v.stage_kinds.map(times);
	  v.kinds = times(v.kinds);
	  v.targets = v.matched = 10000;
	  const t0 = performance.now();
	  renderRollout(v);
	  const ms = performance.now() - t0;
	  return [...document.querySelectorAll("#r-stages g.bar")].reduce((n, g) => n + +g.dataset.total, 0) + " " + document.querySelectorAll("#r-gateways tbody tr").length + " " + ms.toFixed(1);
	})()`)
	var total, rows int
	var ms float64
	if _, err := fmt.Sscan(big, &total, &rows, &ms); err != nil || total != 10000 || rows != 200 {
		t.Errorf("10,000 gateways: %q (gateways drawn, rows, ms), want 10000 200", big)
	}
	t.Logf("a 10,000-gateway rollout drew in %.1f ms", ms)
	page.eval(t, ctx, `refreshRollout()`)

	dir := artifactDir(t)
	// A shorter table, at a desktop's width, and the first wave's
	// tooltip, reached from the keyboard (focus events need a focused
	// page, which a headless one is not unless told).
	if err := page.call(ctx, "Emulation.setFocusEmulationEnabled", map[string]any{"enabled": true}, nil); err != nil {
		t.Fatal(err)
	}
	if err := page.call(ctx, "Emulation.setDeviceMetricsOverride", map[string]any{"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": false}, nil); err != nil {
		t.Fatal(err)
	}
	page.eval(t, ctx, `(() => { const s = document.querySelector("#r-kind"); s.value = "rolling_back"; s.dispatchEvent(new Event("input")); })()`)
	page.waitFor(t, ctx, `document.querySelectorAll("#r-gateways tbody tr").length === 2`)
	page.eval(t, ctx, `document.querySelector("#rollout-panel").scrollIntoView(); document.querySelector('#r-stages g.bar[tabindex="0"]').focus()`)
	page.eval(t, ctx, `document.activeElement.dispatchEvent(new KeyboardEvent("keydown", {key: "ArrowDown", bubbles: true}))`)
	page.waitFor(t, ctx, `!document.querySelector("#r-tip").hidden && document.querySelector("#r-tip").textContent.includes("wave 1: 8 gateways")`)
	page.screenshot(t, ctx, dir, "rollout-aborted")
	page.setDark(t, ctx)
	page.screenshot(t, ctx, dir, "rollout-aborted-dark")
	t.Logf("screenshots in %s", dir)
}

func rolloutHashOf(id string) string { return "#/rollouts/" + id }
