// Package wire is the Sortie device protocol: its topics, its messages
// (Command one way; Ack, StateReport and availability the other), their
// encoders and their decoders. docs/protocol.md is the contract in prose.
//
// It is a package of its own so that both ends of the protocol link the
// messages and nothing else: the agent's device client (package devices)
// and the device simulator (package simulator), which must not depend on
// the agent or on the mission driver.
//
// Messages are encoded and decoded on every step, on both sides, so
// neither direction uses reflection on the usual path. AppendJSON writes
// the bytes json.Marshal writes; the decoders read the shape devices and
// the agent actually send with a hand-written reader and hand anything
// else to encoding/json, whose answer is then theirs. Their tests and
// fuzz tests hold both to encoding/json's behaviour. Every decoder
// rejects payloads over MaxPayload before reading them, and numbers in
// decoded maps are json.Number, so a receiver can check integer-ness
// exactly.
//
// testdata/payloads is the shared catalogue of golden messages; every
// one must decode, and the fuzz tests start from them.
//
// Everything here is safe for concurrent use; messages are plain values.
package wire
