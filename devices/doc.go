// Package devices speaks the Sortie device protocol over MQTT 3.1.1 and
// gives the driver its device step handlers.
//
// A Client (Dial) holds one MQTT connection (an internal/mqttc client,
// or calls into a broker in this process). It publishes commands at
// QoS 1 without waiting (Post, or PostState for a device of another
// ecosystem), correlates acks by device and command ID, and hands each
// to the step that parked for it (Options.OnChange names its AckKey;
// Collect returns it); it tracks each device's availability and last
// reported state from their retained topics (Available, State, Changed).
// The command ID is the step's idempotency key: a device applies an ID
// once and re-acks repeats with its first result, so a command may be
// retried freely; an ack that arrives after its step gave up is kept and
// completes the retry without publishing again.
//
// A Registry (LoadRegistry) is the catalogue of device types, their
// actions and parameter limits, and the home's devices, read from TOML
// (configs/devices.toml). Commands are checked against it before anything
// is published.
//
// Handlers serves the step kinds "device.command", "device.restore" and
// "device.wait_state"; register them with the driver through
// Handlers.Register.
//
// The messages and topics themselves are package devices/wire, shared
// with the simulator; docs/protocol.md documents the contract.
package devices
