// Package store keeps missions and their timelines in a bbolt file. A DB
// implements driver.Store.
//
// # Layout
//
// Every bucket is created by Open:
//
//	meta      "schema" → layout version (big-endian uint64);
//	          "wal_id" → the store's random log ID; "wal_lsn" → last LSN applied
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
// # Write-ahead log and checkpoints
//
// A Create or Save is durable once it is in the write-ahead log beside
// the file ("<path>-wal"): one append, written O_DIRECT|O_DSYNC where the
// file system allows it and with write plus fdatasync elsewhere, where a
// bbolt commit would cost two fsyncs and the pages of every bucket the
// write touches. A checkpoint then applies logged writes to bbolt, many
// per transaction, and records the last LSN applied in the meta bucket
// ("wal_lsn") in the same transaction; it runs in the background 50 ms
// after the first write of a batch (or at once for 512 writes), and
// before any read that scans bbolt (List, Active, Timeline, Stats,
// Prune). Get, Lookup and Outbox see logged writes at once through an
// in-memory overlay; the commit leader assigns outbox seqs, so they are
// the same before and after a checkpoint or a replay. AckOutbox drops
// acknowledged entries still in the log from the overlay and marks them
// so that no checkpoint writes them. Open replays what a crash left in the
// log; Close checkpoints everything and deletes the log, so a stopped
// store is the one file. The log's header carries the store's random ID
// ("wal_id"), so a log is never replayed into another file, such as one
// restored from a backup. The log itself, its guarantees and its file
// format are package store/internal/wal's; what a record means (one
// Create or Save, see encodeWrite), the overlay and the checkpoints are
// this package's.
//
// # Group commit
//
// Create and Save calls that arrive together share one log append: the
// first caller to find no commit in flight leads, checking and logging
// every queued call; calls that arrive meanwhile wait for the next
// leader. A lone caller commits at once, without a batching delay. Each
// call's version check runs on its own against the state acknowledged so
// far (this batch, the overlay, then bbolt), so a conflict fails only
// that call.
//
// # Concurrency and lifetime
//
// A DB is safe for concurrent use. Close waits for queued writes, then
// releases the file lock; calls after Close fail with driver.ErrClosed.
// Values returned are copies: callers may keep and modify them.
package store
