// Package agent is the Sortie gateway agent as a library: it wires the
// embedded MQTT broker (or a link to an external one), the mission store,
// the driver and its step handlers, the trigger service with its scene
// modes, the event feed, metrics, retention, the management API and the
// hub sync into one Agent.
//
// An embedder builds Options (cmd/agent maps its config file onto them):
// the device registry (devices.LoadRegistry) and the scenes built on it
// (scenes.Load), a data directory and a broker; then calls New, Start
// and Run, and Close once Run has returned (the package's Example runs
// one):
//
//	a, err := agent.New(opts)
//	...
//	defer a.Close()
//	if err := a.Start(ctx); err != nil { ... }
//	err = a.Run(ctx) // until ctx ends
//
// The agent binary runs Go's garbage collector at GOGC=400 unless the
// environment sets it (README, "Memory"); an embedder's process keeps
// its own setting.
//
// Options.Handlers adds step kinds, Options.Observers sees every mission
// event, and Agent.Driver and Agent.Broker give the running parts to a
// program that needs more. docs/ARCHITECTURE.md follows one trigger
// through the parts this package wires.
package agent
