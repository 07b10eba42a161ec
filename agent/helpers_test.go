package agent

import (
	"testing"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/scenes"
)

// parseScenes loads the shipped device registry and parses the scenes
// in src (named name in errors) against it.
func parseScenes(t testing.TB, src, name string) (*devices.Registry, *scenes.Catalog) {
	t.Helper()
	reg, err := devices.LoadRegistry(testkit.RepoPath("configs/devices.toml"))
	if err != nil {
		t.Fatal(err)
	}
	cat, err := scenes.Parse([]byte(src), name, reg)
	if err != nil {
		t.Fatal(err)
	}
	return reg, cat
}
