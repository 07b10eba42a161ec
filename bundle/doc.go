// Package bundle is a gateway's configuration as one immutable value: its
// scenes, its device registry and the agent settings that change without
// a restart, addressed by the SHA-256 of a canonical encoding.
//
// A Bundle is what the agent runs, whether it came from the files named
// by its config (agent.toml's devices, scenes and [location]), from a
// local directory ("agent apply DIR") or from the hub. The same content
// has the same hash wherever it came from, so a hub compares the hash a
// gateway reports in its heartbeat with the one it sent and sees a hand
// edit as a different hash (docs/fleet.md).
//
// The encoding (Encode, Decode) is JSON with a fixed shape: fields in
// declaration order, files sorted by path, file contents in base64.
// Decode accepts only that canonical form (it re-encodes and compares),
// so the bytes a hub stored, the bytes it sent and the bytes a gateway
// hashed are the same bytes. The version that orders bundles is not part
// of the content: a hub numbers what it pushes per target group, and a
// rollback is a newer version of older content.
//
// This package imports nothing of the agent, the hub or the device layer;
// package bundle/check validates a bundle with the rules "agent validate"
// uses.
package bundle
