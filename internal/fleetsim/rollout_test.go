package fleetsim_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/bundle"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/hub"
	"github.com/sortie-edge/sortie/internal/fleetsim"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/uplink"
)

// The measures (issue 27, "Measures and tests") run 1,000 light
// gateways against the hub binary; under the race detector, whose
// limit is 8,128 live goroutines, 300 (each gateway's MQTT client has
// about 11).
var measureGateways = flag.Int("fleet-measure-gateways", 0, "gateways of the rollout measures (default 1000, 300 under -race)")

func measureSize() int {
	if *measureGateways > 0 {
		return *measureGateways
	}
	if testkit.Race {
		return 300
	}
	return 1000
}

// Timings of the measures: short, so that seven stages of a thousand
// gateways take seconds, and real (the hub is another process).
const (
	measureHeartbeat = 2 * time.Second
	measureSoak      = time.Second // a local apply's trial, and the gateways' default
	measureConfirm   = 2 * time.Second
)

// measureRig is the hub binary and a fleet of light gateways on it.
type measureRig struct {
	t     testing.TB
	hub   *hubProc
	fleet *fleetsim.Fleet
	ids   []string
	files *bundle.Bundle
}

func startMeasure(t testing.TB, n int, faults fleetsim.Faults, tune func(*fleetsim.Options)) *measureRig {
	t.Helper()
	if testing.Short() {
		t.Skip("a thousand gateways and the hub binary: not in -short")
	}
	r := &measureRig{t: t, ids: fleetIDs(n)}
	r.hub = startHub(t, r.ids, hashIterations)
	o := fleetsim.Options{Broker: r.hub.broker, IDs: r.ids, Password: gatewayPassword, Seed: 27, Faults: faults,
		Heartbeat: measureHeartbeat, Soak: measureSoak, Confirm: measureConfirm, Connecting: 256}
	if tune != nil {
		tune(&o)
	}
	f, err := fleetsim.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	r.fleet = f
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := f.Start(ctx); err != nil {
		t.Fatal(err)
	}
	want := n - len(f.With(fleetsim.FaultOffline))
	r.hub.waitGateways("every gateway but the offline ones online", 5*time.Minute, func(gws []hubGateway) bool {
		on := 0
		for _, g := range gws {
			if g.State == "online" && g.Heartbeat != nil && g.Heartbeat.Config != nil {
				on++
			}
		}
		return on == want
	})
	// What the gateways run must be in the hub, or the pre-flight
	// refuses them: an abort could not put it back.
	r.files = r.pushed("")
	return r
}

// api calls the hub's API: body, when set, is sent as JSON (or as is
// when it is []byte), and the answer decoded into out.
func (r *measureRig) api(method, path string, body, out any) {
	r.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		enc, err := json.Marshal(b)
		if err != nil {
			r.t.Fatal(err)
		}
		rd = bytes.NewReader(enc)
	}
	req, err := http.NewRequest(method, r.hub.api+path, rd)
	if err != nil {
		r.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+r.hub.token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer func() { _ = res.Body.Close() }()
	data, _ := io.ReadAll(res.Body)
	if res.StatusCode/100 != 2 {
		r.t.Fatalf("%s %s: %s: %s", method, path, res.Status, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			r.t.Fatalf("%s %s: %v", method, path, err)
		}
	}
}

// push stores b on the hub (group "default") and returns its release.
func (r *measureRig) push(b *bundle.Bundle) hub.Release { return r.pushTo("", b) }

// pushTo stores b in group (the hub's default group for "").
func (r *measureRig) pushTo(group string, b *bundle.Bundle) hub.Release {
	r.t.Helper()
	enc, err := b.Encode()
	if err != nil {
		r.t.Fatal(err)
	}
	var out struct {
		Release hub.Release `json:"release"`
	}
	path := "/api/bundles"
	if group != "" {
		path += "?group=" + group
	}
	r.api(http.MethodPost, path, enc, &out)
	return out.Release
}

// pushed pushes the bundle the gateways' config files make (what they
// run at the start) and returns it; registry, when set, is the
// devices.toml of the gateways with FaultRegistry instead, another
// building's: it goes to a group of its own, so the hub can put them
// back but knows the default group's registry is not theirs.
func (r *measureRig) pushed(registry string) *bundle.Bundle {
	r.t.Helper()
	reg, want := fleetsim.Registry, r.fleet.Files()
	if registry != "" {
		reg, want = registry, r.fleet.With(fleetsim.FaultRegistry)[0].Config().Hash
	}
	b := must(r.t)(fleetsim.WithRegistry([]byte(reg), map[string]string{"arrive.toml": fleetsim.Scene}))
	if b.Hash() != want {
		r.t.Fatalf("the files bundle is %s, the gateways run %s", bundle.Short(b.Hash()), bundle.Short(want))
	}
	if registry != "" {
		r.pushTo("elsewhere", b)
	} else {
		r.push(b)
	}
	return b
}

// spec is a rollout of the group's latest release to every gateway:
// a 1% canary, then waves doubling.
func spec() hub.RolloutSpec {
	return hub.RolloutSpec{CanaryPercent: 1, Factor: 2, Soak: driver.Duration(500 * time.Millisecond),
		GatewaySoak: driver.Duration(time.Second), GatewayTimeout: driver.Duration(10 * time.Second),
		Resend: driver.Duration(2 * time.Second), Deadline: driver.Duration(5 * time.Minute)}
}

func (r *measureRig) start(s hub.RolloutSpec) hub.RolloutView {
	r.t.Helper()
	var v hub.RolloutView
	r.api(http.MethodPost, "/api/rollouts", s, &v)
	return v
}

func (r *measureRig) rollout(id string) hub.RolloutView {
	r.t.Helper()
	var v hub.RolloutView
	r.api(http.MethodGet, "/api/rollouts/"+id, nil, &v)
	return v
}

// waitRollout polls the rollout until cond holds over it.
func (r *measureRig) waitRollout(id, what string, d time.Duration, cond func(hub.RolloutView) bool) hub.RolloutView {
	r.t.Helper()
	deadline := time.Now().Add(d)
	for {
		v := r.rollout(id)
		if cond(v) {
			return v
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("rollout %s: not %s within %s: %s, stage %d of %v, %v (%s)", id, what, d, v.State, v.Stage, v.Stages, v.Counts, v.Reason)
		}
		time.Sleep(200 * time.Millisecond) // another process: its API is what there is to wait on
	}
}

func ended(v hub.RolloutView) bool {
	return v.State == hub.RolloutCompleted || v.State == hub.RolloutAborted || v.State == hub.RolloutSuperseded
}

// onlyOldOrNew checks that every gateway runs exactly old or new, none
// on trial.
func (r *measureRig) onlyOldOrNew(old, new string) map[string]int {
	r.t.Helper()
	n := map[string]int{}
	for _, g := range r.fleet.Gateways() {
		c := g.Config()
		switch {
		case c.Trial:
			r.t.Errorf("%s is still on trial of %s", g.ID(), bundle.Short(c.Hash))
		case c.Hash == old:
			n["old"]++
		case c.Hash == new:
			n["new"]++
		default:
			r.t.Errorf("%s runs %s, neither the old %s nor the new %s", g.ID(), bundle.Short(c.Hash), bundle.Short(old), bundle.Short(new))
		}
	}
	return n
}

// evening is the good bundle of the measures: a second scene.
func goodBundle(t testing.TB) *bundle.Bundle {
	return must(t)(fleetsim.With(map[string]string{"arrive.toml": fleetsim.Scene, "evening.toml": evening}))
}

// TestGoodBundleReachesEveryGatewayHealthyAndHandEditsShowAsDrift is
// the first and last measures: a good bundle, 1% canary then
// exponential waves, reaches every gateway healthy; then 1% of the
// gateways are edited by hand and exactly those show as drifted within
// two heartbeats.
func TestGoodBundleReachesEveryGatewayHealthyAndHandEditsShowAsDrift(t *testing.T) {
	r := startMeasure(t, measureSize(), fleetsim.Faults{}, nil)
	n := len(r.ids)
	good := goodBundle(t)
	r.push(good)
	cpu0, start := r.hub.cpu(), time.Now()
	v := r.start(spec())
	v = r.waitRollout(v.ID, "ended", 5*time.Minute, ended)
	took, cpu := time.Since(start), r.hub.cpu()-cpu0
	if v.State != hub.RolloutCompleted || v.Counts[hub.TargetHealthy] != n {
		t.Fatalf("rollout %s: %s (%s), %v; want every one of %d healthy", v.ID, v.State, v.Reason, v.Counts, n)
	}
	if got := r.onlyOldOrNew(r.files.Hash(), good.Hash()); got["new"] != n {
		t.Errorf("%v, want all %d on the new bundle", got, n)
	}
	t.Logf("%d gateways healthy in %s, stages %v; hub CPU %s in all, %.0f µs per gateway", n, took.Round(time.Millisecond), v.Stages, cpu, float64(cpu.Microseconds())/float64(n))

	// Hand edits: 1% of the gateways apply an edited bundle themselves
	// (what "agent apply" does), which the hub did not send.
	edited := must(t)(fleetsim.With(map[string]string{"arrive.toml": fleetsim.Scene + "# edited by hand\n", "evening.toml": evening}))
	var editedIDs []string
	for i, g := range r.fleet.Gateways() {
		if i%100 != 37 {
			continue
		}
		if out, err := g.ApplyLocal(edited); err != nil || out.Status != uplink.BundleApplied {
			t.Fatalf("%s: local apply %+v, %v", g.ID(), out, err)
		}
		editedIDs = append(editedIDs, g.ID())
	}
	beats := map[string]uint64{}
	deadline := time.Now().Add(time.Minute)
	for {
		var gws struct {
			Gateways []hub.FleetGateway `json:"gateways"`
		}
		r.api(http.MethodGet, "/api/fleet", nil, &gws)
		var drifted []string
		for _, g := range gws.Gateways {
			if g.Drifted {
				drifted = append(drifted, g.Gateway)
			}
		}
		slices.Sort(drifted)
		// Heartbeats sent since each edit was kept (its trial over).
		for _, id := range editedIDs {
			g := r.fleet.Gateway(id)
			if _, ok := beats[id]; !ok && !g.Config().Trial {
				beats[id] = g.Heartbeats()
			}
		}
		if slices.Equal(drifted, editedIDs) {
			for _, id := range editedIDs {
				if since := r.fleet.Gateway(id).Heartbeats() - beats[id]; since > 2 {
					t.Errorf("%s: drifted only after %d heartbeats since its edit took effect", id, since)
				}
			}
			t.Logf("drifted: exactly the %d gateways edited", len(drifted))
			return
		}
		if extra := without(drifted, editedIDs); len(extra) > 0 {
			t.Fatalf("gateways not edited show as drifted: %v", extra)
		}
		if time.Now().After(deadline) {
			t.Fatalf("drifted %v, want exactly %v", drifted, editedIDs)
		}
		time.Sleep(200 * time.Millisecond) // the hub's API is another process's
	}
}

// TestHandEditedFilesShowAsDriftForExactlyThoseGatewaysWithinTwoHeartbeats:
// the hand edits, of the config files (in force at the next
// start), on 1% of gateways that run their files: the hub shows exactly
// those as drifted (drift: files) within two of their heartbeats.
func TestHandEditedFilesShowAsDriftForExactlyThoseGatewaysWithinTwoHeartbeats(t *testing.T) {
	r := startMeasure(t, measureSize(), fleetsim.Faults{}, nil)
	var editedIDs []string
	beats := map[string]uint64{}
	for i, g := range r.fleet.Gateways() {
		if i%100 == 61 {
			beats[g.ID()] = g.Heartbeats()
			g.Edit()
			editedIDs = append(editedIDs, g.ID())
		}
	}
	deadline := time.Now().Add(time.Minute)
	for {
		var gws struct {
			Gateways []hub.FleetGateway `json:"gateways"`
		}
		r.api(http.MethodGet, "/api/fleet", nil, &gws)
		var drifted []string
		for _, g := range gws.Gateways {
			if g.Drifted {
				drifted = append(drifted, g.Gateway)
				if g.Drift != hub.DriftFiles {
					t.Errorf("%s drifted as %q, want files", g.Gateway, g.Drift)
				}
			}
		}
		slices.Sort(drifted)
		if extra := without(drifted, editedIDs); len(extra) > 0 {
			t.Fatalf("gateways not edited show as drifted: %v", extra)
		}
		if slices.Equal(drifted, editedIDs) {
			worst := uint64(0)
			for _, id := range editedIDs {
				since := r.fleet.Gateway(id).Heartbeats() - beats[id]
				worst = max(worst, since)
				if since > 2 {
					t.Errorf("%s: drifted only after %d heartbeats since the edit", id, since)
				}
			}
			t.Logf("drifted (files): exactly the %d gateways edited, after at most %d heartbeats each", len(drifted), worst)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("drifted %v, want exactly %v", drifted, editedIDs)
		}
		time.Sleep(200 * time.Millisecond) // the hub's API is another process's
	}
}

// without is a less b.
func without(a, b []string) []string {
	var out []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

// TestBundleThirtyPercentWouldRejectIsHeldBeforeAnyGatewayGetsIt: the
// registries of 30% of the gateways differ (another building's, released
// to another group), so the bundle would replace theirs. The hub's
// pre-flight check sees
// it from their heartbeats and holds the rollout at the first stage
// that has one, before offering that stage anything: no gateway runs a
// half-applied configuration, and an abort leaves every one on its own.
func TestBundleThirtyPercentWouldRejectIsHeldBeforeAnyGatewayGetsIt(t *testing.T) {
	r := startMeasure(t, measureSize(), fleetsim.Faults{Registry: 0.3}, nil)
	other := r.pushed(fleetsim.Registry + "\n# this gateway's own registry\n")
	good := goodBundle(t)
	r.push(good)
	v := r.start(spec())
	v = r.waitRollout(v.ID, "held", 2*time.Minute, func(v hub.RolloutView) bool { return v.State != hub.RolloutRunning })
	refused := v.Counts["refused"]
	if v.State != hub.RolloutPaused || refused == 0 {
		t.Fatalf("rollout %s: %s (%s), %v; want paused by the pre-flight", v.ID, v.State, v.Reason, v.Counts)
	}
	held := v.Stage
	for _, g := range v.Gateways {
		if g.Stage == held && g.Status != hub.TargetPending {
			t.Errorf("%s of the held stage %d is %s: offered before the pre-flight", g.Gateway, held, g.Status)
		}
		if g.Refused != "" && !strings.HasPrefix(g.Refused, "registry_changed") {
			t.Errorf("%s refused: %s", g.Gateway, g.Refused)
		}
	}
	r.api(http.MethodPost, "/api/rollouts/"+v.ID+"/abort", nil, nil)
	v = r.waitRollout(v.ID, "ended", 2*time.Minute, ended)
	if v.State != hub.RolloutAborted {
		t.Fatalf("rollout %s after the abort: %s", v.ID, v.State)
	}
	got := map[string]int{}
	for _, g := range r.fleet.Gateways() {
		c := g.Config()
		switch {
		case c.Trial:
			t.Errorf("%s on trial", g.ID())
		case c.Hash == r.files.Hash() && g.Fault()&fleetsim.FaultRegistry == 0, c.Hash == other.Hash() && g.Fault()&fleetsim.FaultRegistry != 0:
			got["own"]++
		default:
			t.Errorf("%s runs %s", g.ID(), bundle.Short(c.Hash))
		}
	}
	t.Logf("held at stage %d of %v (canary %d), %d refused there; after the abort %d gateways on their own configuration, %d statuses sent",
		held, v.Stages, v.Stages[0], refused, got["own"], r.fleet.Stats().Statuses)
}

// TestBundleBreakingHealthOnThirtyPercentAbortsWithinTheCanaryAndRollsItBack:
// the bundle validates everywhere, but on 30% of the gateways its
// devices never answer: those revert by themselves at the end of their
// soak, the rollout aborts within the canary, the canaries that kept it
// are rolled back by the hub, and no gateway past the canary hears of
// it. Every gateway ends exactly on the old bundle.
func TestBundleBreakingHealthOnThirtyPercentAbortsWithinTheCanaryAndRollsItBack(t *testing.T) {
	r := startMeasure(t, measureSize(), fleetsim.Faults{DevicesSilent: 0.3}, nil)
	good := goodBundle(t)
	r.push(good)
	s := spec()
	// 1%, and at least 10: a canary of 3 (300 gateways under -race)
	// could hold no silent gateway. Which ones it holds is fixed by the
	// fleet's seed and the rollout's ID.
	s.Canary, s.CanaryPercent = max(10, len(r.ids)/100), 0
	v := r.start(s)
	v = r.waitRollout(v.ID, "ended", 3*time.Minute, ended)
	if v.State != hub.RolloutAborted {
		t.Fatalf("rollout %s: %s at stage %d (%s), %v; want aborted in the canary", v.ID, v.State, v.Stage, v.Reason, v.Counts)
	}
	canary, outcomes := 0, map[string]int{}
	for _, g := range v.Gateways {
		gw := r.fleet.Gateway(g.Gateway)
		last, offered := gw.Last()
		if g.Stage > 0 {
			if offered {
				t.Errorf("%s, past the canary, heard of version %d (%s)", g.Gateway, last.Version, last.Status)
			}
			continue
		}
		canary++
		if g.Status != hub.TargetNotified && g.Status != hub.TargetPending {
			outcomes[g.Status+" "+g.Reason+" "+g.Back]++
		}
		// A silent gateway whose trial the abort's rollback reached before
		// its soak ended is put back by that rollback (superseded): the
		// hub's abort raced its own finding, and either is right.
		overtaken := g.Status == hub.TargetFailed && g.Reason == uplink.ReasonSuperseded && g.Back == hub.BackRolledBack
		switch silent := gw.Fault()&fleetsim.FaultDevicesSilent != 0; {
		case silent && !overtaken && (g.Status != hub.TargetFailed || g.Reason != uplink.ReasonDevicesSilent):
			t.Errorf("%s (silent devices): %s %s, want failed devices_silent (or superseded by the rollback)", g.Gateway, g.Status, g.Reason)
		case !silent && g.Back != hub.BackRolledBack:
			// It took the bundle (kept it, or was on trial when the abort
			// came): the hub puts it back.
			t.Errorf("%s took the bundle (%s %s), and its rollback is %q", g.Gateway, g.Status, g.Reason, g.Back)
		}
	}
	if got := r.onlyOldOrNew(r.files.Hash(), good.Hash()); got["old"] != len(r.ids) {
		t.Errorf("%v, want all %d back on the old bundle", got, len(r.ids))
	}
	t.Logf("aborted in the canary of %d (%s): target outcome, reason, rollback: %v", canary, v.Reason, outcomes)
}

// TestGatewaysRevertByThemselvesWithinTheHealthWindow: a bundle whose
// new scene uses a device that never answers, and one that the uplink
// of a third of its gateways is cut under: every affected gateway
// reverts by itself (devices_silent at the end of its soak,
// uplink_down at the end of the confirm window), before the hub could
// say anything: the hub sent each one offer.
func TestGatewaysRevertByThemselvesWithinTheHealthWindow(t *testing.T) {
	r := startMeasure(t, measureSize(), fleetsim.Faults{}, func(o *fleetsim.Options) { o.SilentDevices = []string{"porch-light"} })
	broken := must(t)(fleetsim.With(map[string]string{"arrive.toml": fleetsim.Scene, "porch.toml": porch}))
	r.push(broken)
	targets := r.ids[:30]
	s := spec()
	s.Gateways, s.Canary, s.CanaryPercent, s.AbortMin, s.AbortPercent = targets, len(targets), 0, len(targets), 100
	v := r.start(s)
	v = r.waitRollout(v.ID, "ended", 2*time.Minute, ended)
	for _, id := range targets {
		last, _ := r.fleet.Gateway(id).Last()
		if last.Status != uplink.BundleReverted || last.Reason != uplink.ReasonDevicesSilent || last.Version != v.Version {
			t.Errorf("%s: %s %s of version %d, want reverted devices_silent of %d", id, last.Status, last.Reason, last.Version, v.Version)
		}
	}

	// The uplink cut under a good bundle, on a third of the targets.
	cut := r.ids[30:60]
	for _, id := range cut[:10] {
		g := r.fleet.Gateway(id)
		g.SetFault(g.Fault() | fleetsim.FaultUplinkCut)
	}
	good := goodBundle(t)
	r.push(good)
	s = spec()
	s.Gateways, s.Canary, s.CanaryPercent, s.AbortMin, s.AbortPercent = cut, len(cut), 0, len(cut), 100
	start := time.Now()
	v = r.start(s)
	v = r.waitRollout(v.ID, "ended", 2*time.Minute, ended)
	for i, id := range cut {
		last, _ := r.fleet.Gateway(id).Last()
		want, reason := uplink.BundleHealthy, ""
		if i < 10 {
			want, reason = uplink.BundleReverted, uplink.ReasonUplinkDown
		}
		if last.Status != want || last.Reason != reason || last.Version != v.Version {
			t.Errorf("%s: %s %s of version %d, want %s %s of %d", id, last.Status, last.Reason, last.Version, want, reason, v.Version)
		}
	}
	if got := r.fleet.Stats(); got.Controls-got.Repeats != uint64(len(targets)+len(cut)) {
		t.Errorf("%d controls answered (%d of them repeats), want one offer per target (%d): the reverts were the gateways' own", got.Controls, got.Repeats, len(targets)+len(cut))
	}
	t.Logf("uplink cut: reverted by themselves and reported on return; rollout %s in %s: %v", v.State, time.Since(start).Round(time.Millisecond), v.Counts)
}

// TestOfflineGatewaysEndUnreachableByTheDeadlineThenGetTheBundleWhenBack:
// 5% of the gateways are offline for the whole rollout, which ends by
// its deadline with exactly those unreachable; a continuous rollout
// brings them the bundle when they come back.
func TestOfflineGatewaysEndUnreachableByTheDeadlineThenGetTheBundleWhenBack(t *testing.T) {
	r := startMeasure(t, measureSize(), fleetsim.Faults{Offline: 0.05}, nil)
	good := goodBundle(t)
	r.push(good)
	s := spec()
	// Three stages (1%, 11%, all), each waiting out its offline
	// gateways: the deadline comes well after the last.
	s.Continuous, s.Factor, s.GatewayTimeout, s.Deadline = true, 10, driver.Duration(3*time.Second), driver.Duration(60*time.Second)
	start := time.Now()
	v := r.start(s)
	v = r.waitRollout(v.ID, "ended", 3*time.Minute, ended)
	took := time.Since(start)
	var unreachable []string
	for _, g := range v.Gateways {
		if g.Status == hub.TargetUnreachable {
			unreachable = append(unreachable, g.Gateway)
		}
	}
	var offline []string
	for _, g := range r.fleet.With(fleetsim.FaultOffline) {
		offline = append(offline, g.ID())
	}
	slices.Sort(unreachable)
	if v.State != hub.RolloutCompleted || !slices.Equal(unreachable, offline) || v.Counts[hub.TargetHealthy] != len(r.ids)-len(offline) {
		t.Fatalf("rollout %s: %s (%s) after %s, %v; unreachable %v, want exactly the offline %v", v.ID, v.State, v.Reason, took, v.Counts, unreachable, offline)
	}
	if took > s.Deadline.D()+30*time.Second {
		t.Errorf("ended %s after its start, deadline %s", took, s.Deadline.D())
	}
	t.Logf("ended %s after its start (deadline %s) with exactly the %d offline unreachable", took.Round(time.Second), s.Deadline.D(), len(offline))

	for _, g := range r.fleet.With(fleetsim.FaultOffline) {
		g.SetOnline(true)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		behind := 0
		for _, id := range offline {
			if c := r.fleet.Gateway(id).Config(); c.Hash != good.Hash() || c.Trial {
				behind++
			}
		}
		if behind == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of the %d gateways back do not run the new bundle", behind, len(offline))
		}
		time.Sleep(200 * time.Millisecond) // the hub is another process
	}
	if got := r.onlyOldOrNew(r.files.Hash(), good.Hash()); got["new"] != len(r.ids) {
		t.Errorf("%v, want all %d on the new bundle", got, len(r.ids))
	}
}
