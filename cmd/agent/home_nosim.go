//go:build nosim

package main

import "github.com/sortie-edge/sortie/agent"

// loadHome refuses [simulator] home in a build without the simulator
// (the shipped ARM binaries: `make cross`).
func loadHome(string) (*agent.HomeConfig, error) { return nil, agent.ErrNoSimulator }
