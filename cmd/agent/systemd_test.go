package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sortie-edge/sortie/internal/clustertest"
	"github.com/sortie-edge/sortie/internal/testkit"
)

// The shipped systemd units are valid for systemd itself (every key
// known, every command present), and their agent commands parse: the
// gateway's (the agent and its backup) and the hub's (the hub, and a
// node of its cluster's NATS).
func TestSystemdUnits(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("systemd-analyze not found (.ci/run installs systemd)")
		}
		t.Skip("systemd-analyze not found")
	}
	units, err := filepath.Glob(testkit.RepoPath("configs/systemd") + "/*")
	if err != nil || len(units) != 5 {
		t.Fatalf("units %v (%v), want the agent, the backup service and its timer, the hub and a NATS node", units, err)
	}
	natsServer, err := clustertest.NATSServer()
	if err != nil {
		t.Fatalf("nats-server for its unit: %v", err)
	}
	dir := t.TempDir()
	var files []string
	for _, u := range units {
		b, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		// systemd checks that each command exists: point them at the
		// binary under test.
		s := strings.NewReplacer("/usr/local/bin/sortie-agent", agentBin, "/usr/local/bin/sortie-hub", hubBin,
			"/usr/local/bin/nats-server", natsServer).Replace(string(b))
		f := filepath.Join(dir, filepath.Base(u))
		if err := os.WriteFile(f, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	// It exits 0 on some mistakes (an unknown value is "ignored"), so any
	// output is a failure.
	out, err := exec.Command(sa, append([]string{"verify", "--man=no"}, files...)...).CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	// The service's own pre-start check, on the shipped config.
	if out, err := exec.Command(agentBin, "validate", "-config", testkit.RepoPath("configs/agent.toml")).CombinedOutput(); err != nil {
		t.Fatalf("agent validate: %v\n%s", err, out)
	}
}
