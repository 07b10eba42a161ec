// Package devices speaks the Sortie device protocol over MQTT 3.1.1: it
// publishes commands, correlates acks by command ID, tracks each device's
// availability and reported state, and provides the "device.command"
// step handler for the driver.
//
// The wire contract is documented in docs/protocol.md.
package devices
