package fleetsim_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/internal/fleetsim"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/uplink"
)

// rig is a fleet and the hub's side, on one broker on 127.0.0.1.
type rig struct {
	t     *testing.T
	hub   *recorder
	fleet *fleetsim.Fleet
	clock *testkit.Clock
}

func startRig(t *testing.T, o fleetsim.Options, faults map[string]fleetsim.Fault) *rig {
	t.Helper()
	b := brokertest.Start(t)
	r := &rig{t: t, hub: newRecorder(t, b.URL()), clock: testkit.NewClock(time.Date(2026, 12, 6, 20, 0, 0, 0, time.UTC))}
	o.Broker, o.Clock = b.URL(), r.clock
	if o.Soak == 0 {
		o.Soak = time.Minute
	}
	if o.Confirm == 0 {
		o.Confirm = 5 * time.Minute
	}
	f, err := fleetsim.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	for id, fault := range faults {
		f.Gateway(id).SetFault(fault)
	}
	r.fleet = f
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := f.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return r
}

// statuses is what gw said of version v, "status reason" each.
func (r *rig) statuses(gw string, v uint64) []string {
	var out []string
	for _, s := range r.hub.statuses[gw] {
		if s.Version == v {
			out = append(out, strings.TrimSpace(s.Status+" "+s.Reason))
		}
	}
	return out
}

// waitStatuses waits until gw said exactly want of version v.
func (r *rig) waitStatuses(gw string, v uint64, want ...string) {
	r.t.Helper()
	r.hub.waitFor(gw+" saying "+strings.Join(want, ", "), 15*time.Second, func() bool {
		return slices.Equal(r.statuses(gw, v), want)
	})
}

func TestFaultFractionsPickExactlyThatManyGatewaysFromTheSeed(t *testing.T) {
	o := fleetsim.Options{Broker: "tcp://127.0.0.1:1", Gateways: 1000, Seed: 42,
		Faults: fleetsim.Faults{Offline: 0.05, Registry: 0.3, Drift: 0.01, Slow: 0.5}}
	a, err := fleetsim.New(o)
	if err != nil {
		t.Fatal(err)
	}
	b, err := fleetsim.New(o)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		f    fleetsim.Fault
		want int
	}{{fleetsim.FaultOffline, 50}, {fleetsim.FaultRegistry, 300}, {fleetsim.FaultDrift, 10}, {fleetsim.FaultSlow, 500}, {fleetsim.FaultLossy, 0}} {
		got := a.With(c.f)
		if len(got) != c.want {
			t.Errorf("%s: %d gateways, want %d", c.f, len(got), c.want)
		}
		again := b.With(c.f)
		if !slices.EqualFunc(got, again, func(x, y *fleetsim.Gateway) bool { return x.ID() == y.ID() }) {
			t.Errorf("%s: seed 42 chose other gateways the second time", c.f)
		}
	}
	for _, g := range a.With(fleetsim.FaultDrift) {
		if c := g.Config(); c.Files == "" || c.Files == c.Hash {
			t.Errorf("%s: drifted, but its config says files %q, hash %q", g.ID(), c.Files, c.Hash)
		}
	}
	if _, err := fleetsim.New(fleetsim.Options{Broker: "tcp://127.0.0.1:1", Gateways: 3, Faults: fleetsim.Faults{Offline: 1.5}}); err == nil {
		t.Error("a fraction of 1.5 was taken")
	}
	if _, err := fleetsim.New(fleetsim.Options{Broker: "tcp://127.0.0.1:1", IDs: []string{"a/b"}}); err == nil {
		t.Error("gateway ID a/b was taken")
	}
}

func TestBundleWhoseDevicesNeverAnswerRevertsByItselfAtTheEndOfTheSoak(t *testing.T) {
	r := startRig(t, fleetsim.Options{IDs: []string{"ok", "mute"}}, map[string]fleetsim.Fault{"mute": fleetsim.FaultDevicesSilent})
	mb := must(t)
	good := mb(fleetsim.With(map[string]string{"arrive.toml": fleetsim.Scene, "evening.toml": evening}))
	for _, gw := range []string{"ok", "mute"} {
		r.hub.control(gw, offer(t, "c1", good, 1, 0))
		r.waitStatuses(gw, 1, "received", "applied")
	}
	r.clock.Advance(59 * time.Second)
	r.clock.Advance(time.Second)
	r.waitStatuses("ok", 1, "received", "applied", "healthy")
	r.waitStatuses("mute", 1, "received", "applied", "reverted devices_silent")
	if c := r.fleet.Gateway("mute").Config(); c.Hash != r.fleet.Files() || c.Trial || c.Source != uplink.SourceFiles {
		t.Errorf("mute runs %+v, want its files again", c)
	}
	if c := r.fleet.Gateway("ok").Config(); c.Hash != good.Hash() || c.Trial || c.Version != 1 {
		t.Errorf("ok runs %+v, want version 1", c)
	}
}

func TestUplinkCutDuringTheTrialRevertsAfterTheConfirmWindowAndSaysSoOnReturn(t *testing.T) {
	r := startRig(t, fleetsim.Options{IDs: []string{"cut"}}, map[string]fleetsim.Fault{"cut": fleetsim.FaultUplinkCut})
	good := must(t)(fleetsim.With(map[string]string{"arrive.toml": fleetsim.Scene, "evening.toml": evening}))
	r.hub.control("cut", offer(t, "c1", good, 1, 0))
	r.waitStatuses("cut", 1, "received", "applied")
	r.hub.waitFor("its last will", 15*time.Second, func() bool { return r.hub.presence["cut"].State == uplink.StateOffline })
	gw := r.fleet.Gateway("cut")
	r.clock.Advance(time.Minute)
	if last, _ := gw.Last(); last.Status != uplink.BundleApplied {
		t.Fatalf("after the soak, without the hub: %s, want still applied (the confirm window runs)", last.Status)
	}
	r.clock.Advance(5 * time.Minute)
	r.waitStatuses("cut", 1, "received", "applied", "reverted uplink_down")
	r.hub.waitFor("it back online", 15*time.Second, func() bool { return r.hub.presence["cut"].State == uplink.StateOnline })
	if c := gw.Config(); c.Hash != r.fleet.Files() || c.Trial {
		t.Errorf("runs %+v, want its files again", c)
	}
}

func TestHandEditShowsInTheNextHeartbeatOfThatGatewayOnly(t *testing.T) {
	r := startRig(t, fleetsim.Options{IDs: []string{"a", "b"}, Heartbeat: 30 * time.Second}, nil)
	r.fleet.Gateway("b").Edit()
	r.hub.mu.Lock()
	n := len(r.hub.heartbeats["b"])
	r.hub.mu.Unlock()
	r.clock.Advance(30 * time.Second)
	r.hub.waitFor("a heartbeat of each", 15*time.Second, func() bool {
		return len(r.hub.heartbeats["b"]) > n && len(r.hub.heartbeats["a"]) > 1
	})
	r.hub.mu.Lock()
	defer r.hub.mu.Unlock()
	a, _ := r.hub.lastHeartbeat("a")
	b, _ := r.hub.lastHeartbeat("b")
	if a.Config.Files != "" || a.Config.Hash != r.fleet.Files() {
		t.Errorf("a's heartbeat config %+v, want its files' hash and no drift", a.Config)
	}
	if b.Config.Files == "" || b.Config.Files == b.Config.Hash || b.Config.Hash != r.fleet.Files() {
		t.Errorf("b's heartbeat config %+v, want files naming the edit", b.Config)
	}
}

func TestOfflineGatewayStaysAwayUntilItComesBack(t *testing.T) {
	r := startRig(t, fleetsim.Options{IDs: []string{"on", "off"}}, map[string]fleetsim.Fault{"off": fleetsim.FaultOffline})
	r.hub.waitFor("on's presence", 15*time.Second, func() bool { return r.hub.presence["on"].State == uplink.StateOnline })
	if r.fleet.Gateway("off").Connected() || r.fleet.Connected() != 1 {
		t.Fatalf("%d connected, want only on", r.fleet.Connected())
	}
	r.fleet.Gateway("off").SetOnline(true)
	r.hub.waitFor("off's presence", 15*time.Second, func() bool { return r.hub.presence["off"].State == uplink.StateOnline })
}

// TestLossyGatewayTakesAnOfferOnceWhateverItLoses repeats a control
// until its result comes, as the hub does: the gateway loses half the
// requests and half the results, and applies the bundle once.
func TestLossyGatewayTakesAnOfferOnceWhateverItLoses(t *testing.T) {
	r := startRig(t, fleetsim.Options{IDs: []string{"lossy"}, Seed: 7, Faults: fleetsim.Faults{Lossy: 1, Slow: 1, LossRate: 0.5}}, nil)
	good := must(t)(fleetsim.With(map[string]string{"arrive.toml": fleetsim.Scene, "evening.toml": evening}))
	ctl := offer(t, "c1", good, 1, 0)
	for i := 0; ; i++ {
		r.hub.control("lossy", ctl)
		got := false
		func() {
			r.hub.mu.Lock()
			defer r.hub.mu.Unlock()
			_, _, got = r.hub.result("lossy", "c1")
		}()
		if got {
			break
		}
		if i == 200 {
			t.Fatalf("no result after %d sends (seed %d)", i, r.fleet.Seed())
		}
		// The hub's resend interval, shortened: a repeat, not a wait for
		// an event.
		time.Sleep(20 * time.Millisecond)
	}
	r.waitStatuses("lossy", 1, "received", "applied")
	if st := r.fleet.Stats(); st.Lost == 0 || st.Controls < 1 {
		t.Errorf("stats %+v: nothing lost", st)
	}
	r.clock.Advance(time.Minute)
	r.waitStatuses("lossy", 1, "received", "applied", "healthy")
}

func TestLocalApplyRunsOnTrialThenIsKeptAndTellsTheHubNothing(t *testing.T) {
	r := startRig(t, fleetsim.Options{IDs: []string{"gw"}}, nil)
	edited := must(t)(fleetsim.With(map[string]string{"arrive.toml": fleetsim.Scene + "# edited on the gateway\n"}))
	gw := r.fleet.Gateway("gw")
	out, err := gw.ApplyLocal(edited)
	if err != nil || out.Status != uplink.BundleApplied {
		t.Fatalf("apply: %+v, %v", out, err)
	}
	if c := gw.Config(); c.Hash != edited.Hash() || c.Source != uplink.SourceLocal || !c.Trial || c.Files != r.fleet.Files() {
		t.Fatalf("on trial: %+v", c)
	}
	r.clock.Advance(time.Minute)
	if last, _ := gw.Last(); last.Status != uplink.BundleHealthy {
		t.Fatalf("after the soak: %+v", last)
	}
	if c := gw.Config(); c.Trial || c.Hash != edited.Hash() {
		t.Fatalf("kept: %+v", c)
	}
	if n := r.fleet.Stats().Statuses; n != 0 {
		t.Errorf("%d bundle statuses sent about a local apply", n)
	}
}

func TestRestartDuringTheTrialRevertsAndSaysSoWhenBack(t *testing.T) {
	r := startRig(t, fleetsim.Options{IDs: []string{"gw"}}, nil)
	good := must(t)(fleetsim.With(map[string]string{"arrive.toml": fleetsim.Scene, "evening.toml": evening}))
	r.hub.control("gw", offer(t, "c1", good, 1, 0))
	r.waitStatuses("gw", 1, "received", "applied")
	gw := r.fleet.Gateway("gw")
	gw.Restart()
	r.waitStatuses("gw", 1, "received", "applied", "reverted restarted")
	if c := gw.Config(); c.Hash != r.fleet.Files() || c.Trial || c.Source != uplink.SourceFiles {
		t.Fatalf("after the restart: %+v, want its files", c)
	}
	// The same offer again is not applied again: the gateway took it.
	// Controls reach a gateway at QoS 0 (as the agent subscribes): one
	// published before the new connection's subscription is in place is
	// lost, and the hub sends it again until answered; so does this test.
	c2, sent := offer(t, "c2", good, 1, 0), time.Time{}
	testkit.Eventually(t, 15*time.Second, "the answer to the offer repeated", func() bool {
		r.hub.mu.Lock()
		_, _, ok := r.hub.result("gw", "c2")
		r.hub.mu.Unlock()
		if !ok && time.Since(sent) > time.Second {
			r.hub.control("gw", c2)
			sent = time.Now()
		}
		return ok
	})
	r.hub.mu.Lock()
	res, _, _ := r.hub.result("gw", "c2")
	r.hub.mu.Unlock()
	if !res.OK {
		t.Errorf("the offer repeated after the restart: %+v, want ok (answered from what it became)", res)
	}
}

func TestRestartPutsHandEditedFilesInForce(t *testing.T) {
	r := startRig(t, fleetsim.Options{IDs: []string{"gw"}}, nil)
	gw := r.fleet.Gateway("gw")
	gw.Edit()
	edited := gw.Config().Files
	if edited == "" {
		t.Fatal("the edit shows in no files hash")
	}
	gw.Restart()
	r.hub.waitFor("it back online", 15*time.Second, func() bool { return r.hub.presence["gw"].State == uplink.StateOnline && gw.Connected() })
	if c := gw.Config(); c.Hash != edited || c.Files != "" || c.Source != uplink.SourceFiles {
		t.Fatalf("after the restart: %+v, want the edited files %s in force", c, edited)
	}
}
