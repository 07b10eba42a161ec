package hub

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sortie-edge/sortie/bundle"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/uplink"
)

// testClock is the engine's clock, moved by the test.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// testBundle is the shipped configuration with go_home's description
// set to desc ("" leaves it as shipped), and min_agent.
func testBundle(tb testing.TB, desc, minAgent string) *bundle.Bundle {
	tb.Helper()
	b, err := bundle.FromDir(filepath.Join("..", "configs"), minAgent)
	if err != nil {
		tb.Fatal(err)
	}
	if desc == "" {
		return b
	}
	files := make([]bundle.File, len(b.Files))
	for i, f := range b.Files {
		files[i] = f
		if f.Path == "scenes/go_home.toml" {
			files[i].Data = []byte(strings.Replace(string(f.Data), "description = ", fmt.Sprintf("description = %q\n#", desc), 1))
		}
	}
	nb, err := bundle.New(minAgent, files)
	if err != nil {
		tb.Fatal(err)
	}
	return nb
}

// fleetRig is an engine over a real bbolt file (or, under
// TestPGFleetStoreKeepsTheSameRollouts, the cluster mode's PostgreSQL),
// its offers caught at the Send seam, its clock the test's.
type fleetRig struct {
	t    *testing.T
	path string
	st   interface {
		FleetStore
		Close() error
	}
	f     *Fleet
	clock *testClock
	mu    sync.Mutex
	sent  []outgoing
	// failWrites makes the engine's writes fail, as a full disk or a
	// lost database would.
	failWrites atomic.Bool
	// opts are the engine's options but for its clock and Send.
	opts FleetOptions
}

// failingStore is the rig's store, its writes failing when asked.
type failingStore struct {
	FleetStore
	fail *atomic.Bool
}

func (s failingStore) SaveFleet(ctx context.Context, c FleetState) error {
	if s.fail.Load() {
		return errors.New("disk full")
	}
	return s.FleetStore.SaveFleet(ctx, c)
}

// openFleetPG, when set, opens the rigs' store in PostgreSQL instead,
// emptied for each rig (fresh: true) or as it is (a restart).
var openFleetPG func(tb testing.TB, fresh bool) *PGStore

func newFleetRig(t *testing.T) *fleetRig {
	t.Helper()
	r := &fleetRig{t: t, path: filepath.Join(t.TempDir(), "hub.db"), clock: &testClock{now: time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)}}
	r.open(true)
	return r
}

func (r *fleetRig) open(fresh bool) {
	r.t.Helper()
	if openFleetPG != nil {
		r.st = openFleetPG(r.t, fresh)
	} else {
		st, err := Open(r.path, Options{NoSync: true})
		if err != nil {
			r.t.Fatal(err)
		}
		r.st = st
	}
	st := r.st
	r.t.Cleanup(func() { _ = st.Close() })
	o := r.opts
	o.Now = r.clock.Now
	o.Send = func(gw string, c uplink.Control) error {
		r.mu.Lock()
		r.sent = append(r.sent, outgoing{gw: gw, c: c})
		r.mu.Unlock()
		return nil
	}
	r.f = NewFleet(failingStore{st, &r.failWrites}, o)
	if err := r.f.Load(context.Background()); err != nil {
		r.t.Fatal(err)
	}
}

// restart is a hub restart: the engine is made again from the store.
func (r *fleetRig) restart() {
	r.t.Helper()
	if err := r.st.Close(); err != nil {
		r.t.Fatal(err)
	}
	r.open(false)
}

func (r *fleetRig) step() {
	r.t.Helper()
	if err := r.f.Step(context.Background()); err != nil {
		r.t.Fatal(err)
	}
}

// take returns the offers sent since the last take.
func (r *fleetRig) take() []outgoing {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.sent
	r.sent = nil
	return out
}

func (r *fleetRig) push(b *bundle.Bundle) Release {
	r.t.Helper()
	enc, err := b.Encode()
	if err != nil {
		r.t.Fatal(err)
	}
	rel, _, err := r.f.PushBundle(context.Background(), "", enc)
	if err != nil {
		r.t.Fatal(err)
	}
	return rel
}

// online reports gateways online, running hash, agent version v1.0.0.
func (r *fleetRig) online(hash string, gws ...string) {
	for _, gw := range gws {
		r.f.NoteGateway(Gateway{ID: gw, State: StateOnline, Heartbeat: &uplink.Heartbeat{Gateway: gw, Version: "v1.0.0", Time: r.clock.Now(),
			Config: &uplink.ConfigState{Hash: hash, Source: uplink.SourceFiles}}})
	}
	r.step()
}

// answer has the gateway of an offer report statuses on it.
func (r *fleetRig) answer(o outgoing, statuses ...string) {
	b := o.c.Bundle
	for _, s := range statuses {
		st := uplink.BundleStatus{Gateway: o.gw, Hash: b.Hash, Version: b.Version, Rollout: b.Rollout, Status: s, At: r.clock.Now(), Current: b.Hash}
		if s == uplink.BundleRejected || s == uplink.BundleReverted {
			st.Reason = uplink.ReasonInvalid
		}
		r.f.NoteStatus(o.gw, st)
	}
	r.f.NoteResult(o.gw, uplink.ControlResult{ID: o.c.ID, OK: statuses[len(statuses)-1] != uplink.BundleRejected})
}

func (r *fleetRig) view(id string) RolloutView {
	r.t.Helper()
	v, err := r.f.Rollout(id)
	if err != nil {
		r.t.Fatal(err)
	}
	return v
}

// startOne pushes the shipped configuration and an edit of it, starts
// a rollout of the edit to gw-1 (running the first) and returns its
// offer.
func (r *fleetRig) startOne() (base, next Release, v RolloutView, o outgoing) {
	r.t.Helper()
	base = r.push(testBundle(r.t, "", ""))
	next = r.push(testBundle(r.t, "v2", ""))
	r.online(base.Hash, "gw-1")
	v, err := r.f.StartRollout(context.Background(), RolloutSpec{})
	if err != nil {
		r.t.Fatal(err)
	}
	r.step()
	return base, next, v, r.take()[0]
}

func gatewayIDs(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("gw-%02d", i)
	}
	return out
}

func TestRolloutReachesEveryGatewayInStagesWithOneOfferEach(t *testing.T) {
	r := newFleetRig(t)
	base := r.push(testBundle(t, "", ""))
	next := r.push(testBundle(t, "v2", ""))
	if next.Version <= base.Version {
		t.Fatalf("versions %d then %d: want increasing", base.Version, next.Version)
	}
	gws := gatewayIDs(7)
	r.online(base.Hash, gws...)
	v, err := r.f.StartRollout(context.Background(), RolloutSpec{Soak: driver.Duration(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{1, 3, 7}; fmt.Sprint(v.Stages) != fmt.Sprint(want) {
		t.Fatalf("stages %v, want %v (canary 1, then doubling)", v.Stages, want)
	}
	offers := map[string]int{}
	for stage, size := range []int{1, 2, 4} {
		r.step()
		sent := r.take()
		if len(sent) != size {
			t.Fatalf("stage %d: %d offers, want %d", stage, len(sent), size)
		}
		for _, o := range sent {
			offers[o.gw]++
			if o.c.Bundle.Version != next.Version || o.c.Bundle.Hash != next.Hash {
				t.Fatalf("offer %+v, want version %d of %s", o.c.Bundle, next.Version, next.Hash)
			}
			r.answer(o, uplink.BundleReceived, uplink.BundleApplied, uplink.BundleHealthy)
		}
		r.step()
		r.clock.add(59 * time.Second)
		r.step()
		if got := r.take(); len(got) != 0 {
			t.Fatalf("stage %d: %d offers during the soak", stage, len(got))
		}
		r.clock.add(time.Second)
	}
	r.step()
	v = r.view(v.ID)
	if v.State != RolloutCompleted || v.Counts[TargetHealthy] != 7 {
		t.Fatalf("rollout %s %v, want completed with 7 healthy", v.State, v.Counts)
	}
	for _, gw := range gws {
		if offers[gw] != 1 {
			t.Fatalf("%s offered %d times, want once", gw, offers[gw])
		}
	}
}

func TestCanaryFailureAbortsAndRollsBackTheCanariesThatTookIt(t *testing.T) {
	r := newFleetRig(t)
	base := r.push(testBundle(t, "", ""))
	next := r.push(testBundle(t, "v2", ""))
	r.online(base.Hash, gatewayIDs(10)...)
	v, err := r.f.StartRollout(context.Background(), RolloutSpec{Canary: 2, AbortPercent: 50, AbortMin: 1})
	if err != nil {
		t.Fatal(err)
	}
	r.step()
	canary := r.take()
	if len(canary) != 2 {
		t.Fatalf("%d canary offers, want 2", len(canary))
	}
	r.answer(canary[0], uplink.BundleReceived, uplink.BundleApplied, uplink.BundleHealthy)
	r.answer(canary[1], uplink.BundleReceived, uplink.BundleRejected)
	r.step()
	v = r.view(v.ID)
	if v.State != RolloutAborting {
		t.Fatalf("state %s (%s), want aborting", v.State, v.Reason)
	}
	if v.Counts[TargetNotSent] != 8 {
		t.Fatalf("counts %v: want the 8 gateways after the canary not sent", v.Counts)
	}
	back := r.take()
	if len(back) != 1 || back[0].gw != canary[0].gw {
		t.Fatalf("rollback offers %v, want one to %s", back, canary[0].gw)
	}
	if b := back[0].c.Bundle; b.Hash != base.Hash || b.Version <= next.Version {
		t.Fatalf("rollback offers %s version %d, want the old bundle %s as a version after %d", bundle.Short(b.Hash), b.Version, bundle.Short(base.Hash), next.Version)
	}
	r.answer(back[0], uplink.BundleReceived, uplink.BundleApplied, uplink.BundleHealthy)
	r.step()
	r.clock.add(time.Minute)
	r.step()
	v = r.view(v.ID)
	if v.State != RolloutAborted || v.Counts["rollback_"+BackRolledBack] != 1 {
		t.Fatalf("state %s counts %v, want aborted with one rolled back", v.State, v.Counts)
	}
	fg := r.f.Gateways()
	for _, g := range fg {
		if g.Gateway == canary[0].gw && g.Expected != base.Hash {
			t.Fatalf("%s expected %s after the rollback, want the old bundle", g.Gateway, bundle.Short(g.Expected))
		}
	}
}

func TestOfflineGatewayEndsUnreachableAtTheDeadline(t *testing.T) {
	r := newFleetRig(t)
	base := r.push(testBundle(t, "", ""))
	r.push(testBundle(t, "v2", ""))
	r.online(base.Hash, "gw-a", "gw-b")
	r.f.NoteGateway(Gateway{ID: "gw-c", State: StateOffline})
	r.step()
	v, err := r.f.StartRollout(context.Background(), RolloutSpec{Canary: 3, Deadline: driver.Duration(time.Hour), GatewayTimeout: driver.Duration(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	r.step()
	for _, o := range r.take() {
		r.answer(o, uplink.BundleReceived, uplink.BundleApplied, uplink.BundleHealthy)
	}
	r.step()
	r.clock.add(30 * time.Minute)
	r.step()
	if v = r.view(v.ID); v.State != RolloutRunning {
		t.Fatalf("state %s before the deadline, want running (gw-c may come back)", v.State)
	}
	r.clock.add(30 * time.Minute)
	r.step()
	v = r.view(v.ID)
	if v.State != RolloutCompleted || v.Counts[TargetUnreachable] != 1 || v.Counts[TargetHealthy] != 2 {
		t.Fatalf("state %s counts %v, want completed: 2 healthy, 1 unreachable", v.State, v.Counts)
	}
}

func TestHubRestartResumesWithoutNotifyingAGatewayTwice(t *testing.T) {
	r := newFleetRig(t)
	base := r.push(testBundle(t, "", ""))
	r.push(testBundle(t, "v2", ""))
	gws := gatewayIDs(6)
	r.online(base.Hash, gws...)
	v, err := r.f.StartRollout(context.Background(), RolloutSpec{Canary: 2, Resend: driver.Duration(10 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	r.step()
	canary := r.take()
	r.answer(canary[0], uplink.BundleReceived, uplink.BundleApplied, uplink.BundleHealthy)
	r.step()
	// The second canary never answered before the hub stopped.
	r.restart()
	r.online(base.Hash, gws...)
	r.step()
	if got := r.take(); len(got) != 0 {
		t.Fatalf("restart sent %d offers at once, want none before the resend interval", len(got))
	}
	r.clock.add(10 * time.Second)
	r.step()
	again := r.take()
	if len(again) != 1 || again[0].gw != canary[1].gw || again[0].c.ID != canary[1].c.ID {
		t.Fatalf("resend %v, want %s's offer again with its control ID %s", again, canary[1].gw, canary[1].c.ID)
	}
	r.answer(again[0], uplink.BundleReceived, uplink.BundleApplied, uplink.BundleHealthy)
	r.step()
	v = r.view(v.ID)
	for _, tg := range v.Gateways {
		if tg.Offers > 1 {
			t.Fatalf("%s had %d offers, want at most 1", tg.Gateway, tg.Offers)
		}
	}
	if v.Counts[TargetHealthy] != 2 {
		t.Fatalf("counts %v, want the 2 canaries healthy", v.Counts)
	}
}

func TestAbortDecisionSurvivesARestart(t *testing.T) {
	r := newFleetRig(t)
	base := r.push(testBundle(t, "", ""))
	r.push(testBundle(t, "v2", ""))
	r.online(base.Hash, gatewayIDs(4)...)
	v, err := r.f.StartRollout(context.Background(), RolloutSpec{Canary: 2})
	if err != nil {
		t.Fatal(err)
	}
	r.step()
	canary := r.take()
	r.answer(canary[0], uplink.BundleReceived, uplink.BundleApplied)
	r.answer(canary[1], uplink.BundleReceived, uplink.BundleRejected)
	r.f.mu.Lock()
	r.f.applyStatus(canary[1].gw, uplink.BundleStatus{}, r.clock.Now()) // nothing: no rollout named
	r.f.mu.Unlock()
	r.step()
	first := r.take()
	r.restart()
	r.online(base.Hash, gatewayIDs(4)...)
	v = r.view(v.ID)
	if v.State != RolloutAborting {
		t.Fatalf("after the restart: %s, want aborting", v.State)
	}
	r.clock.add(10 * time.Second)
	r.step()
	again := r.take()
	if len(first) != 1 || len(again) != 1 || again[0].c.ID != first[0].c.ID {
		t.Fatalf("rollback offers %v then %v: want the same control ID sent again", first, again)
	}
}

func TestOlderOrRepeatedStatusesNeverMoveAGatewayBack(t *testing.T) {
	r := newFleetRig(t)
	h1 := strings.Repeat("a", 64)
	h2 := strings.Repeat("b", 64)
	st := func(v uint64, h, s string) {
		bs := uplink.BundleStatus{Gateway: "gw-1", Hash: h, Version: v, Status: s, At: r.clock.Now()}
		if s == uplink.BundleReverted {
			bs.Reason = uplink.ReasonSuperseded
		}
		r.f.NoteStatus("gw-1", bs)
		r.step()
	}
	st(5, h2, uplink.BundleHealthy)
	st(4, h1, uplink.BundleReverted)
	st(5, h2, uplink.BundleApplied)
	st(5, h2, uplink.BundleHealthy)
	g := r.f.Gateways()[0]
	if g.Version != 5 || g.Status != uplink.BundleHealthy || g.Expected != h2 {
		t.Fatalf("gateway at version %d %s expecting %s, want 5 healthy expecting %s", g.Version, g.Status, bundle.Short(g.Expected), bundle.Short(h2))
	}
}

func TestPreflightHoldsAWaveThatWouldFail(t *testing.T) {
	r := newFleetRig(t)
	base := r.push(testBundle(t, "", ""))
	r.push(testBundle(t, "v2", "v2.0.0"))
	r.online(base.Hash, "gw-1")
	r.f.NoteGateway(Gateway{ID: "gw-2", State: StateOnline, Heartbeat: &uplink.Heartbeat{Gateway: "gw-2", Version: "v2.1.0",
		Config: &uplink.ConfigState{Hash: strings.Repeat("c", 64), Source: uplink.SourceFiles}}})
	r.f.NoteGateway(Gateway{ID: "gw-3", State: StateOnline, Heartbeat: &uplink.Heartbeat{Gateway: "gw-3", Version: "v2.1.0",
		Config: &uplink.ConfigState{Hash: base.Hash, Source: uplink.SourceFiles}}})
	r.step()
	v, err := r.f.StartRollout(context.Background(), RolloutSpec{Canary: 3})
	if err != nil {
		t.Fatal(err)
	}
	r.step()
	if got := r.take(); len(got) != 0 {
		t.Fatalf("%d offers sent; want the wave held", len(got))
	}
	v = r.view(v.ID)
	if v.State != RolloutPaused || v.Counts["refused"] != 2 {
		t.Fatalf("state %s counts %v, want paused with 2 refused", v.State, v.Counts)
	}
	reasons := map[string]string{}
	for _, tg := range v.Gateways {
		reasons[tg.Gateway] = tg.Refused
	}
	if !strings.HasPrefix(reasons["gw-1"], "agent_too_old") || !strings.HasPrefix(reasons["gw-2"], "no_way_back") || reasons["gw-3"] != "" {
		t.Fatalf("reasons %q", reasons)
	}
	if _, err := r.f.Resume(context.Background(), v.ID, true); err != nil {
		t.Fatal(err)
	}
	r.step()
	sent := r.take()
	if len(sent) != 1 || sent[0].gw != "gw-3" {
		t.Fatalf("offers %v after resume -skip, want gw-3's alone", sent)
	}
}

// withRegistryNote is b with a line added to its devices.toml: another
// registry, the same devices.
func withRegistryNote(tb testing.TB, b *bundle.Bundle, note string) *bundle.Bundle {
	tb.Helper()
	files := slices.Clone(b.Files)
	for i, f := range files {
		if f.Path == bundle.RegistryFile {
			files[i].Data = append(slices.Clone(f.Data), "\n# "+note+"\n"...)
		}
	}
	nb, err := bundle.New(b.MinAgent, files)
	if err != nil {
		tb.Fatal(err)
	}
	return nb
}

// TestPreflightTellsARegistryEditFromAnotherBuildingsRegistry: a bundle
// whose devices.toml differs from what a gateway runs goes to an agent
// that swaps registries when the gateway runs one of the group's own
// releases (the group's registry was edited), and is refused to a
// gateway running a registry released elsewhere (another building's,
// which it would replace) and to an agent that swaps only at a restart.
func TestPreflightTellsARegistryEditFromAnotherBuildingsRegistry(t *testing.T) {
	r := newFleetRig(t)
	base := r.push(testBundle(t, "", ""))
	other := withRegistryNote(t, testBundle(t, "", ""), "another building")
	enc, err := other.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.f.PushBundle(context.Background(), "elsewhere", enc); err != nil {
		t.Fatal(err)
	}
	r.push(withRegistryNote(t, testBundle(t, "v2", ""), "edited"))
	hb := func(gw, hash string, swaps bool) {
		r.f.NoteGateway(Gateway{ID: gw, State: StateOnline, Heartbeat: &uplink.Heartbeat{Gateway: gw, Version: "v1.0.0", Time: r.clock.Now(),
			Config: &uplink.ConfigState{Hash: hash, Source: uplink.SourceFiles, SwapsRegistry: swaps}}})
	}
	hb("gw-edit", base.Hash, true)
	hb("gw-other", other.Hash(), true)
	hb("gw-old", base.Hash, false)
	r.step()
	v, err := r.f.StartRollout(context.Background(), RolloutSpec{Canary: 3})
	if err != nil {
		t.Fatal(err)
	}
	r.step()
	v = r.view(v.ID)
	reasons := map[string]string{}
	for _, tg := range v.Gateways {
		reasons[tg.Gateway] = tg.Refused
	}
	if reasons["gw-edit"] != "" || !strings.Contains(reasons["gw-other"], "registry_changed: it runs a devices.toml of its own") ||
		!strings.Contains(reasons["gw-old"], "only at a restart") {
		t.Fatalf("refusals %q", reasons)
	}
	if v.State != RolloutPaused || v.Counts["refused"] != 2 {
		t.Fatalf("state %s counts %v, want paused with 2 refused", v.State, v.Counts)
	}
}

func TestDriftShowsAndTheRevertPolicyOffersTheExpectedBundle(t *testing.T) {
	r := newFleetRig(t)
	_, next, v, o := r.startOne()
	r.answer(o, uplink.BundleReceived, uplink.BundleApplied, uplink.BundleHealthy)
	r.step()
	r.clock.add(time.Minute)
	r.step()
	if v = r.view(v.ID); v.State != RolloutCompleted {
		t.Fatalf("state %s", v.State)
	}
	r.clock.add(time.Second)
	r.online(next.Hash, "gw-1")
	if g := r.f.Gateways()[0]; g.Drifted {
		t.Fatal("drifted while running the bundle expected")
	}
	edited := strings.Repeat("e", 64)
	r.online(edited, "gw-1")
	if g := r.f.Gateways()[0]; !g.Drifted {
		t.Fatalf("not drifted running %s, expected %s", bundle.Short(edited), bundle.Short(g.Expected))
	}
	if _, err := r.f.SetGroup(context.Background(), Group{Name: DefaultGroup, DriftPolicy: DriftRevert}); err != nil {
		t.Fatal(err)
	}
	r.take()
	r.online(edited, "gw-1")
	sent := r.take()
	if len(sent) != 1 || sent[0].c.Bundle.Hash != next.Hash || sent[0].c.Bundle.Version <= next.Version {
		t.Fatalf("revert offers %v, want %s at a newer version", sent, bundle.Short(next.Hash))
	}
}

func TestPushRefusesABundleTheAgentWouldReject(t *testing.T) {
	r := newFleetRig(t)
	b := testBundle(t, "", "")
	files := append([]bundle.File(nil), b.Files...)
	files = append(files, bundle.File{Path: "scenes/typo.toml", Data: []byte("[[scene]]\nname = \"typo\"\n[[scene.step]]\ndevice = \"no_such_lamp\"\naction = \"turn_on\"\n")})
	bad, err := bundle.New("", files)
	if err != nil {
		t.Fatal(err)
	}
	enc, _ := bad.Encode()
	_, _, err = r.f.PushBundle(context.Background(), "", enc)
	if err == nil || !strings.Contains(err.Error(), "no_such_lamp") {
		t.Fatalf("push: %v, want the unknown device named", err)
	}
	rel1 := r.push(b)
	enc, _ = b.Encode()
	rel2, created, err := r.f.PushBundle(context.Background(), "", enc)
	if err != nil || created || rel2 != rel1 {
		t.Fatalf("second push: %+v created=%v %v, want release %+v again", rel2, created, err, rel1)
	}
}

func TestHandEditedFilesShowAsDriftWithinAHeartbeat(t *testing.T) {
	r := newFleetRig(t)
	base := r.push(testBundle(t, "", ""))
	r.online(base.Hash, "gw-1", "gw-2")
	edited := strings.Repeat("f", 64)
	r.f.NoteGateway(Gateway{ID: "gw-2", State: StateOnline, Heartbeat: &uplink.Heartbeat{Gateway: "gw-2", Version: "v1.0.0", Time: r.clock.Now(),
		Config: &uplink.ConfigState{Hash: base.Hash, Source: uplink.SourceFiles, Files: edited}}})
	r.step()
	drifted := map[string]string{}
	for _, g := range r.f.Gateways() {
		if g.Drifted {
			drifted[g.Gateway] = g.Drift
		}
	}
	if len(drifted) != 1 || drifted["gw-2"] != DriftFiles {
		t.Fatalf("drifted %v, want gw-2 alone, its files edited", drifted)
	}
	if _, err := r.f.SetGroup(context.Background(), Group{Name: DefaultGroup, DriftPolicy: DriftRevert}); err != nil {
		t.Fatal(err)
	}
	r.take()
	r.f.NoteGateway(Gateway{ID: "gw-2", State: StateOnline, Heartbeat: &uplink.Heartbeat{Gateway: "gw-2", Version: "v1.0.0", Time: r.clock.Now(),
		Config: &uplink.ConfigState{Hash: base.Hash, Source: uplink.SourceFiles, Files: edited}}})
	r.step()
	sent := r.take()
	if len(sent) != 1 || sent[0].gw != "gw-2" || sent[0].c.Bundle.Hash != base.Hash {
		t.Fatalf("revert offers %v, want gw-2 offered what it runs (%s) so the edit never takes effect", sent, bundle.Short(base.Hash))
	}
}

func TestFleetMetricsCountRolloutsOffersStatusesAndDrift(t *testing.T) {
	r := newFleetRig(t)
	base := r.push(testBundle(t, "", ""))
	r.push(testBundle(t, "v2", ""))
	r.online(base.Hash, "gw-1", "gw-2")
	if _, err := r.f.StartRollout(context.Background(), RolloutSpec{}); err != nil {
		t.Fatal(err)
	}
	r.step()
	o := r.take()[0]
	r.answer(o, uplink.BundleReceived, uplink.BundleReceived, uplink.BundleRejected)
	r.step()
	m := r.f.metrics
	want := `
# HELP sortie_hub_bundle_offers_total Bundle offers published to gateways, by kind (rollout, resend, rollback, revert).
# TYPE sortie_hub_bundle_offers_total counter
sortie_hub_bundle_offers_total{kind="rollout"} 1
# HELP sortie_hub_bundle_statuses_total Bundle statuses received, by result: new, repeat (same gateway, version and step), old (an older version or step: changes nothing), invalid.
# TYPE sortie_hub_bundle_statuses_total counter
sortie_hub_bundle_statuses_total{result="new"} 2
sortie_hub_bundle_statuses_total{result="repeat"} 1
# HELP sortie_hub_rollout_aborts_total Rollouts aborted (by the failure threshold or an operator).
# TYPE sortie_hub_rollout_aborts_total counter
sortie_hub_rollout_aborts_total 1
# HELP sortie_hub_gateways_drifted Gateways whose running configuration is not the bundle the hub expects there.
# TYPE sortie_hub_gateways_drifted gauge
sortie_hub_gateways_drifted 0
`
	for _, c := range []struct {
		c     prometheus.Collector
		names []string
	}{
		{m.offers, []string{"sortie_hub_bundle_offers_total"}},
		{m.statuses, []string{"sortie_hub_bundle_statuses_total"}},
		{m.aborts, []string{"sortie_hub_rollout_aborts_total"}},
		{m, []string{"sortie_hub_gateways_drifted"}},
	} {
		if err := testutil.CollectAndCompare(c.c, strings.NewReader(want), c.names...); err != nil {
			t.Error(err)
		}
	}
	rollouts := `
# HELP sortie_hub_rollouts Rollouts, by state (running, paused, aborting, aborted, completed, superseded).
# TYPE sortie_hub_rollouts gauge
sortie_hub_rollouts{state="aborted"} 1
sortie_hub_rollouts{state="aborting"} 0
sortie_hub_rollouts{state="completed"} 0
sortie_hub_rollouts{state="paused"} 0
sortie_hub_rollouts{state="running"} 0
sortie_hub_rollouts{state="superseded"} 0
`
	// Aborted at once: the one that failed took nothing, so nothing is
	// rolled back.
	if err := testutil.CollectAndCompare(m, strings.NewReader(rollouts), "sortie_hub_rollouts"); err != nil {
		t.Error(err)
	}
}

func TestContinuousRolloutTakesInLateGatewaysAndOnesThatComeBack(t *testing.T) {
	r := newFleetRig(t)
	base := r.push(testBundle(t, "", ""))
	next := r.push(testBundle(t, "v2", ""))
	r.online(base.Hash, "gw-1")
	r.f.NoteGateway(Gateway{ID: "gw-off", State: StateOffline})
	r.step()
	for _, gw := range []string{"gw-1", "gw-off"} {
		if _, err := r.f.SetTags(context.Background(), gw, []string{"lab"}); err != nil {
			t.Fatal(err)
		}
	}
	v, err := r.f.StartRollout(context.Background(), RolloutSpec{Tag: "lab", Continuous: true, Canary: 2,
		Deadline: driver.Duration(time.Hour), GatewayTimeout: driver.Duration(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	r.step()
	for _, o := range r.take() {
		r.answer(o, uplink.BundleReceived, uplink.BundleApplied, uplink.BundleHealthy)
	}
	r.step()
	r.clock.add(time.Hour)
	r.step()
	if v = r.view(v.ID); v.State != RolloutCompleted || !v.Following || v.Counts[TargetUnreachable] != 1 {
		t.Fatalf("state %s following %v counts %v, want completed, following, gw-off unreachable", v.State, v.Following, v.Counts)
	}
	// A gateway tagged after the end joins; the unreachable one comes back.
	r.online(base.Hash, "gw-new")
	if _, err := r.f.SetTags(context.Background(), "gw-new", []string{"lab"}); err != nil {
		t.Fatal(err)
	}
	r.online(base.Hash, "gw-off")
	sent := map[string]bool{}
	for _, o := range r.take() {
		if o.c.Bundle.Hash != next.Hash {
			t.Fatalf("offer of %s, want %s", bundle.Short(o.c.Bundle.Hash), bundle.Short(next.Hash))
		}
		sent[o.gw] = true
		r.answer(o, uplink.BundleReceived, uplink.BundleApplied, uplink.BundleHealthy)
	}
	r.step()
	if !sent["gw-new"] || !sent["gw-off"] || len(sent) != 2 {
		t.Fatalf("offers to %v, want gw-new and gw-off", sent)
	}
	if v = r.view(v.ID); v.Counts[TargetHealthy] != 3 {
		t.Fatalf("counts %v, want all 3 healthy", v.Counts)
	}
}

func TestAHeartbeatRunningTheReleaseKeptCountsAsHealthy(t *testing.T) {
	r := newFleetRig(t)
	_, next, v, o := r.startOne()
	r.f.NoteResult("gw-1", uplink.ControlResult{ID: o.c.ID, OK: true})
	// The statuses went while the hub was away; the heartbeat says it.
	for _, trial := range []bool{true, false} {
		r.f.NoteGateway(Gateway{ID: "gw-1", State: StateOnline, Heartbeat: &uplink.Heartbeat{Gateway: "gw-1", Version: "v1.0.0", Time: r.clock.Now(),
			Config: &uplink.ConfigState{Hash: next.Hash, Version: o.c.Bundle.Version, Source: uplink.SourceHub, Trial: trial}}})
		r.step()
		want := TargetNotified
		if !trial {
			want = TargetHealthy
		}
		if got := r.view(v.ID).Gateways[0].Status; got != want {
			t.Fatalf("trial %v: %s, want %s", trial, got, want)
		}
	}
}

// TestAnOperatorChangeThatCannotBeWrittenChangesNothing: a pause, an
// abort, a start, tags or a drift policy answered with an error (the
// store could not write it) did not happen: the engine goes on as
// before, sends nothing for it, and a restart finds nothing of it.
func TestAnOperatorChangeThatCannotBeWrittenChangesNothing(t *testing.T) {
	r := newFleetRig(t)
	ctx := context.Background()
	base := r.push(testBundle(t, "", ""))
	r.push(testBundle(t, "v2", ""))
	r.online(base.Hash, gatewayIDs(4)...)
	v, err := r.f.StartRollout(ctx, RolloutSpec{Canary: 2})
	if err != nil {
		t.Fatal(err)
	}
	r.step()
	canary := r.take()
	r.answer(canary[0], uplink.BundleReceived, uplink.BundleApplied)
	r.step()

	r.failWrites.Store(true)
	if _, err := r.f.Pause(ctx, v.ID); err == nil {
		t.Fatal("pause answered without an error while writes fail")
	}
	if _, err := r.f.Abort(ctx, v.ID); err == nil {
		t.Fatal("abort answered without an error while writes fail")
	}
	if _, err := r.f.StartRollout(ctx, RolloutSpec{}); err == nil {
		t.Fatal("a start answered without an error while writes fail")
	}
	if _, err := r.f.SetTags(ctx, "gw-00", []string{"lab"}); err == nil {
		t.Fatal("tags answered without an error while writes fail")
	}
	if _, err := r.f.SetGroup(ctx, Group{Name: "default", DriftPolicy: DriftRevert}); err == nil {
		t.Fatal("a drift policy answered without an error while writes fail")
	}
	if got := r.view(v.ID); got.State != RolloutRunning {
		t.Fatalf("after a pause and an abort that failed: %s (%s), want running", got.State, got.Reason)
	}
	if n := len(r.f.Rollouts()); n != 1 {
		t.Fatalf("%d rollouts after a start that failed, want 1", n)
	}
	r.failWrites.Store(false)
	r.step()
	for _, o := range r.take() {
		if o.c.Bundle != nil && o.c.Bundle.Hash == base.Hash {
			t.Fatalf("a rollback offered to %s after an abort that failed", o.gw)
		}
	}
	check := func(when string) {
		t.Helper()
		if got := r.view(v.ID); got.State != RolloutRunning {
			t.Fatalf("%s: %s (%s), want running", when, got.State, got.Reason)
		}
		if n := len(r.f.Rollouts()); n != 1 {
			t.Fatalf("%s: %d rollouts, want 1", when, n)
		}
		for _, g := range r.f.Gateways() {
			if len(g.Tags) > 0 {
				t.Fatalf("%s: %s has tags %v", when, g.Gateway, g.Tags)
			}
		}
		groups, err := r.f.Groups(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range groups {
			if g.DriftPolicy == DriftRevert {
				t.Fatalf("%s: group %s has the drift policy that failed", when, g.Name)
			}
		}
	}
	check("after the next step")
	r.restart()
	check("after a restart")
	if _, err := r.f.Abort(ctx, v.ID); err != nil {
		t.Fatalf("an abort once writes work again: %v", err)
	}
	if got := r.view(v.ID); got.State != RolloutAborting {
		t.Fatalf("after the abort: %s, want aborting", got.State)
	}
	rels, err := r.st.Releases(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, rel := range rels {
		if rel.Kind == ReleaseRollback {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d rollback releases after an abort that failed and one that passed, want 1 (the first one's, used by the second)", n)
	}
}

// TestEndedRolloutsPastRetentionAreForgotten: ended rollouts beyond the
// newest of their group kept, or ended longer ago than kept, are
// deleted with their gateways, in memory and in the store; the newest
// rollout of a group stays, so IDs never go back after a restart.
func TestEndedRolloutsPastRetentionAreForgotten(t *testing.T) {
	r := &fleetRig{t: t, path: filepath.Join(t.TempDir(), "hub.db"), clock: &testClock{now: time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)},
		opts: FleetOptions{KeepRollouts: 30 * 24 * time.Hour, KeepRolloutsPerGroup: 2}}
	r.open(true)
	ctx := context.Background()
	base := r.push(testBundle(t, "", ""))
	r.push(testBundle(t, "v2", ""))
	r.online(base.Hash, gatewayIDs(3)...)
	ids := func() []string {
		var out []string
		for _, v := range r.f.Rollouts() {
			out = append(out, v.ID)
		}
		slices.Sort(out)
		return out
	}
	stored := func() (rollouts, targets int) {
		st, err := r.st.LoadFleet(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(st.Rollouts), len(st.Targets)
	}
	for range 4 { // each supersedes the one before
		if _, err := r.f.StartRollout(ctx, RolloutSpec{Deadline: driver.Duration(time.Hour)}); err != nil {
			t.Fatal(err)
		}
		r.step()
	}
	if got, want := ids(), []string{"r-3", "r-4"}; !slices.Equal(got, want) {
		t.Fatalf("rollouts kept %v, want %v (two per group)", got, want)
	}
	if nr, nt := stored(); nr != 2 || nt != 6 {
		t.Fatalf("store holds %d rollouts and %d gateways of them, want 2 and 6", nr, nt)
	}
	r.clock.add(31 * 24 * time.Hour) // r-4 ends at its deadline now
	r.step()
	if got, want := ids(), []string{"r-4"}; !slices.Equal(got, want) {
		t.Fatalf("rollouts kept a month on %v, want %v (the newest of the group stays)", got, want)
	}
	r.restart()
	if got, want := ids(), []string{"r-4"}; !slices.Equal(got, want) {
		t.Fatalf("after a restart %v, want %v", got, want)
	}
	if nr, nt := stored(); nr != 1 || nt != 3 {
		t.Fatalf("store holds %d rollouts and %d gateways of them after the restart, want 1 and 3", nr, nt)
	}
	v, err := r.f.StartRollout(ctx, RolloutSpec{})
	if err != nil {
		t.Fatal(err)
	}
	if v.ID != "r-5" {
		t.Fatalf("the next rollout is %s, want r-5", v.ID)
	}
}

// TestARevertWhoseStatusWasLostEndsFailedFromItsHeartbeat: a gateway
// on trial whose "reverted" never reached the hub (lost while a
// cluster's lead changed hands) ends failed once its heartbeat runs the
// bundle it ran before again, sent since it applied the release; not
// unreachable at the deadline. Heartbeats from before the apply
// change nothing.
func TestARevertWhoseStatusWasLostEndsFailedFromItsHeartbeat(t *testing.T) {
	r := newFleetRig(t)
	base, _, v, o := r.startOne()
	applied := r.clock.Now()
	r.answer(o, uplink.BundleReceived, uplink.BundleApplied)
	r.step()
	heartbeat := func(sent time.Time) {
		// Since is when the old bundle first ran: an agent going back
		// to it keeps it.
		r.f.NoteGateway(Gateway{ID: o.gw, State: StateOnline, Heartbeat: &uplink.Heartbeat{Gateway: o.gw, Version: "v1.0.0", Time: sent,
			Config: &uplink.ConfigState{Hash: base.Hash, Source: uplink.SourceFiles, Since: applied.Add(-24 * time.Hour)}}})
		r.step()
	}
	heartbeat(applied.Add(-time.Hour)) // sent before the apply, arriving late
	if tg := r.view(v.ID).Gateways[0]; tg.Status != TargetApplied {
		t.Fatalf("after a heartbeat from before the apply: %s, want applied", tg.Status)
	}
	r.clock.add(time.Minute)
	heartbeat(r.clock.Now()) // its "reverted" was lost
	tg := r.view(v.ID).Gateways[0]
	if tg.Status != TargetFailed || !strings.Contains(tg.Message, "lost") {
		t.Fatalf("after a heartbeat on the old bundle: %s (%s %s), want failed, saying the status was lost", tg.Status, tg.Reason, tg.Message)
	}
	if got := r.take(); len(got) != 0 {
		t.Fatalf("offers after it: %v", got)
	}
}
