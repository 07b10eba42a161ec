package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestARM64BuildRunsUnderQEMU cross-compiles the agent as `make cross`
// does, holds it to its 10 MiB budget (a gateway's flash; README,
// Performance) and runs it under qemu-aarch64: the binary starts,
// reports its version and validates the shipped configuration.
func TestARM64BuildRunsUnderQEMU(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-compiles")
	}
	qemu := needTool(t, "qemu-aarch64", "qemu-user")
	bin := filepath.Join(t.TempDir(), "agent-arm64")
	build := exec.Command("go", "build", "-trimpath", "-ldflags",
		"-s -w -X main.Version=qemu-test -X main.Revision=0123456789abcdef0123456789abcdef01234567", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=arm64")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("cross build: %v\n%s", err, out)
	}
	const budget = 10 << 20
	if fi, err := os.Stat(bin); err != nil {
		t.Fatal(err)
	} else if fi.Size() > budget {
		t.Errorf("the arm64 agent is %d B, %d B over its 10 MiB budget", fi.Size(), fi.Size()-budget)
	} else {
		t.Logf("arm64 agent: %d B, %d B under the 10 MiB budget", fi.Size(), budget-fi.Size())
	}
	out, err := exec.Command(qemu, bin, "version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "qemu-test") {
		t.Fatalf("arm64 agent version: %v\n%s", err, out)
	}
	out, err = exec.Command(qemu, bin, "validate", "-config", repoPath(t, "configs/agent.toml")).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ok:") {
		t.Fatalf("arm64 agent validate: %v\n%s", err, out)
	}
	t.Logf("arm64 agent: %s", strings.TrimSpace(string(out)))
}
