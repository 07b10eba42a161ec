package main

import (
	"log/slog"

	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/agent/agentconf"
)

// The configuration file is package agentconf's.
type (
	Config      = agentconf.Config
	ConfigError = agentconf.ConfigError
	BrokerUser  = agentconf.BrokerUser
)

var (
	DefaultConfig = agentconf.DefaultConfig
	LoadConfig    = agentconf.LoadConfig
)

// agentOptions maps a validated config onto the agent's options, with
// this binary's version.
func agentOptions(cfg Config, log *slog.Logger) (agent.Options, error) {
	return agentconf.Options(cfg, log, agentconf.Build{Version: Version, Revision: Revision})
}
