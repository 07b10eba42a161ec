// Package simulator runs a simulated home: an embedded mochi MQTT broker
// and virtual devices that speak the Sortie device protocol, with
// reproducible fault injection, so the agent can be tested end to end
// without hardware.
package simulator
