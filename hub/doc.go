// Package hub is the central side of Sortie's store-and-forward uplink:
// it ingests mission events that gateways publish over MQTT, keeps them
// in a bbolt file, acknowledges them so gateways can drop their outbox
// entries, serves them over an HTTP JSON API and a live dashboard, and
// sends control requests (run a scene, cancel, retry, pause, resume)
// back to gateways.
//
// # Pieces
//
//   - Store: the bbolt file. Apply folds a group of inbound messages
//     (event batches, presence, heartbeats) into one transaction.
//     Ingest is idempotent and order-safe per (gateway, mission, event
//     seq): a duplicate changes nothing, a missing seq is recorded as a
//     gap (expected when the entry is marked Compacted), and a late
//     event fills its gap without rolling the summary back.
//   - PGStore: the same rules on PostgreSQL, for the cluster mode; its
//     schema has versions (pgMigrations), migrated once at OpenPG.
//     Every call of either store takes a context, whose cancellation
//     and deadline reach the database.
//   - Hub: the MQTT side. Run connects as the hub identity, queues
//     inbound messages in arrival order, commits them in groups, then
//     publishes uplink.Ack and tells watchers (the SSE stream) what
//     changed. Control publishes a request and waits for its result.
//   - Auth: a mochi hook for the hub's embedded broker with one
//     password per gateway and a topic ACL that confines each gateway to
//     its own topics and lets only the hub publish acks and controls.
//   - NewAPI: the HTTP handler (bearer token) and the embedded dashboard.
//
// # Layout
//
// Every bucket is created by Open:
//
//	meta      "schema" → layout version
//	gateways  gateway ID → Gateway (JSON)
//	missions  gateway + 0x00 + mission ID → Mission (JSON)
//	timeline  gateway + 0x00 + mission ID + 0x00 + event seq (big-endian) → driver.Event (JSON)
//	order     created (big-endian Unix ns) + gateway + 0x00 + mission ID → nothing
//	finished  finished (big-endian Unix ns) + gateway + 0x00 + mission ID → nothing
//
// Gateway and mission IDs pass driver.ValidateID, which rejects control
// characters, so 0x00 cannot occur inside them.
//
// # Concurrency and lifetime
//
// A Store is safe for concurrent use; values it returns are copies. A Hub
// runs until the context given to Run is cancelled; Control and Watch may
// be called from any goroutine.
package hub
