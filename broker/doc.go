// Package broker is the MQTT broker Sortie embeds in the agent and in the
// hub (mochi-mqtt underneath): start and close it, publish and subscribe
// from inside its process with no connection in between, tap messages as
// the broker takes them in, and control who may connect and what each
// user may publish and read (Auth). Package broker/passwd hashes the
// users' passwords; package broker/brokertest starts brokers for tests.
//
// The agent's devices.Client and the hub reach the broker through the
// in-process calls (Publish, Subscribe, Tap); devices, apps and gateways
// connect to it over TCP, in the clear or with TLS.
package broker
