package agent

import (
	"context"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/scenes"
)

// repoPath resolves a path from the repository root.
func repoPath(t testing.TB, p string) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", p)
}

// runUntilCleanup runs a component's Run in a goroutine; the test's
// cleanup ends it and fails the test on the error it returns.
func runUntilCleanup(t testing.TB, name string, run func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("%s: %v", name, err)
		}
	})
}

// parseScenes loads the shipped device registry and parses the scenes
// in src (named name in errors) against it.
func parseScenes(t testing.TB, src, name string) (*devices.Registry, *scenes.Catalog) {
	t.Helper()
	reg, err := devices.LoadRegistry(repoPath(t, "configs/devices.toml"))
	if err != nil {
		t.Fatal(err)
	}
	cat, err := scenes.Parse([]byte(src), name, reg)
	if err != nil {
		t.Fatal(err)
	}
	return reg, cat
}
