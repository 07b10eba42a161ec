package main

import (
	"encoding/json"
	"flag"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/bundle"
	"github.com/sortie-edge/sortie/uplink"
)

// applyKills is the length of the apply SIGKILL loop.
var applyKills = flag.Int("apply-kills", 100, "SIGKILLs in TestSIGKILLDuringApplyLeavesExactlyTheOldOrTheNewBundle")

// TestSIGKILLDuringApplyLeavesExactlyTheOldOrTheNewBundle: the agent
// binary is SIGKILLed at a random moment of "agent apply" (its record
// of the bundle received, validation, staging, the switch, the trial,
// the commit), over and over, each time applying the bundle it does not
// run. Every restart runs exactly the bundle it ran before the apply or
// the one applied, and says what became of the apply: kept only if it
// was seen healthy before the kill (then it runs), otherwise reverted or
// rejected because the agent restarted (and the old one runs).
func TestSIGKILLDuringApplyLeavesExactlyTheOldOrTheNewBundle(t *testing.T) {
	if testing.Short() {
		t.Skip("SIGKILLs the agent a hundred times")
	}
	e := newGatewayEnv(t, "applykill", "[bundles]\nsoak = \"150ms\"\n")
	files, err := bundle.FromFiles(repoPath(t, "configs/devices.toml"), repoPath(t, "configs/scenes"), bundle.Settings{})
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
	other := map[string]string{files.Hash(): edited.Hash(), edited.Hash(): files.Hash()}

	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	outcomes := map[string]int{}
	switched := 0
	p := e.start()
	running := config(t, e).Current.Hash
	for i := range *applyKills {
		target, began := other[running], time.Now()
		cmd := exec.Command(agentBin, "apply", "-addr", p.http, dirOf[target])
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(rng.IntN(600)) * time.Millisecond)
		p.stop(t, syscall.SIGKILL)
		_ = cmd.Wait() // its answer, if any, is the agent's to give again below
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
	t.Logf("%d SIGKILLs during an apply: %d ended on the new bundle, %d on the old; outcomes after restart: %v", *applyKills, switched, *applyKills-switched, outcomes)
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
	src, err := os.ReadFile(repoPath(t, "configs/scenes/go_home.toml"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(scenes, "go_home.toml"), string(src))
	e.scenes = scenes
	e.writeConfig("embedded = false\nurl = \""+e.broker.URL()+"\"\n", "")
	p := e.start()
	before := config(t, e)
	want, err := bundle.FromFiles(repoPath(t, "configs/devices.toml"), scenes, bundle.Settings{})
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
