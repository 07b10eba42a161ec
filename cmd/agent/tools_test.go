package main

import (
	"os"
	"os/exec"
	"testing"
)

// needTool returns the path of an external tool a test relies on. Without
// it the test is skipped on a developer machine but fails in CI, where
// .ci/run installs it: a green CI must mean the check ran.
func needTool(t *testing.T, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s not found; .ci/run should have installed Debian's %s package", name, pkg)
	}
	t.Skipf("%s not found (apt-get install %s)", name, pkg)
	return ""
}
