package hub

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/agent/hubsync"
	"github.com/sortie-edge/sortie/bundle"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/clustertest"
	"github.com/sortie-edge/sortie/uplink"
)

// bundleAnswerer is a cluster test gateway's side of bundles: it takes
// every offer at once, reports received, applied and healthy, and
// counts the control IDs it was offered per version.
type bundleAnswerer struct {
	g *simGateway

	mu      sync.Mutex
	current string
	version uint64
	ids     map[uint64]map[string]bool
}

func (b *bundleAnswerer) Heartbeat(context.Context) uplink.Heartbeat {
	b.mu.Lock()
	defer b.mu.Unlock()
	src := uplink.SourceFiles
	if b.version > 0 {
		src = uplink.SourceHub
	}
	return uplink.Heartbeat{Version: "v1.0.0", Devices: []uplink.DeviceState{},
		Config: &uplink.ConfigState{Hash: b.current, Version: b.version, Source: src}}
}

func (b *bundleAnswerer) Control(ctx context.Context, c uplink.Control) uplink.ControlResult {
	if c.Bundle == nil {
		return uplink.ControlResult{Code: "invalid", Error: "not a bundle"}
	}
	o := c.Bundle
	b.mu.Lock()
	if b.ids[o.Version] == nil {
		b.ids[o.Version] = map[string]bool{}
	}
	b.ids[o.Version][c.ID] = true
	fresh := o.Version > b.version
	if fresh {
		b.current, b.version = o.Hash, o.Version
	}
	b.mu.Unlock()
	if fresh {
		b.g.mu.Lock()
		up := b.g.up
		b.g.mu.Unlock()
		for _, s := range []string{uplink.BundleReceived, uplink.BundleApplied, uplink.BundleHealthy} {
			if up != nil {
				// Lost with a connection: the heartbeat says it again.
				_ = up.BundleStatus(ctx, uplink.BundleStatus{Gateway: b.g.id, Hash: o.Hash, Version: o.Version, Rollout: o.Rollout, Status: s, Current: o.Hash, At: time.Now()})
			}
		}
	}
	return uplink.ControlResult{OK: true}
}

// startAnswerers starts uplink gateways that answer bundle offers,
// running hash to begin with.
func startAnswerers(t *testing.T, broker, hash string, gws []string) map[string]*bundleAnswerer {
	t.Helper()
	answers := map[string]*bundleAnswerer{}
	for _, gw := range gws {
		a := &bundleAnswerer{current: hash, ids: map[uint64]map[string]bool{}}
		a.g = startSimGatewayWith(t, gw, broker, "", func(o *hubsync.Options) {
			o.Control, o.Heartbeat, o.HeartbeatInterval = a, a, 300*time.Millisecond
		})
		answers[gw] = a
	}
	return answers
}

// offeredOnce checks that each gateway was offered version under one
// control ID.
func offeredOnce(t *testing.T, answers map[string]*bundleAnswerer, version uint64) {
	t.Helper()
	for gw, a := range answers {
		a.mu.Lock()
		n := len(a.ids[version])
		a.mu.Unlock()
		if n != 1 {
			t.Errorf("%s offered version %d under %d control IDs, want 1", gw, version, n)
		}
	}
}

// TestClusterOneReplicaDrivesARolloutAndAnotherTakesOver: of two hub
// replicas, one holds the lead (PostgreSQL's session lock) and drives a
// rollout; the other answers reads from the database and refuses to
// start one (not_leader). The leader stops mid-rollout; the other takes
// the lead, resumes from the database and completes the rollout, every
// gateway healthy and offered the release under one control ID.
func TestClusterOneReplicaDrivesARolloutAndAnotherTakesOver(t *testing.T) {
	gws := []string{"gw-0", "gw-1", "gw-2", "gw-3", "gw-4", "gw-5"}
	c := startClusterWith(t, 1, 2, gws, func(o *ServiceOptions) { o.Fleet.Tick = 20 * time.Millisecond })
	v1, v2 := testBundle(t, "", ""), testBundle(t, "v2", "")
	answers := startAnswerers(t, c.nats.Nodes[0].MQTTURL(), v1.Hash(), gws)
	for _, b := range []*bundle.Bundle{v1, v2} {
		enc, _ := b.Encode()
		if _, _, err := c.replicas[1].svc.Fleet().PushBundle(context.Background(), "", enc); err != nil {
			t.Fatal(err)
		}
	}
	eventually := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(60 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) { // polled: the engine's state, across replicas
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting until %s", what)
			}
		}
	}
	var lead, other *clusterReplica
	eventually("a replica drives the rollouts", func() bool {
		for i, r := range c.replicas {
			if r.svc.Fleet().Leading() {
				lead, other = r, c.replicas[1-i]
				return true
			}
		}
		return false
	})
	eventually("the leader knows every gateway's configuration", func() bool {
		n := 0
		for _, g := range lead.svc.Fleet().Gateways() {
			if g.Config != nil && g.Config.Hash == v1.Hash() {
				n++
			}
		}
		return n == len(gws)
	})
	spec := RolloutSpec{Canary: 1, Factor: 2, Soak: driver.Duration(500 * time.Millisecond), Resend: driver.Duration(500 * time.Millisecond),
		GatewayTimeout: driver.Duration(10 * time.Second), Deadline: driver.Duration(2 * time.Minute)}
	if _, err := other.svc.Fleet().StartRollout(context.Background(), spec); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("start on the replica that does not lead: %v, want ErrNotLeader", err)
	}
	r, err := lead.svc.Fleet().StartRollout(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	eventually("the canary is healthy", func() bool {
		v, err := lead.svc.Fleet().Rollout(r.ID)
		return err == nil && v.Counts[TargetHealthy] >= 1
	})
	if code, body := other.call("GET", "/api/rollouts/"+r.ID, ""); code != 200 {
		t.Fatalf("GET the rollout from the other replica: %d %s", code, body)
	}
	lead.stop(t)
	var v RolloutView
	eventually("the other replica completed the rollout", func() bool {
		if !other.svc.Fleet().Leading() {
			return false
		}
		v, err = other.svc.Fleet().Rollout(r.ID)
		return err == nil && v.State != RolloutRunning
	})
	if v.State != RolloutCompleted || v.Counts[TargetHealthy] != len(gws) {
		t.Fatalf("rollout %s (%s) %v, want completed, every gateway healthy", v.State, v.Reason, v.Counts)
	}
	offeredOnce(t, answers, v.Version)
	t.Logf("rollout %s completed by the second replica: %v", r.ID, v.Counts)
}

// procCall makes an API request of a replica process.
func procCall(t *testing.T, h *hubProc, method, path string, body []byte, out any) int {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+h.addr+path, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+chaosToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0 // a replica killed, or starting
	}
	defer func() { _ = res.Body.Close() }()
	if out != nil && res.StatusCode < 300 {
		if err := json.NewDecoder(res.Body).Decode(out); err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
	}
	return res.StatusCode
}

// TestClusterReplicaSIGKILLedWhileDrivingARollout: two hub replica
// processes; the one driving a rollout is SIGKILLed after the canary.
// Its PostgreSQL session dies with it, the other replica takes the lock
// and completes the rollout from the database: every gateway healthy,
// each offered the release under one control ID.
func TestClusterReplicaSIGKILLedWhileDrivingARollout(t *testing.T) {
	if testing.Short() {
		t.Skip("runs hub processes")
	}
	bin := buildHub(t)
	gws := []string{"gw-0", "gw-1", "gw-2", "gw-3", "gw-4", "gw-5"}
	users := []clustertest.User{hubNATSUser()}
	for _, gw := range gws {
		users = append(users, gatewayUser(gw))
	}
	nc := clustertest.StartNATS(t, 3, clustertest.NATSOptions{Users: users}) // the replicas' streams want 3 (startHubProc)
	pg := clustertest.StartPostgres(t, clustertest.PostgresOptions{Settings: map[string]string{"fsync": "off"}})
	replicas := []*hubProc{startHubProc(t, bin, "A", nc, pg), startHubProc(t, bin, "B", nc, pg)}
	v1, v2 := testBundle(t, "", ""), testBundle(t, "v2", "")
	answers := startAnswerers(t, nc.Nodes[0].MQTTURL(), v1.Hash(), gws)
	for _, b := range []*bundle.Bundle{v1, v2} {
		enc, _ := b.Encode()
		if code := procCall(t, replicas[0], http.MethodPost, "/api/bundles", enc, nil); code/100 != 2 {
			t.Fatalf("push: %d", code)
		}
	}
	eventually := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(90 * time.Second); !cond(); time.Sleep(50 * time.Millisecond) { // other processes: polled
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting until %s", what)
			}
		}
	}
	eventually("every gateway's configuration is known", func() bool {
		var f struct {
			Gateways []FleetGateway `json:"gateways"`
		}
		if procCall(t, replicas[0], http.MethodGet, "/api/fleet", nil, &f) != http.StatusOK {
			return false
		}
		n := 0
		for _, g := range f.Gateways {
			if g.Config != nil && g.Config.Hash == v1.Hash() {
				n++
			}
		}
		return n == len(gws)
	})
	spec, _ := json.Marshal(RolloutSpec{Canary: 1, Factor: 2, Soak: driver.Duration(time.Second), Resend: driver.Duration(500 * time.Millisecond),
		GatewayTimeout: driver.Duration(10 * time.Second), Deadline: driver.Duration(3 * time.Minute)})
	var lead, other *hubProc
	var r RolloutView
	eventually("the replica driving the rollouts takes one", func() bool {
		for i, h := range replicas {
			if procCall(t, h, http.MethodPost, "/api/rollouts", spec, &r) == http.StatusCreated {
				lead, other = h, replicas[1-i]
				return true
			}
		}
		return false
	})
	eventually("the canary is healthy", func() bool {
		var v RolloutView
		return procCall(t, lead, http.MethodGet, "/api/rollouts/"+r.ID, nil, &v) == http.StatusOK && v.Counts[TargetHealthy] >= 1
	})
	t.Log(lead.kill(t))
	var v RolloutView
	eventually("the other replica completed the rollout", func() bool {
		return procCall(t, other, http.MethodGet, "/api/rollouts/"+r.ID, nil, &v) == http.StatusOK && v.State != RolloutRunning
	})
	if v.State != RolloutCompleted || v.Counts[TargetHealthy] != len(gws) {
		t.Fatalf("rollout %s (%s) %v, want completed, every gateway healthy", v.State, v.Reason, v.Counts)
	}
	offeredOnce(t, answers, v.Version)
}
