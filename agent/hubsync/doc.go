// Package hubsync is the gateway's side of the hub link: a
// store-and-forward sync of mission events from the store's
// transactional outbox, gateway presence and heartbeats, and remote
// control requests from the hub. It speaks the protocol of package
// uplink, which the hub links without this package or the store;
// docs/protocol.md ("Hub sync") describes it.
//
// # Delivery
//
// The outbox is the sync's only state. Run reads it in seq order,
// publishes batches at QoS 1, keeps a bounded window of unacknowledged
// batches and deletes entries only when the hub's ack arrives. After a
// resend timeout, a reconnect or a restart it sends again from the oldest
// unacknowledged entry; the hub deduplicates by (gateway, mission, event
// seq). Delivery is therefore at least once, in outbox order, which keeps
// each mission's events in order.
//
// # Concurrency and lifetime
//
// Run owns one MQTT client (internal/mqttc) for its whole life: it
// connects, reconnects on its own (the hub being unreachable is not an
// error) and disconnects when its context ends, after publishing the
// offline status. The client's handlers only record what arrived and
// wake Run's loop, which does all publishing; control requests are
// handled one at a time by a second goroutine that Run waits for. Notify, Observe and Stats are safe from
// any goroutine. An Uplink runs once; make a new one to run again.
package hubsync
