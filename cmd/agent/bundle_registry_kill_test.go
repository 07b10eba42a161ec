package main

import (
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/bundle"
	"github.com/sortie-edge/sortie/internal/testkit"
)

// TestSIGKILLDuringARegistrySwapLeavesTheOldOrTheNewRegistry: the
// agent binary is SIGKILLed at a random moment of "agent apply" of a
// bundle whose devices.toml differs from the one that runs (a device
// added, or taken away again), over and over. Every restart runs
// exactly the old or the new bundle, and its device layer runs that
// bundle's registry: the device is listed if and only if the bundle
// that runs names it.
func TestSIGKILLDuringARegistrySwapLeavesTheOldOrTheNewRegistry(t *testing.T) {
	if testing.Short() {
		t.Skip("SIGKILLs the agent in a loop")
	}
	// Its own broker, home and agent: it runs beside the other long loops.
	t.Parallel()
	e := newGatewayEnv(t, "regkill", "[bundles]\nsoak = \"150ms\"\n")
	files, err := bundle.FromFiles(testkit.RepoPath("configs/devices.toml"), testkit.RepoPath("configs/scenes"), bundle.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	dirs := map[string]string{}
	bundles := make([]*bundle.Bundle, 2)
	for i, extra := range []string{"", "\n[[devices]]\nid = \"porch-light\"\ntype = \"light\"\nname = \"Porch light\"\n"} {
		dir := filepath.Join(t.TempDir(), "bundle")
		if err := files.WriteDir(dir); err != nil {
			t.Fatal(err)
		}
		reg := filepath.Join(dir, bundle.RegistryFile)
		data, err := os.ReadFile(reg)
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, reg, string(data)+extra)
		if bundles[i], err = bundle.FromDir(dir, ""); err != nil {
			t.Fatal(err)
		}
		dirs[bundles[i].Hash()] = dir
	}
	withPorch := bundles[1].Hash()
	other := map[string]string{bundles[0].Hash(): withPorch, withPorch: bundles[0].Hash()}

	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	p := e.start()
	running := config(t, e).Current.Hash
	switched := 0
	for i := range *applyKills {
		target := other[running]
		cmd := exec.Command(agentBin, "apply", "-addr", p.http, dirs[target])
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// A random moment of the apply, not a synchronisation: the kill
		// lands before, during or after the swap.
		time.Sleep(time.Duration(rng.IntN(800)) * time.Millisecond)
		p.stop(t, syscall.SIGKILL)
		_ = cmd.Wait() // killed with its agent, or answered: the restart says what runs
		p = e.start()
		now := config(t, e).Current.Hash
		if now != running && now != target {
			t.Fatalf("kill %d: runs %s, neither the old %s nor the new %s", i, bundle.Short(now), bundle.Short(running), bundle.Short(target))
		}
		var list api.DeviceList
		if code := e.get("/api/devices", &list); code != 200 {
			t.Fatalf("kill %d: GET /api/devices: %d", i, code)
		}
		listed := slices.ContainsFunc(list.Devices, func(d api.DeviceItem) bool { return d.ID == "porch-light" })
		if listed != (now == withPorch) {
			t.Fatalf("kill %d: runs %s (porch light in it: %v) but the device layer lists it: %v", i, bundle.Short(now), now == withPorch, listed)
		}
		if now != running {
			switched++
		}
		running = now
	}
	if code := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit %d on SIGTERM after the loop", code)
	}
	t.Logf("%d SIGKILLs during a registry swap: %d ended on the new bundle, %d on the old", *applyKills, switched, *applyKills-switched)
}
