// Package uplink is the wire protocol between gateways and the hub: the
// topics, the messages (event batches and their acks, presence,
// heartbeats, control requests and results) and their checked decoders.
// docs/protocol.md ("Hub sync") is the contract in prose.
//
// It is a package of its own so that the hub links the messages it
// speaks and nothing of the agent: the gateway's sender, which reads the
// store's outbox, is package agent/hubsync. uplink imports only driver,
// for the mission events and summaries a batch carries.
//
// Every decoder rejects a message over MaxMessage before reading it,
// and every decoding error wraps ErrMessage. Messages are plain values,
// safe to share once decoded.
package uplink
