// Package uplink connects a gateway to the hub: a store-and-forward sync
// of mission events from the store's transactional outbox, gateway
// presence and heartbeats, and remote control requests from the hub.
// protocol.go is the wire contract shared with cmd/hub.
package uplink
