package agent_test

import (
	"context"
	"testing"

	"github.com/sortie-edge/sortie/agent/agenttest"
)

// TestHeartbeatCarriesScenesWithParams pins what the hub's scene picker
// reads: every scene, with the trigger parameters it takes and whether
// each is required.
func TestHeartbeatCarriesScenesWithParams(t *testing.T) {
	reg, cat := agenttest.Scenes(t, "configs/devices.toml", traceScenes)
	a := startAgent(t, t.TempDir(), cat, reg, nil)
	hb := a.Heartbeat(context.Background())
	var names []string
	for _, s := range hb.Scenes {
		names = append(names, s.Name)
		if s.Name == "dimmed" && (len(s.Params) != 1 || s.Params[0].Name != "level" || !s.Params[0].Required) {
			t.Errorf("dimmed params = %+v, want level, required", s.Params)
		}
		if s.Name == "quick" && len(s.Params) != 0 {
			t.Errorf("quick params = %+v, want none", s.Params)
		}
	}
	if len(names) != 3 {
		t.Errorf("heartbeat scenes = %v, want the catalog's three", names)
	}
}
