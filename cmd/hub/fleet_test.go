package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sortie-edge/sortie/hub"
)

// hubCLI runs a hub command line and returns its exit code and output.
func hubCLI(args ...string) (int, string) {
	var out strings.Builder
	code := run(context.Background(), args, nil, &out, &out)
	return code, out.String()
}

// TestBundleAndRolloutCommandsDriveARunningHub: push (refused when the
// agent's rules refuse it), list, tag, and a rollout started, shown and
// aborted, all through the API of a hub running in this process.
func TestBundleAndRolloutCommandsDriveARunningHub(t *testing.T) {
	pw, err := hub.HashPassword("gateway-password")
	if err != nil {
		t.Fatal(err)
	}
	h := startHub(t, writeConfig(t, "data_dir = \"data\"\n[http]\ntoken = \"0123456789abcdef\"\n[log]\nlevel = \"warn\"\n[gateways]\nhome = \""+pw+"\"\n"))
	t.Setenv(tokenEnv, "0123456789abcdef")
	api := "http://" + h.http
	configs := filepath.Join("..", "..", "configs")

	code, out := hubCLI("bundle", "push", "-hub", api, configs)
	if code != 0 || !strings.Contains(out, "as version 1 of group default") {
		t.Fatalf("push: exit %d\n%s", code, out)
	}
	if code, out = hubCLI("bundle", "push", "-hub", api, configs); code != 0 || !strings.Contains(out, "already the latest") {
		t.Fatalf("push again: exit %d\n%s", code, out)
	}
	bad := t.TempDir()
	if err := os.MkdirAll(filepath.Join(bad, "scenes"), 0o755); err != nil {
		t.Fatal(err)
	}
	reg, _ := os.ReadFile(filepath.Join(configs, "devices.toml"))
	_ = os.WriteFile(filepath.Join(bad, "devices.toml"), reg, 0o644)
	_ = os.WriteFile(filepath.Join(bad, "scenes", "typo.toml"), []byte("[[scene]]\nname = \"typo\"\n[[scene.step]]\ndevice = \"no_such_lamp\"\naction = \"turn_on\"\n"), 0o644)
	if code, out = hubCLI("bundle", "push", "-hub", api, bad); code == 0 || !strings.Contains(out, "no_such_lamp") {
		t.Fatalf("push of a bundle with an unknown device: exit %d\n%s", code, out)
	}
	if code, out = hubCLI("bundle", "list", "-hub", api); code != 0 || strings.Count(out, "\n") != 2 || !strings.Contains(out, "push") {
		t.Fatalf("list: exit %d\n%s", code, out)
	}
	if code, out = hubCLI("tag", "-hub", api, "home", "lab"); code != 0 || !strings.Contains(out, "home: tags lab") {
		t.Fatalf("tag: exit %d\n%s", code, out)
	}
	if code, out = hubCLI("rollout", "start", "-hub", api, "-tag", "lab", "-waves", "50,100"); code != 0 || !strings.Contains(out, "rollout r-1: running") {
		t.Fatalf("rollout start: exit %d\n%s", code, out)
	}
	if code, out = hubCLI("rollout", "status", "-hub", api, "-gateways", "r-1"); code != 0 || !strings.Contains(out, "home") {
		t.Fatalf("rollout status: exit %d\n%s", code, out)
	}
	if code, out = hubCLI("rollout", "abort", "-hub", api, "r-1"); code != 0 || !strings.Contains(out, "aborted (aborted by the operator)") {
		t.Fatalf("rollout abort: exit %d\n%s", code, out)
	}
	if code, out = hubCLI("rollout", "pause", "-hub", api, "r-1"); code == 0 || !strings.Contains(out, "invalid_request") {
		t.Fatalf("pause of an aborted rollout: exit %d, want refused\n%s", code, out)
	}
	if code, out = hubCLI("group", "-hub", api, "-drift", "revert", "default"); code != 0 || !strings.Contains(out, "drift policy revert") {
		t.Fatalf("group: exit %d\n%s", code, out)
	}
}
