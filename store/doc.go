// Package store keeps missions and their timelines in a bbolt file. A DB
// implements driver.Store.
//
// # Layout
//
// Every bucket is created by Open:
//
//	meta      "schema" → layout version (big-endian uint64);
//	          "wal_id" → the store's random log ID; "wal_lsn" → last LSN applied;
//	          "counts" → stored missions per state and stored events;
//	          "trace_bytes" → the trace records' bytes; "tracelog_n" → entries of tracelog
//	missions  mission ID → record: a fixed header, then for a finished
//	          mission its archive (the mission and its timeline, compressed),
//	          for a live one nothing
//	live      mission ID → the mission as JSON, for every live mission
//	order     creation sequence (big-endian, from NextSequence) → mission ID
//	active    mission ID → nothing, for every mission that is not terminal
//	requests  request key → mission ID, for idempotent Create
//	finished  finish time (big-endian Unix ns) + mission ID → nothing
//	timeline  mission ID + 0x00 + event seq (big-endian) → event JSON, for
//	          live missions
//	outbox    outbox seq → an event for the hub
//	traces    request ID → every evaluation kept of a trigger (trace.go)
//	traceage  failed flag + latest evaluation time + request ID → nothing,
//	          the order retention deletes records in
//	schedules schedule ID → its cursor (Unix seconds, big-endian)
//	tracelog  trace seq → one evaluation waiting for the hub (with Outbox)
//	controls  control request ID → order stamp (big-endian) + the answer
//	          given, the latest MaxControls (controls.go)
//
// The record header carries the record's form, the mission encoding's
// schema (driver.SchemaVersion), the state, the creation sequence, the
// mission version, its finish time and the highest event seq recorded, so
// a save checks its version, refuses to rewrite history, moves index
// entries and keeps the counts without decoding the mission or reading
// the timeline inside the shared write transaction (envelope.go).
//
// A finished mission is stored compactly: the checkpoint that applies
// its terminal state writes one archive (archive.go: DEFLATE against a
// fixed dictionary; ~0.6 KB for a 3-step mission with its twelve events,
// where the JSON is ~6 KB) and deletes its live JSON and timeline
// entries. Live missions, rewritten at every step, stay uncompressed and
// apart, so the missions bucket's pages hold archives densely. A retried
// mission takes its events back out of its archive. A checkpoint folds
// each mission's writes into one (apply.go): a mission run from start to
// finish between two checkpoints is written once, as its archive.
//
// Files of schema 1 (JSON records with their events in the timeline
// bucket) are migrated by Open in batches of their own transactions that
// resume after a crash (migrate.go); a write-ahead log a schema 1 build
// left is replayed after the migration.
//
// # Write-ahead log and checkpoints
//
// A Create or Save is durable once it is in the write-ahead log beside
// the file ("<path>-wal"): one append, written O_DIRECT|O_DSYNC where the
// file system allows it and with write plus fdatasync elsewhere, where a
// bbolt commit would cost two fsyncs and the pages of every bucket the
// write touches. A checkpoint then applies logged writes to bbolt, many
// per transaction, and records the last LSN applied in the meta bucket
// ("wal_lsn") in the same transaction; it runs in the background
// Options.CheckpointDelay (10 s) after the first write of a batch (or at
// once for 512 writes), and
// before any read that scans bbolt (List, Active, Timeline, Stats,
// Prune). Get, Lookup and Outbox see logged writes at once through an
// in-memory overlay; the commit leader assigns outbox seqs, so they are
// the same before and after a checkpoint or a replay. AckOutbox drops
// acknowledged entries still in the log from the overlay and marks them
// so that no checkpoint writes them. Open replays what a crash left in the
// log; Close checkpoints everything and marks the log clean, keeping its
// preallocated file for the next Open (writing and syncing 4 MiB of
// zeros was most of an Open), which then has nothing to replay. The log's header carries the store's random ID
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
// Values returned are copies: callers may keep and modify them. Its five
// locks are taken in one order, written down in lockorder.go and checked
// at every Lock by a build with -tags lockorder (make lockorder).
//
// # Power cuts
//
// The log is written through wal.FS. TestPowerCutKeepsAcknowledgedWrites
// puts an in-memory disk there (internal/crashfs) that loses, at a
// seeded random operation, what was not synced, and checks that the
// store opens with every acknowledged write and nothing half-applied.
package store
