//go:build !nosim

package main

import (
	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/simulator"
)

// loadHome reads a simulated home for [simulator] home (the demo).
func loadHome(path string) (*agent.HomeConfig, error) {
	hc, err := simulator.LoadHome(path)
	if err != nil {
		return nil, err
	}
	return &hc, nil
}
