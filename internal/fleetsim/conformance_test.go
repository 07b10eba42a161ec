package fleetsim_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/agent/agenttest"
	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/bundle"
	"github.com/sortie-edge/sortie/internal/fleetsim"
	"github.com/sortie-edge/sortie/simulator"
	"github.com/sortie-edge/sortie/uplink"
)

const (
	conformSoak    = 300 * time.Millisecond
	conformConfirm = 2 * time.Second
	// evening uses the hall light, which answers on both gateways.
	evening = `[[scene]]
name = "evening"
[[scene.step]]
device = "hall-light"
action = "turn_on"
params = { brightness = 30 }
`
	// porch uses the porch light, which no gateway of these tests runs:
	// it never answers.
	porch = `[[scene]]
name = "porch"
[[scene.step]]
device = "porch-light"
action = "turn_on"
`
	// typo names a device the registry does not have.
	typo = `[[scene]]
name = "typo"
[[scene.step]]
device = "no_such_lamp"
action = "turn_on"
`
)

// startAgent runs a real agent as gateway id with its data in dir: an
// embedded broker on 127.0.0.1 for its devices, a simulated home of
// the hall and kitchen lights (no porch light), bbolt, and its hub sync
// to hubURL. stop stops it (the test's cleanup does, if not before).
func startAgent(t *testing.T, id, dir, hubURL string, files *bundle.Bundle) (stop func()) {
	t.Helper()
	reg, cat := agenttest.Bundle(t, files)
	return agenttest.Start(t, agent.Options{
		Gateway: id, DataDir: dir, Registry: reg, Catalog: cat, QuietMissions: true, Version: fleetsim.DefaultVersion,
		Driver: agent.DriverOptions{StopGrace: time.Second},
		Home: &agent.HomeConfig{Devices: []simulator.DeviceConfig{
			{ID: "hall-light", Type: simulator.TypeLight},
			{ID: "kitchen-light", Type: simulator.TypeLight},
		}},
		Bundles: &agent.BundleOptions{Files: files, Soak: conformSoak, Confirm: conformConfirm},
		Hub:     &agent.HubOptions{URL: hubURL, Heartbeat: 100 * time.Millisecond},
	}).Stop
}

// must fails tb on err; it returns a function for the results of a
// call that makes a bundle.
func must(tb testing.TB) func(*bundle.Bundle, error) *bundle.Bundle {
	return func(b *bundle.Bundle, err error) *bundle.Bundle {
		tb.Helper()
		if err != nil {
			tb.Fatal(err)
		}
		return b
	}
}

func offer(t testing.TB, id string, b *bundle.Bundle, version uint64, soak float64) uplink.Control {
	t.Helper()
	enc, err := b.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return uplink.Control{ID: id, Action: uplink.ActionBundle,
		Bundle: &uplink.BundleOffer{Hash: b.Hash(), Version: version, Rollout: "r-conform", SoakSeconds: soak, Bundle: enc}}
}

// said is a bundle status without what differs between two gateways
// saying the same thing (who, when).
func said(s uplink.BundleStatus) string {
	return fmt.Sprintf("v%d %s %s %s current=%s (%s)", s.Version, bundle.Short(s.Hash), s.Status, s.Reason, bundle.Short(s.Current), s.Message)
}

// TestLightGatewayAnswersOffersAsTheAgentDoes sends one sequence of
// bundle offers to a real agent and to a light gateway, through a real
// broker on 127.0.0.1, and holds the light gateway to every control
// result and bundle status the agent gives: a good bundle, one that
// does not validate, a stale one, a control repeated, an offer
// repeated, a newer bundle while one is on trial, one whose devices
// never answer, another registry (swapped in), a newer agent needed, the bundle
// that runs offered again, and a restart during a trial (the agent
// stopped and started again on its data).
func TestLightGatewayAnswersOffersAsTheAgentDoes(t *testing.T) {
	b := brokertest.Start(t)
	hub := newRecorder(t, b.URL())
	mb := must(t)
	files := mb(fleetsim.DefaultFiles())
	agentDir := t.TempDir()
	stopAgent := startAgent(t, "real", agentDir, b.URL(), files)
	fleet, err := fleetsim.New(fleetsim.Options{Broker: b.URL(), IDs: []string{"light"}, Files: files,
		SilentDevices: []string{"porch-light"}, Heartbeat: 100 * time.Millisecond, Soak: conformSoak, Confirm: conformConfirm})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fleet.Close)
	if err := fleet.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	gws := []string{"real", "light"}
	hub.waitFor("a heartbeat of each gateway", 15*time.Second, func() bool {
		return len(hub.heartbeats["real"]) > 0 && len(hub.heartbeats["light"]) > 0
	})

	good := mb(fleetsim.With(map[string]string{"arrive.toml": fleetsim.Scene, "evening.toml": evening}))
	invalid := mb(fleetsim.With(map[string]string{"arrive.toml": fleetsim.Scene, "typo.toml": typo}))
	longTrial := mb(fleetsim.With(map[string]string{"evening.toml": evening}))
	newer := mb(fleetsim.With(map[string]string{"arrive.toml": fleetsim.Scene, "evening.toml": strings.Replace(evening, "30", "40", 1)}))
	silent := mb(fleetsim.With(map[string]string{"arrive.toml": fleetsim.Scene, "porch.toml": porch}))
	otherReg := mb(fleetsim.WithRegistry([]byte(fleetsim.Registry+"\n# another registry\n"), map[string]string{"arrive.toml": fleetsim.Scene}))
	tooNew := mb(bundle.New("v9.0.0", good.Files))

	steps := []struct {
		name string
		ctl  uplink.Control
		// answers is how many results the control's ID has once it is
		// answered (a repeat adds one); final is the status the step
		// ends on, "" for none.
		answers int
		final   string
		want    []string // the step's statuses, "version status reason"
	}{
		{"good", offer(t, "c-good", good, 1, 0), 1, uplink.BundleHealthy, []string{"1 received", "1 applied", "1 healthy"}},
		{"invalid", offer(t, "c-invalid", invalid, 2, 0), 1, uplink.BundleRejected, []string{"2 received", "2 rejected invalid"}},
		{"stale", offer(t, "c-stale", newer, 1, 0), 1, "", nil},
		// The uplink keeps no answer whose code is "invalid" (it takes
		// them for requests that did not decode), so a repeat of a
		// bundle rejected as invalid is offered again, and answered from
		// what it became: the status is said again.
		{"control repeated", offer(t, "c-invalid", invalid, 2, 0), 2, uplink.BundleRejected, []string{"2 rejected invalid"}},
		{"another control repeated", offer(t, "c-good", good, 1, 0), 2, "", nil},
		{"offer repeated", offer(t, "c-invalid-again", invalid, 2, 0), 1, uplink.BundleRejected, []string{"2 rejected invalid"}},
		{"long trial", offer(t, "c-long", longTrial, 3, 60), 1, uplink.BundleApplied, []string{"3 received", "3 applied"}},
		{"newer while on trial", offer(t, "c-newer", newer, 4, 0), 1, uplink.BundleHealthy,
			[]string{"4 received", "3 reverted superseded", "4 applied", "4 healthy"}},
		{"devices never answer", offer(t, "c-silent", silent, 5, 0), 1, uplink.BundleReverted,
			[]string{"5 received", "5 applied", "5 reverted devices_silent"}},
		// A devices.toml of its own is swapped in, as the agent does.
		{"another registry", offer(t, "c-registry", otherReg, 6, 0), 1, uplink.BundleHealthy, []string{"6 received", "6 applied", "6 healthy"}},
		{"newer agent needed", offer(t, "c-too-new", tooNew, 7, 0), 1, uplink.BundleRejected, []string{"7 received", "7 rejected agent_too_old"}},
		{"what runs", offer(t, "c-runs", otherReg, 8, 0), 1, uplink.BundleHealthy, []string{"8 received", "8 healthy"}},
	}
	for _, st := range steps {
		hub.mu.Lock()
		before := map[string]int{}
		for _, gw := range gws {
			before[gw] = len(hub.statuses[gw])
		}
		hub.mu.Unlock()
		for _, gw := range gws {
			hub.control(gw, st.ctl)
		}
		hub.waitFor(st.name+": both answers and statuses", 15*time.Second, func() bool {
			for _, gw := range gws {
				if _, n, _ := hub.result(gw, st.ctl.ID); n < st.answers {
					return false
				}
				ss := hub.statuses[gw][before[gw]:]
				if st.final != "" && (len(ss) == 0 || ss[len(ss)-1].Status != st.final || ss[len(ss)-1].Version != st.ctl.Bundle.Version) {
					return false
				}
			}
			return true
		})
		hub.mu.Lock()
		agentRes, _, _ := hub.result("real", st.ctl.ID)
		lightRes, _, _ := hub.result("light", st.ctl.ID)
		var seqs [2][]string
		var brief []string
		for i, gw := range gws {
			for _, s := range hub.statuses[gw][before[gw]:] {
				seqs[i] = append(seqs[i], said(s))
				if i == 0 {
					brief = append(brief, strings.TrimSpace(fmt.Sprintf("%d %s %s", s.Version, s.Status, s.Reason)))
				}
			}
		}
		hub.mu.Unlock()
		if agentRes != lightRes {
			t.Errorf("%s: the agent answered %+v, the light gateway %+v", st.name, agentRes, lightRes)
		}
		if !slices.Equal(brief, st.want) {
			t.Errorf("%s: the agent said %q, want %q", st.name, brief, st.want)
		}
		if !slices.Equal(seqs[0], seqs[1]) {
			t.Errorf("%s: statuses differ\nagent: %q\nlight: %q", st.name, seqs[0], seqs[1])
		}
	}

	// A restart during a trial: the agent stopped and started on its
	// data, the light gateway restarted; both revert it and say so.
	hub.mu.Lock()
	before := map[string]int{"real": len(hub.statuses["real"]), "light": len(hub.statuses["light"])}
	hub.mu.Unlock()
	trialCtl := offer(t, "c-restart", good, 9, 60)
	for _, gw := range gws {
		hub.control(gw, trialCtl)
	}
	onTrial := func(gw string) bool {
		ss := hub.statuses[gw][before[gw]:]
		return len(ss) > 0 && ss[len(ss)-1].Status == uplink.BundleApplied
	}
	hub.waitFor("both on trial of version 9", 15*time.Second, func() bool { return onTrial("real") && onTrial("light") })
	stopAgent()
	startAgent(t, "real", agentDir, b.URL(), files)
	fleet.Gateway("light").Restart()
	reverted := func(gw string) bool {
		ss := hub.statuses[gw][before[gw]:]
		return len(ss) > 0 && ss[len(ss)-1].Status == uplink.BundleReverted
	}
	hub.waitFor("both reverted after the restart", 15*time.Second, func() bool { return reverted("real") && reverted("light") })
	hub.mu.Lock()
	var seqs [2][]string
	for i, gw := range gws {
		for _, s := range hub.statuses[gw][before[gw]:] {
			seqs[i] = append(seqs[i], said(s))
		}
	}
	hub.mu.Unlock()
	if !slices.Equal(seqs[0], seqs[1]) || !strings.HasSuffix(seqs[0][len(seqs[0])-1], "(the agent restarted before the bundle was confirmed healthy)") {
		t.Errorf("restart: statuses differ or do not say it\nagent: %q\nlight: %q", seqs[0], seqs[1])
	}

	// What each heartbeat says runs, once both have sent one since.
	hub.mu.Lock()
	n := map[string]int{"real": len(hub.heartbeats["real"]), "light": len(hub.heartbeats["light"])}
	hub.mu.Unlock()
	hub.waitFor("a heartbeat of each since", 15*time.Second, func() bool {
		return len(hub.heartbeats["real"]) > n["real"] && len(hub.heartbeats["light"]) > n["light"]
	})
	hub.mu.Lock()
	ra, _ := hub.lastHeartbeat("real")
	la, _ := hub.lastHeartbeat("light")
	hub.mu.Unlock()
	rc, lc := *ra.Config, *la.Config
	rc.Since, lc.Since = time.Time{}, time.Time{}
	if rc != lc || rc.Hash != otherReg.Hash() || rc.Version != 8 || rc.Files != files.Hash() {
		t.Errorf("heartbeat config: agent %+v, light %+v; want version 8 of %s (what ran before the trial cut short), files %s", rc, lc, bundle.Short(otherReg.Hash()), bundle.Short(files.Hash()))
	}
	if !slices.EqualFunc(ra.Scenes, la.Scenes, func(a, b uplink.SceneInfo) bool { return a.Name == b.Name && a.Description == b.Description }) {
		t.Errorf("heartbeat scenes: agent %+v, light %+v", ra.Scenes, la.Scenes)
	}
}
