// Package fleetsim runs a fleet of light simulated gateways in one
// process, against a hub's MQTT broker, for tests and benchmarks of the
// hub's rollouts (issue 27, docs/fleet.md "A fleet to try it on").
//
// A light gateway speaks the uplink protocol (package uplink) exactly as
// the agent's hub sync does, as far as a hub can tell: its presence
// with its last will, heartbeats carrying the configuration it runs
// (config: hash, version, source, since, trial, files), control
// requests answered once and repeats answered from memory, and the
// bundle control with the agent's rules: validation by bundle/check (a
// devices.toml of its own is swapped in, as the agent's registry is;
// the heartbeat says swaps_registry), min_agent (agent_too_old), the
// hub version (stale: never an older version, a repeat answered from
// what it became), statuses on bundle/status (received, applied,
// healthy, rejected, reverted, with the agent's reasons), a soak on its
// own clock after which it keeps the bundle or reverts it by itself, and
// the latest status said again on every connection. What it does not
// have is the rest of an agent: no store, no missions (so no
// mission_failed), no devices of its own beyond the registry it
// reports; a trigger, pause or cancel is answered "unsupported".
// TestLightGatewayAnswersOffersAsTheAgentDoes holds it to the agent.
//
// Faults are chosen per gateway (Fault) or by fraction (Faults):
// offline for the whole run, another registry, devices that never
// answer, an uplink cut for the trial, a hand edit of the config files,
// slow answers and message loss.
//
// # Cost
//
// Every gateway is its own MQTT client (its own client ID, will and
// ACL: the protocol allows no sharing), so it has one internal/mqttc
// client and its paho goroutines; the bundle state is small and what
// many gateways share (a bundle's validated form, its scene list, the
// registry's inventory) is kept once per fleet, by hash.
// BenchmarkFleetConnect measures the bytes per gateway.
//
// # Concurrency and lifetime
//
// New builds the fleet, Start connects it in the background, Close
// disconnects every gateway (each publishes its offline status) and
// waits for their goroutines. Gateway methods are safe from any
// goroutine.
package fleetsim
