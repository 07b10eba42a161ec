package main

import (
	"bytes"
	"compress/gzip"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sortie-edge/sortie/internal/testkit"
)

// TestARM64BuildRunsUnderQEMU cross-compiles the agent as `make cross`
// does, holds it to its budget (a gateway's flash and an update's
// download; README, Performance) and runs it under qemu-aarch64: the binary starts,
// reports its version and validates the shipped configuration.
func TestARM64BuildRunsUnderQEMU(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-compiles")
	}
	qemu := needTool(t, "qemu-aarch64", "qemu-user")
	bin := filepath.Join(t.TempDir(), "agent-arm64")
	build := exec.Command("go", "build", "-trimpath", "-tags", "nethttpomithttp2,nosim", "-ldflags",
		"-s -w -X main.Version=qemu-test -X main.Revision=0123456789abcdef0123456789abcdef01234567", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=arm64")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("cross build: %v\n%s", err, out)
	}
	// The budget of issue 28: 12 MiB stripped, and 5 MiB gzip-compressed,
	// the size an over-the-air update moves. As `make cross` builds it:
	// without net/http's HTTP/2 (its API speaks HTTP/1.1) and without the
	// demo's simulator (-tags nosim), which a gateway does not run.
	const budget, gzBudget = 12 << 20, 5 << 20
	raw, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestCompression) // a valid level: no error
	if _, err := zw.Write(raw); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if len(raw) > budget || gz.Len() > gzBudget {
		t.Errorf("the arm64 agent is %d B (budget %d B), %d B gzip-compressed (budget %d B)", len(raw), budget, gz.Len(), gzBudget)
	} else {
		t.Logf("arm64 agent: %d B (%d B under %d B), %d B gzip-compressed (%d B under 5 MiB)", len(raw), budget-len(raw), budget, gz.Len(), gzBudget-gz.Len())
	}
	// The file grows by whole 64 KiB pages when a segment crosses one:
	// what is left of the code's and the read-only data's last pages is
	// how much either may grow before the file jumps.
	if f, err := elf.NewFile(bytes.NewReader(raw)); err == nil {
		for _, p := range f.Progs {
			if p.Type != elf.PT_LOAD || p.Flags&elf.PF_W != 0 || p.Align == 0 {
				continue
			}
			what := "read-only data"
			if p.Flags&elf.PF_X != 0 {
				what = "code"
			}
			t.Logf("arm64 agent: %s segment %d B, %d B left in its last page", what, p.Filesz, (p.Align-p.Filesz%p.Align)%p.Align)
		}
	}
	out, err := exec.Command(qemu, bin, "version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "qemu-test") {
		t.Fatalf("arm64 agent version: %v\n%s", err, out)
	}
	out, err = exec.Command(qemu, bin, "validate", "-config", testkit.RepoPath("configs/agent.toml")).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ok:") {
		t.Fatalf("arm64 agent validate: %v\n%s", err, out)
	}
	t.Logf("arm64 agent: %s", strings.TrimSpace(string(out)))
}
