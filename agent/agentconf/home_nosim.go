//go:build nosim

package agentconf

import "github.com/sortie-edge/sortie/agent"

// LoadHome refuses [simulator] home in a build without the simulator
// (the shipped ARM binaries: `make cross`).
func LoadHome(string) (*agent.HomeConfig, error) { return nil, agent.ErrNoSimulator }
