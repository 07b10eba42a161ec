// Package store keeps missions and their timelines in a bbolt file. A DB
// implements driver.Store.
//
// # Layout
//
// Every bucket is created by Open:
//
//	meta      "schema" → layout version (big-endian uint64)
//	missions  mission ID → envelope (a fixed header, then the mission as JSON)
//	order     creation sequence (big-endian, from NextSequence) → mission ID
//	active    mission ID → nothing, for every mission that is not terminal
//	requests  request key → mission ID, for idempotent Create
//	finished  finish time (big-endian Unix ns) + mission ID → nothing
//	timeline  mission ID + 0x00 + event seq (big-endian) → event JSON
//
// The envelope header carries the record schema (driver.SchemaVersion),
// the creation sequence, the mission version, its finish time and the
// highest event seq recorded, so a save checks its version, refuses to
// rewrite history and moves index entries without decoding the stored
// JSON or reading the timeline.
//
// # Group commit
//
// Create and Save calls that arrive together share one bbolt transaction,
// and so one pair of fsyncs: the first caller to find no commit in flight
// leads, committing every queued call; calls that arrive meanwhile wait
// for the next leader. A lone caller commits at once, without the delay
// of bbolt's Batch. Each call's version check runs on its own inside the
// shared transaction, so a conflict fails only that call.
//
// # Concurrency and lifetime
//
// A DB is safe for concurrent use. Close waits for queued writes, then
// releases the file lock; calls after Close fail with driver.ErrClosed.
// Values returned are copies: callers may keep and modify them.
package store
