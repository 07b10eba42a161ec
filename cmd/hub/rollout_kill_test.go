package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/agent/agenttest"
	"github.com/sortie-edge/sortie/broker/passwd"
	"github.com/sortie-edge/sortie/bundle"
	"github.com/sortie-edge/sortie/hub"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/simulator"
)

var hubKills = flag.Int("hub-kills", 4, "SIGKILLs of the hub during TestSIGKILLOfTheHubMidRollout")

// lightsBundle is configs/devices.toml and one scene turning the
// living-room light on (and, with kitchen, the kitchen's).
func lightsBundle(t *testing.T, kitchen bool) *bundle.Bundle {
	t.Helper()
	reg, err := os.ReadFile(filepath.Join("..", "..", "configs", "devices.toml"))
	if err != nil {
		t.Fatal(err)
	}
	scene := "[[scene]]\nname = \"lights\"\n[[scene.step]]\ndevice = \"living-light\"\naction = \"turn_on\"\n"
	if kitchen {
		scene += "[[scene.step]]\ndevice = \"kitchen-light\"\naction = \"turn_on\"\n"
	}
	b, err := bundle.New("", []bundle.File{{Path: bundle.RegistryFile, Data: reg}, {Path: "scenes/lights.toml", Data: []byte(scene)}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// hubProcess is the hub binary, restarted on the same addresses.
type hubProcess struct {
	t          *testing.T
	bin, cfg   string
	httpAddr   string
	cmd        *exec.Cmd
	logs       *testkit.SyncBuffer
	starts     int
	token      string
	httpClient *http.Client
}

func (h *hubProcess) start() {
	h.t.Helper()
	h.cmd = exec.Command(h.bin, "run", "-config", h.cfg)
	h.cmd.Stdout, h.cmd.Stderr = h.logs, h.logs
	if err := h.cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	h.starts++
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := h.httpClient.Get("http://" + h.httpAddr + "/readyz")
		if err == nil {
			_ = res.Body.Close() // the status is all
			if res.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("hub not ready (start %d): %v\n%s", h.starts, err, h.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (h *hubProcess) kill() {
	_ = h.cmd.Process.Signal(syscall.SIGKILL)
	_ = h.cmd.Wait() // killed: its exit status says so
}

func (h *hubProcess) rollout(id string) (hub.RolloutView, error) {
	req, _ := http.NewRequest(http.MethodGet, "http://"+h.httpAddr+"/api/rollouts/"+id, nil)
	req.Header.Set("Authorization", "Bearer "+h.token)
	res, err := h.httpClient.Do(req)
	if err != nil {
		return hub.RolloutView{}, err
	}
	defer func() { _ = res.Body.Close() }()
	var v hub.RolloutView
	if res.StatusCode != http.StatusOK {
		return v, fmt.Errorf("GET rollout: %s", res.Status)
	}
	return v, json.NewDecoder(res.Body).Decode(&v)
}

// TestSIGKILLOfTheHubMidRollout: the hub binary is SIGKILLed at random
// moments of a rollout to six real agents and started again each time;
// the rollout resumes from its bbolt file and ends with every gateway
// healthy on the new bundle, none of them offered the release under
// more than one control ID (the hub writes the ID before it sends, and
// sends it again unchanged), whatever moment the kill fell on.
func TestSIGKILLOfTheHubMidRollout(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the hub binary and kills it")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "hub")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		t.Fatalf("build the hub: %v", err)
	}
	gws := []string{"gw-0", "gw-1", "gw-2", "gw-3", "gw-4", "gw-5"}
	brokerAddr, httpAddr := testkit.FreeAddr(t), testkit.FreeAddr(t)
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "data_dir = %q\n[http]\nlisten = %q\ntoken = \"0123456789abcdef\"\n[broker]\nlisten = %q\n[log]\nlevel = \"warn\"\n[gateways]\n",
		filepath.Join(dir, "data"), httpAddr, brokerAddr)
	for _, gw := range gws {
		h, err := passwd.HashCost("pw-"+gw, 1000)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&cfg, "%s = %q\n", gw, h)
	}
	cfgPath := filepath.Join(dir, "hub.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	h := &hubProcess{t: t, bin: bin, cfg: cfgPath, httpAddr: httpAddr, logs: &testkit.SyncBuffer{}, token: "0123456789abcdef",
		httpClient: &http.Client{Timeout: 5 * time.Second}}
	h.start()
	t.Cleanup(h.kill)

	v1, v2 := lightsBundle(t, false), lightsBundle(t, true)
	for _, gw := range gws {
		startAgent(t, "tcp://"+brokerAddr, gw, v1)
	}
	t.Setenv(tokenEnv, h.token)
	api := "-hub=http://" + httpAddr
	for i, b := range []*bundle.Bundle{v1, v2} {
		d := filepath.Join(dir, fmt.Sprintf("b%d", i))
		if err := b.WriteDir(d); err != nil {
			t.Fatal(err)
		}
		if code, out := hubCLI("bundle", "push", api, d); code != 0 {
			t.Fatalf("push: %s", out)
		}
	}
	// The pre-flight check needs every gateway's configuration: wait
	// until each reported (the heartbeat every 200 ms).
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, out := hubCLI("fleet", api)
		if code == 0 && strings.Count(out, bundle.Short(v1.Hash())) == len(gws) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateways never all reported:\n%s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	code, out := hubCLI("rollout", "start", api, "-canary", "1", "-factor", "2", "-soak", "300ms", "-gateway-soak", "1s",
		"-resend", "500ms", "-gateway-timeout", "20s", "-deadline", "2m")
	if code != 0 || !strings.Contains(out, "rollout r-1") {
		t.Fatalf("rollout start: %s", out)
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d (kills at random moments)", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	var v hub.RolloutView
	for kills := 0; ; {
		var err error
		v, err = h.rollout("r-1")
		if err != nil {
			t.Fatalf("rollout: %v\n%s", err, h.logs.String())
		}
		if v.State != hub.RolloutRunning {
			break
		}
		if kills < *hubKills {
			time.Sleep(time.Duration(rng.IntN(1500)) * time.Millisecond)
			h.kill()
			kills++
			h.start()
			continue
		}
		time.Sleep(50 * time.Millisecond)
	}
	if v.State != hub.RolloutCompleted || v.Counts[hub.TargetHealthy] != len(gws) {
		t.Fatalf("rollout %s (%s) %v after %d starts, want completed, all healthy\n%s", v.State, v.Reason, v.Counts, h.starts, h.logs.String())
	}
	for _, tg := range v.Gateways {
		if tg.Offers != 1 {
			t.Errorf("%s offered under %d control IDs, want 1 (sends %d)", tg.Gateway, tg.Offers, tg.Sends)
		}
	}
	t.Logf("%d hub starts; offers sent, resends included: %d", h.starts, sends(v))
}

func sends(v hub.RolloutView) int {
	n := 0
	for _, tg := range v.Gateways {
		n += tg.Sends
	}
	return n
}

// startAgent runs a real agent for gateway id in this process (its own
// embedded broker, bbolt store and simulated lights), linked to the hub.
func startAgent(t *testing.T, hubURL, id string, files *bundle.Bundle) {
	t.Helper()
	reg, cat := agenttest.Bundle(t, files)
	agenttest.Start(t, agent.Options{
		Gateway: id, Registry: reg, Catalog: cat, Version: "v1.0.0", QuietMissions: true,
		Driver: agent.DriverOptions{StopGrace: time.Second},
		Home: &agent.HomeConfig{Devices: []simulator.DeviceConfig{
			{ID: "living-light", Type: simulator.TypeLight}, {ID: "kitchen-light", Type: simulator.TypeLight}}},
		Hub:     &agent.HubOptions{URL: hubURL, Password: "pw-" + id, Heartbeat: 200 * time.Millisecond},
		Bundles: &agent.BundleOptions{Files: files, Soak: time.Second, Confirm: 30 * time.Second},
	})
}
