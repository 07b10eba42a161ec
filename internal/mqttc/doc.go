// Package mqttc is the one MQTT client of the module: every connection
// to a broker over a network (the devices client's, the agent's trigger
// link, the uplink to the hub, the hub's ingest, the simulator's
// devices) is a Client, and only this package sets up paho. The embedded
// broker's in-process link (package broker) needs no client.
//
// # Why a helper
//
// Five paho setups used to handle reconnects four ways, and each one
// had to remember the same traps: a refused subscription that paho
// reports as a success, a token nobody waits for with a timeout, a
// handler that blocks the router, a connection loss logged with no word
// of its end. A Client does each of these once.
//
// # One paho client per connection
//
// A Client makes a new paho client for every connection and lets paho
// neither retry nor reconnect. paho's own reconnect backs off without
// jitter, so a fleet that lost the same broker comes back at the same
// instant; it resends in-flight publishes from its store on reconnect,
// racing its own writer (eclipse-paho/paho.mqtt.golang#703); and its
// README advises against reusing a client after a disconnect. Every
// caller here resends from its own state (the outbox, the driver's
// retries, the device's republished state), so nothing is lost when a
// publish in flight as a connection drops fails rather than going out
// later on the next one. Sessions are clean unless Options.Persistent
// asks the broker to keep one (the agent's trigger link does, so that
// triggers published while it restarts wait for it).
//
// Between attempts the Client waits a backoff that doubles up to
// Options.MaxReconnectInterval, its upper half random.
//
// # Subscriptions
//
// The Client owns its subscriptions (Subscribe, at QoS 1) and makes them
// again after every connection, from its own goroutine and before
// Options.OnConnect runs, so they survive any reconnect; a refused or
// unanswered subscription is retried while the connection lasts, and
// on the next one, for as long as the Client runs: Connect waits
// through it, Problem says why the Client is not up meanwhile, and each
// cause is logged once. A broker's refusal can pass: an ACL put right,
// a broker that confused its packet identifiers with the client's
// (package broker's packetid.go). No paho
// handler ever waits for the broker. Handlers run on paho's goroutines:
// with Options.Ordered one at a time in arrival order, otherwise each
// message on a goroutine of its own. They must not block, and no handler
// runs after Close returns.
//
// # Publishing and tokens
//
// Publish waits for the broker's PUBACK, at most Options.Timeout in all
// (a connection coming back within it counts); PublishAsync returns a
// Token at once for callers that wait for other things too (a device's
// ack, a context). Wait is the one way to wait for a Token: always
// bounded.
//
// # Logs
//
// A Client logs its first connection, each loss ("broker connection
// lost") and each return ("broker connection restored") once per
// transition, with the broker's URL, and failed connection attempts at
// most once per FailureLogInterval: a wrong password or URL shows in the
// log however fast the retries go. With Options.Once the caller owns the
// connection's life and the Client logs none of this.
//
// # Lifetime
//
// New, then Subscribe the filters wanted from the first connection on,
// then Start (connect in the background) or Connect (wait for the first
// connection). Close disconnects with a bounded quiesce and waits for
// the Client's goroutine; a closed Client is not reused. Every method
// is safe for concurrent use.
package mqttc
