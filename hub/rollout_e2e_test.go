package hub

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/agent/agenttest"
	"github.com/sortie-edge/sortie/broker"
	"github.com/sortie-edge/sortie/bundle"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/simulator"
	"github.com/sortie-edge/sortie/uplink"
)

// The scenes of the end-to-end rollouts: v1 turns the living-room light
// on, v2 the kitchen's too, so a gateway whose home has no kitchen
// light keeps v2 on trial with a device that never answers, and
// reverts it by itself (devices_silent).
const (
	lightsV1 = "[[scene]]\nname = \"lights\"\n[[scene.step]]\ndevice = \"living-light\"\naction = \"turn_on\"\n"
	lightsV2 = lightsV1 + "[[scene.step]]\ndevice = \"kitchen-light\"\naction = \"turn_on\"\n"
)

func lightsBundle(tb testing.TB, scene string) *bundle.Bundle {
	tb.Helper()
	b, err := bundle.FromDir(filepath.Join("..", "configs"), "")
	if err != nil {
		tb.Fatal(err)
	}
	reg, _ := b.File(bundle.RegistryFile)
	nb, err := bundle.New("", []bundle.File{{Path: bundle.RegistryFile, Data: reg}, {Path: "scenes/lights.toml", Data: []byte(scene)}})
	if err != nil {
		tb.Fatal(err)
	}
	return nb
}

// e2eHub is a real hub (its broker with the hub's ACL, a bbolt file,
// the service with its rollout engine) that the test can restart.
type e2eHub struct {
	t        *testing.T
	broker   *broker.Broker
	path     string
	gateways []string
	st       *Store
	svc      *Service
	stop     func()
}

func startE2EHub(t *testing.T, gateways ...string) *e2eHub {
	h := &e2eHub{t: t, broker: testBroker(t, gateways...), path: filepath.Join(t.TempDir(), "hub.db"), gateways: gateways}
	h.start()
	return h
}

func (h *e2eHub) start() {
	h.t.Helper()
	st, err := Open(h.path, Options{})
	if err != nil {
		h.t.Fatal(err)
	}
	// As cmd/hub does at each start: the configured gateways are known
	// before they report.
	if err := st.Register(h.t.Context(), time.Now(), h.gateways...); err != nil {
		h.t.Fatal(err)
	}
	h.st = st
	h.svc = NewService(st, ServiceOptions{Broker: h.broker.URL(), ClientID: hubClientID, Username: hubUser, Password: hubPassword,
		Fleet: FleetOptions{Tick: 20 * time.Millisecond}})
	stop := runService(h.t, h.svc, wait)
	h.stop = func() {
		stop()
		_ = st.Close()
	}
	h.t.Cleanup(h.stop)
}

// restart stops the hub (service, then store) and starts it again
// from its file, as a hub process restarted.
func (h *e2eHub) restart() {
	h.t.Helper()
	h.stop()
	h.start()
}

func (h *e2eHub) push(b *bundle.Bundle) Release {
	h.t.Helper()
	enc, err := b.Encode()
	if err != nil {
		h.t.Fatal(err)
	}
	var rel Release
	h.eventually("the engine loaded", func() bool {
		rel, _, err = h.svc.Fleet().PushBundle(context.Background(), "", enc)
		return err == nil
	})
	return rel
}

// eventually waits for cond, polling: the engine's state is read, not
// a clock slept on (the agents' trials run on real time).
func (h *e2eHub) eventually(what string, cond func() bool) {
	h.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (h *e2eHub) rollout(id string) RolloutView {
	v, err := h.svc.Fleet().Rollout(id)
	if err != nil {
		h.t.Fatal(err)
	}
	return v
}

// startLightsAgent runs a real agent for gateway id: an embedded
// broker, a bbolt store in a temporary directory, a simulated home of
// the lights given, its configuration files the bundle files, linked
// to the hub.
func startLightsAgent(t *testing.T, hubURL, id string, files *bundle.Bundle, lights ...string) *agent.Agent {
	t.Helper()
	home := &agent.HomeConfig{}
	for _, l := range lights {
		home.Devices = append(home.Devices, simulator.DeviceConfig{ID: l, Type: simulator.TypeLight})
	}
	reg, cat := agenttest.Bundle(t, files)
	return agenttest.Start(t, agent.Options{
		Gateway: id, Registry: reg, Catalog: cat, Version: "v1.0.0", QuietMissions: true,
		Driver:  agent.DriverOptions{StopGrace: time.Second},
		Home:    home,
		Hub:     &agent.HubOptions{URL: hubURL, Password: gatewayPassword(id), Heartbeat: 200 * time.Millisecond},
		Bundles: &agent.BundleOptions{Files: files, Soak: time.Second, Confirm: 10 * time.Second},
	}).Agent
}

// offerLog counts, at the broker, the bundle offers each gateway was
// sent: distinct control IDs per (gateway, version), and every copy.
type offerLog struct {
	mu     sync.Mutex
	ids    map[string]map[string]bool // gateway/version -> control IDs
	copies int
}

func watchOffers(t *testing.T, url string) *offerLog {
	t.Helper()
	l := &offerLog{ids: map[string]map[string]bool{}}
	opts := paho.NewClientOptions().AddBroker(url).SetClientID("offer-log").SetUsername(hubUser).SetPassword(hubPassword).SetOrderMatters(false)
	c := paho.NewClient(opts)
	if tok := c.Connect(); !tok.WaitTimeout(wait) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(50) })
	tok := c.Subscribe(uplink.Topics{}.Wildcard("control"), 1, func(_ paho.Client, m paho.Message) {
		var ctl uplink.Control
		if json.Unmarshal(m.Payload(), &ctl) != nil || ctl.Bundle == nil {
			return
		}
		gw, _, _ := gatewayOf(uplink.Topics{}, m.Topic())
		key := fmt.Sprintf("%s/%d", gw, ctl.Bundle.Version)
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.ids[key] == nil {
			l.ids[key] = map[string]bool{}
		}
		l.ids[key][ctl.ID] = true
		l.copies++
	})
	if !tok.WaitTimeout(wait) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	return l
}

// twice lists the (gateway, version) offered under more than one
// control ID: a gateway notified twice in one wave.
func (l *offerLog) twice() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for k, ids := range l.ids {
		if len(ids) > 1 {
			out = append(out, k)
		}
	}
	return out
}

func agentRuns(t *testing.T, a *agent.Agent) string {
	t.Helper()
	c, err := a.Config()
	if err != nil {
		t.Fatal(err)
	}
	return c.Current.Hash
}

// TestRolloutOfRealAgentsEndsHealthyAcrossAHubRestart: three real
// agents and a fourth gateway that never connects; a good bundle goes
// out in a canary and waves, the hub restarts while the canary is on
// trial, and the rollout ends by its deadline with the three healthy on
// the new bundle, the fourth unreachable, and no gateway sent the
// release under two control IDs.
func TestRolloutOfRealAgentsEndsHealthyAcrossAHubRestart(t *testing.T) {
	gws := []string{"gw-0", "gw-1", "gw-2", "gw-off"}
	h := startE2EHub(t, gws...)
	offers := watchOffers(t, h.broker.URL())
	v1, v2 := lightsBundle(t, lightsV1), lightsBundle(t, lightsV2)
	h.push(v1)
	rel := h.push(v2)
	agents := map[string]*agent.Agent{}
	for _, gw := range gws[:3] {
		agents[gw] = startLightsAgent(t, h.broker.URL(), gw, v1, "living-light", "kitchen-light")
	}
	h.eventually("every agent reported its configuration", func() bool {
		n := 0
		for _, g := range h.svc.Fleet().Gateways() {
			if g.Config != nil && g.Config.Hash == v1.Hash() {
				n++
			}
		}
		return n == 3
	})
	r, err := h.svc.Fleet().StartRollout(context.Background(), RolloutSpec{
		Canary: 1, Factor: 2, Soak: driver.Duration(100 * time.Millisecond), GatewaySoak: driver.Duration(time.Second),
		GatewayTimeout: driver.Duration(3 * time.Second), Resend: driver.Duration(500 * time.Millisecond), Deadline: driver.Duration(12 * time.Second),
	})
	if err != nil {
		t.Fatal(err)
	}
	h.eventually("the canary is on trial", func() bool {
		v := h.rollout(r.ID)
		return v.Counts[TargetApplied] == 1 || v.Counts[TargetReceived] == 1
	})
	h.restart()
	h.eventually("the rollout ended", func() bool { v := h.rollout(r.ID); return !v.active() })
	v := h.rollout(r.ID)
	if v.State != RolloutCompleted || v.Counts[TargetHealthy] != 3 || v.Counts[TargetUnreachable] != 1 {
		t.Fatalf("rollout %s %v, want completed: 3 healthy, gw-off unreachable", v.State, v.Counts)
	}
	for gw, a := range agents {
		if got := agentRuns(t, a); got != rel.Hash {
			t.Errorf("%s runs %s, want %s", gw, bundle.Short(got), bundle.Short(rel.Hash))
		}
	}
	if twice := offers.twice(); len(twice) > 0 {
		t.Fatalf("notified twice in one wave (two control IDs for one release): %v", twice)
	}
	t.Logf("offers published, resends included: %d", offers.copies)
}

// TestCanaryOfRealAgentsAbortsAndRollsBack: of two canaries, one home
// has the kitchen light and keeps v2, the other has none and reverts
// v2 by itself; the rollout aborts within the canary, the canary that
// kept v2 is rolled back to v1 by the hub, and no other gateway is
// offered anything.
func TestCanaryOfRealAgentsAbortsAndRollsBack(t *testing.T) {
	gws := []string{"gw-a", "gw-b", "gw-c", "gw-d"}
	h := startE2EHub(t, gws...)
	offers := watchOffers(t, h.broker.URL())
	v1, v2 := lightsBundle(t, lightsV1), lightsBundle(t, lightsV2)
	base := h.push(v1)
	h.push(v2)
	order := append([]string(nil), gws...)
	spread("r-1", order) // the rollout's order: the first two are the canary
	agents := map[string]*agent.Agent{}
	for i, gw := range order {
		lights := []string{"living-light", "kitchen-light"}
		if i == 1 {
			lights = lights[:1]
		}
		agents[gw] = startLightsAgent(t, h.broker.URL(), gw, v1, lights...)
	}
	h.eventually("every agent reported its configuration", func() bool {
		n := 0
		for _, g := range h.svc.Fleet().Gateways() {
			if g.Config != nil {
				n++
			}
		}
		return n == 4
	})
	r, err := h.svc.Fleet().StartRollout(context.Background(), RolloutSpec{
		Canary: 2, Soak: driver.Duration(100 * time.Millisecond), GatewaySoak: driver.Duration(time.Second),
		Resend: driver.Duration(500 * time.Millisecond), AbortPercent: 50, AbortMin: 1, Deadline: driver.Duration(20 * time.Second),
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.ID != "r-1" {
		t.Fatalf("rollout %s, want r-1", r.ID)
	}
	h.eventually("the rollout ended", func() bool { v := h.rollout(r.ID); return !v.active() })
	v := h.rollout(r.ID)
	// The canary with the kitchen light is rolled back kept (healthy) or
	// still on trial, when the rollback supersedes its trial (reverted,
	// superseded: failed): which one is a race of the two trials.
	if v.State != RolloutAborted || v.Counts["rollback_"+BackRolledBack] != 1 || v.Counts[TargetNotSent] != 2 {
		t.Fatalf("rollout %s (%s) %v, want aborted: 1 rolled back, 2 not sent", v.State, v.Reason, v.Counts)
	}
	for _, t2 := range v.Gateways {
		if t2.Gateway == order[1] && t2.Reason != uplink.ReasonDevicesSilent {
			t.Fatalf("%s failed as %q, want devices_silent", t2.Gateway, t2.Reason)
		}
	}
	for gw, a := range agents {
		if got := agentRuns(t, a); got != base.Hash {
			t.Errorf("%s runs %s, want the old bundle %s", gw, bundle.Short(got), bundle.Short(base.Hash))
		}
	}
	if twice := offers.twice(); len(twice) > 0 {
		t.Fatalf("notified twice in one wave: %v", twice)
	}
	offers.mu.Lock()
	defer offers.mu.Unlock()
	for key := range offers.ids {
		for _, other := range order[2:] {
			if strings.HasPrefix(key, other+"/") {
				t.Errorf("%s was offered a bundle; only the canary should be", other)
			}
		}
	}
}

// TestDriftOfARealAgentShowsAndIsReverted: a gateway that kept v2 from
// a rollout is given another bundle locally ("agent apply"); once it
// keeps it, the hub shows it drifted (alert, the default), and with
// the group's policy set to revert, offers it v2 again, which it runs.
func TestDriftOfARealAgentShowsAndIsReverted(t *testing.T) {
	h := startE2EHub(t, "gw-x")
	v1, v2 := lightsBundle(t, lightsV1), lightsBundle(t, lightsV2)
	h.push(v1)
	rel := h.push(v2)
	a := startLightsAgent(t, h.broker.URL(), "gw-x", v1, "living-light", "kitchen-light")
	h.eventually("the agent reported its configuration", func() bool {
		gs := h.svc.Fleet().Gateways()
		return len(gs) == 1 && gs[0].Config != nil
	})
	r, err := h.svc.Fleet().StartRollout(context.Background(), RolloutSpec{Soak: driver.Duration(time.Millisecond), GatewaySoak: driver.Duration(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	h.eventually("the rollout completed", func() bool { return h.rollout(r.ID).State == RolloutCompleted })
	local := lightsBundle(t, lightsV2+"[[scene]]\nname = \"more\"\n[[scene.step]]\ndevice = \"living-light\"\naction = \"turn_off\"\n")
	enc, _ := local.Encode()
	if out, err := a.Apply(context.Background(), enc); err != nil || out.Status != uplink.BundleApplied {
		t.Fatalf("local apply: %+v %v", out, err)
	}
	fleetOf := func() FleetGateway { return h.svc.Fleet().Gateways()[0] }
	h.eventually("the hub shows the gateway drifted", func() bool { g := fleetOf(); return g.Drifted && g.Drift == DriftConfig })
	if g := fleetOf(); g.Config.Hash != local.Hash() || g.Expected != rel.Hash {
		t.Fatalf("drift: runs %s expected %s, want %s and %s", bundle.Short(g.Config.Hash), bundle.Short(g.Expected), bundle.Short(local.Hash()), bundle.Short(rel.Hash))
	}
	if _, err := h.svc.Fleet().SetGroup(context.Background(), Group{Name: DefaultGroup, DriftPolicy: DriftRevert}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the revert ran and the drift cleared", func() bool {
		g := fleetOf()
		return !g.Drifted && g.Config != nil && g.Config.Hash == rel.Hash && !g.Config.Trial
	})
	if got := agentRuns(t, a); got != rel.Hash {
		t.Fatalf("agent runs %s, want %s", bundle.Short(got), bundle.Short(rel.Hash))
	}
}
