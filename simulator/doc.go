// Package simulator runs a simulated home: an embedded mochi MQTT broker
// and virtual devices that speak the Sortie device protocol, with
// reproducible fault injection, so the agent can be tested end to end
// without hardware.
//
// A Home is built from a HomeConfig (ParseHome/LoadHome read the TOML
// form, see configs/home.toml) and started with Start; Close stops it.
// Each Device is its own MQTT client: it announces "online" (retained)
// once subscribed to its command topic, leaves "offline" as its last
// will, checks params as real firmware would (invalid_param naming the
// field, unknown_action), applies a command ID at most once within a
// window of DedupSize IDs (re-acking the first answer), answers "expired"
// to a command received after its Expires, and publishes its state
// retained after every change. The catalogue of types, actions and state
// keys is the one of configs/devices.toml.
//
// Faults (ack loss, delay and duplication, busy and permanent rejections,
// wrong state, a jammed lock, outages that fire the last will) are set per
// device from the config or at runtime with Device.SetFaults, SetOnline
// and GoOffline. Every random choice comes from a source derived from the
// home's seed, the device ID and the fault, so a run replays exactly.
// Counters and Applied expose what each device really did, for
// exactly-once checks.
//
// The package speaks the protocol of package devices and never imports
// the driver.
package simulator
