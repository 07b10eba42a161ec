//go:build !nosim

package agentconf

import (
	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/simulator"
)

// LoadHome reads a simulated home for [simulator] home (the demo).
func LoadHome(path string) (*agent.HomeConfig, error) {
	hc, err := simulator.LoadHome(path)
	if err != nil {
		return nil, err
	}
	return &hc, nil
}
