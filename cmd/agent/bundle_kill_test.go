package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/bundle"
	"github.com/sortie-edge/sortie/internal/mqttc"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/uplink"
)

// applyKills is the length of the apply SIGKILL loop: a dozen in make test
// (about a second each, and cmd/agent's tests share one time bound), a
// hundred and more on demand (go test ./cmd/agent -run SIGKILLDuringApply
// -apply-kills 100).
var applyKills = flag.Int("apply-kills", 12, "SIGKILLs in TestSIGKILLDuringApplyLeavesExactlyTheOldOrTheNewBundle")

// TestSIGKILLDuringApplyLeavesExactlyTheOldOrTheNewBundle: the agent
// binary is SIGKILLed at a random moment of an apply (its record of the
// bundle received, validation, staging, the switch, the trial, the
// commit), over and over, each time applying the bundle it does not
// run: by "agent apply" on even turns, as a hub's offer on odd ones.
// Every restart runs exactly the bundle it ran before the apply or the
// one applied, and says what became of the apply: kept only if it was
// seen healthy before the kill (then it runs), otherwise reverted or
// rejected because the agent restarted (and the old one runs); a hub's
// offer gets that outcome on its bundle status topic once the gateway
// is back.
func TestSIGKILLDuringApplyLeavesExactlyTheOldOrTheNewBundle(t *testing.T) {
	if testing.Short() {
		t.Skip("SIGKILLs the agent a hundred times")
	}
	// Its own broker, home and agent: it runs beside the other long loops.
	t.Parallel()
	hub := startStatusHub(t, "applykill")
	e := newGatewayEnv(t, "applykill", fmt.Sprintf("[bundles]\nsoak = \"150ms\"\n[hub]\nurl = %q\nheartbeat = \"1s\"\n", hub.url))
	files, err := bundle.FromFiles(testkit.RepoPath("configs/devices.toml"), testkit.RepoPath("configs/scenes"), bundle.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	// The other bundle: go_home described anew.
	dir := filepath.Join(t.TempDir(), "edited")
	if err := files.WriteDir(dir); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(dir, "scenes", "go_home.toml")
	src, err := os.ReadFile(home)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, home, strings.Replace(string(src), "[[scene]]\n", "[[scene]]\n# edited by a bundle\n", 1))
	edited, err := bundle.FromDir(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	filesDir := filepath.Join(t.TempDir(), "files")
	if err := files.WriteDir(filesDir); err != nil {
		t.Fatal(err)
	}
	dirOf := map[string]string{files.Hash(): filesDir, edited.Hash(): dir}
	bundleOf := map[string]*bundle.Bundle{files.Hash(): files, edited.Hash(): edited}
	other := map[string]string{files.Hash(): edited.Hash(), edited.Hash(): files.Hash()}

	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	outcomes := map[string]int{}
	switched, reported := 0, 0
	started := time.Now()
	p := e.start()
	running := config(t, e).Current.Hash
	for i := range *applyKills {
		target, began := other[running], time.Now()
		version := uint64(i + 1)
		var cmd *exec.Cmd
		if i%2 == 0 {
			cmd = exec.Command(agentBin, "apply", "-addr", p.http, dirOf[target])
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
		} else {
			hub.connected(t, started)
			hub.offer(t, fmt.Sprintf("offer-%d", i), version, bundleOf[target])
		}
		time.Sleep(time.Duration(rng.IntN(600)) * time.Millisecond)
		p.stop(t, syscall.SIGKILL)
		if cmd != nil {
			_ = cmd.Wait() // its answer, if any, is the agent's to give again below
		}
		started = time.Now()
		p = e.start()
		c := config(t, e)
		now := c.Current.Hash
		if now != running && now != target {
			t.Fatalf("kill %d: runs %s, neither the old %s nor the new %s", i, bundle.Short(now), bundle.Short(running), bundle.Short(target))
		}
		if c.Trial != nil {
			t.Fatalf("kill %d: a start left a bundle on trial: %+v", i, c.Trial)
		}
		if l := c.Last; l != nil && l.Hash == target && l.At.After(began) {
			outcomes[l.Status+"/"+l.Reason]++
			switch l.Status {
			case uplink.BundleHealthy:
				if now != target {
					t.Fatalf("kill %d: kept %s but runs %s", i, bundle.Short(target), bundle.Short(now))
				}
			case uplink.BundleReverted, uplink.BundleRejected:
				if now != running || l.Reason != uplink.ReasonRestarted {
					t.Fatalf("kill %d: %s (%s), running %s", i, l.Status, l.Reason, bundle.Short(now))
				}
			default:
				t.Fatalf("kill %d: the apply's outcome is %q after the restart, not a final one", i, l.Status)
			}
			if i%2 == 1 {
				if got := hub.final(t, version); got.Status != l.Status || got.Current != now {
					t.Fatalf("kill %d: the hub was told %s (now %s), the gateway says %s, running %s", i, got.Status, bundle.Short(got.Current), l.Status, bundle.Short(now))
				}
				reported++
			}
		} else {
			outcomes["not received"]++
		}
		if now != running {
			switched++
		}
		running = now
	}
	if code := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit %d on SIGTERM after the loop", code)
	}
	t.Logf("%d SIGKILLs during an apply: %d ended on the new bundle, %d on the old; outcomes after restart: %v; %d hub offers' outcomes reached the hub",
		*applyKills, switched, *applyKills-switched, outcomes, reported)
}

// statusHub plays the hub for bundles: it offers them on a gateway's
// control topic and collects the gateway's bundle statuses, on a broker
// of its own in the test process.
type statusHub struct {
	url, gw string
	client  *mqttc.Client
	topics  uplink.Topics

	mu       sync.Mutex
	statuses map[uint64][]uplink.BundleStatus
	beat     time.Time // the latest heartbeat's arrival
}

func startStatusHub(t *testing.T, gw string) *statusHub {
	t.Helper()
	b := brokertest.Start(t)
	h := &statusHub{url: b.URL(), gw: gw, statuses: map[uint64][]uplink.BundleStatus{}}
	c, err := mqttc.New(mqttc.Options{Broker: b.URL(), ClientID: "test-hub", Ordered: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if _, err := c.SubscribeQoS(h.topics.BundleStatus(gw), 1, func(_ string, p []byte) {
		s, err := uplink.DecodeBundleStatus(p)
		if err != nil {
			t.Errorf("bundle status: %v", err)
			return
		}
		h.mu.Lock()
		h.statuses[s.Version] = append(h.statuses[s.Version], s)
		h.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SubscribeQoS(h.topics.Heartbeat(gw), 0, func(string, []byte) {
		h.mu.Lock()
		h.beat = time.Now()
		h.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.Connect(context.Background()); err != nil {
		t.Fatal(err)
	}
	h.client = c
	return h
}

// connected waits up to 15 s for a heartbeat that arrived after since:
// one follows every connection of the gateway, and an offer sent before
// it is lost (the gateway takes controls at QoS 0, clean session).
func (h *statusHub) connected(t *testing.T, since time.Time) {
	t.Helper()
	testkit.Eventually(t, 15*time.Second, "the gateway's connection to the hub", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.beat.After(since)
	})
}

func (h *statusHub) offer(t *testing.T, id string, version uint64, b *bundle.Bundle) {
	t.Helper()
	enc, err := b.Encode()
	if err != nil {
		t.Fatal(err)
	}
	msg, err := json.Marshal(uplink.Control{ID: id, Action: uplink.ActionBundle, Bundle: &uplink.BundleOffer{Hash: b.Hash(), Version: version, Bundle: enc}})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.client.Publish(h.topics.Control(h.gw), msg, false, 1); err != nil {
		t.Fatal(err)
	}
}

// final waits up to 15 s for a final status of version: what the
// gateway says again on every connection.
func (h *statusHub) final(t *testing.T, version uint64) uplink.BundleStatus {
	t.Helper()
	var last uplink.BundleStatus
	testkit.Until(t, 15*time.Second, func() error {
		h.mu.Lock()
		ss := h.statuses[version]
		h.mu.Unlock()
		if n := len(ss); n > 0 {
			switch last = ss[n-1]; last.Status {
			case uplink.BundleHealthy, uplink.BundleReverted, uplink.BundleRejected:
				return nil
			}
		}
		return fmt.Errorf("no final status of version %d reached the hub: %+v", version, ss)
	})
	return last
}

// config is what the running agent of e says it runs.
func config(t *testing.T, e *testEnv) api.ConfigInfo {
	t.Helper()
	var c api.ConfigInfo
	if code := e.get("/api/config", &c); code != 200 {
		raw, _ := json.Marshal(c)
		t.Fatalf("GET /api/config: %d %s", code, raw)
	}
	return c
}

// TestHandEditedFilesShowInTheHash: a gateway on its config files
// reports the hash of the bundle they make; a hand edit shows at once
// in "agent config" (the files no longer make what runs) and, after the
// restart that puts it in force, as the hash the agent runs and reports.
func TestHandEditedFilesShowInTheHash(t *testing.T) {
	e := newGatewayEnv(t, "drift", "")
	scenes := filepath.Join(t.TempDir(), "scenes")
	if err := os.MkdirAll(scenes, 0o755); err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(testkit.RepoPath("configs/scenes/go_home.toml"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(scenes, "go_home.toml"), string(src))
	e.scenes = scenes
	e.writeConfig("embedded = false\nurl = \""+e.broker.URL()+"\"\n", "")
	p := e.start()
	before := config(t, e)
	want, err := bundle.FromFiles(testkit.RepoPath("configs/devices.toml"), scenes, bundle.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	if before.Current.Hash != want.Hash() || before.Current.Source != uplink.SourceFiles || before.FilesHash != "" {
		t.Fatalf("on its files: %+v, want %s", before, bundle.Short(want.Hash()))
	}
	writeFile(t, filepath.Join(scenes, "go_home.toml"), string(src)+"\n# a hand edit\n")
	edited := config(t, e)
	if edited.Current.Hash != before.Current.Hash || edited.FilesHash == "" || edited.FilesHash == before.Current.Hash {
		t.Fatalf("after the edit: %+v", edited)
	}
	out, err := exec.Command(agentBin, "config", "-addr", p.http).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "edited since the start") {
		t.Fatalf("agent config: %v\n%s", err, out)
	}
	p.stop(t, syscall.SIGTERM)
	e.start()
	if after := config(t, e); after.Current.Hash != edited.FilesHash {
		t.Fatalf("after the restart runs %s, want the edited files' %s", bundle.Short(after.Current.Hash), bundle.Short(edited.FilesHash))
	}
}
