// Package wal is the store's write-ahead log: one preallocated file
// beside the store file that makes a batch of writes durable with one
// synchronous append, where a bbolt commit costs two fsyncs plus the
// pages of every bucket it touches. bbolt stays the store of record:
// the store applies logged records to it later (a checkpoint) and
// records the last LSN applied there, so it replays each record once.
// It is the layout etcd uses in front of its own bbolt backend. The
// package knows nothing of what a record means: payloads are opaque
// bytes, and which LSNs are applied is the caller's to track.
//
// # Guarantees
//
// Durability: when Append returns nil, every record of the batch is on
// stable storage (written O_DIRECT|O_DSYNC where the file system allows
// it, else written and then fdatasync'd), and so is the file's directory
// entry and header, which Create makes durable before it returns.
//
// Ordering: LSNs are assigned by Append, one per record, consecutive
// across calls and across Rewind; a batch's records are read back in the
// order they were given. Read returns the records of the current pass in
// LSN order, and never a record out of sequence.
//
// Crashes: a crash at any point, including in the middle of a write,
// leaves a file from which Read returns every record whose Append
// returned nil since the last Rewind, in order, possibly followed by
// records of an Append that had not returned yet (never acknowledged,
// so the caller may apply them or not), and nothing else. In particular
// it does not return the records of an Append that returned an error:
// their bytes may have reached the disk, and they carry the LSNs the
// next Append reuses, so the failed Append writes a zero frame where
// they start (a fence), and until the log is written past them every
// later Append ends with a zero frame too, where reading stops. Only if
// the fence itself fails, and the process crashes before the next
// successful Append, may the failed records be read back.
//
// Rewind: the caller rewinds only once everything logged is applied
// elsewhere; the records of the earlier pass stay in the file behind the
// new ones, and Read never returns them (their LSNs are lower, so they
// do not continue the sequence).
//
// A Log is not safe for concurrent use: the store's commit leader is
// its only writer, under the store's write lock.
//
// The log reaches its file through FS (OS in production), the seam the
// store's power-cut test puts a disk that loses unsynced writes behind.
//
// # File naming
//
// The log of the store file "<path>" is "<path>-wal" (Path), as SQLite
// names its own. A clean close (Close(true): everything logged applied)
// keeps the file and marks its header clean at the last LSN; the next
// Create continuing from that LSN reuses it, clearing the mark durably
// first, rather than writing and syncing its preallocated zeros again
// (most of a store's open). Any other Create truncates it.
//
// # On-disk format
//
// All integers are big-endian. The file starts with a 32-byte header:
//
//	[0:16]   magic "SORTIE-WAL\x00\x00\x00\x00\x00\x02" (the last byte is the format version;
//	         Read also reads version 1, which has no skip frames)
//	[16:24]  the owning store's WAL ID (its meta "wal_id")
//	[24:32]  the clean mark: zero while the log is open or after a crash;
//	         after a clean close, the last LSN written plus one, and then
//	         no record in the file has a higher LSN (a log that may hold
//	         a failed append's is removed instead). Builds before the
//	         mark read it as zero and skip the records, all applied.
//
// Then records, contiguous from byte 32, each a 16-byte frame and its
// payload:
//
//	[0:4]    payload length n, 1 to MaxRecord
//	[4:8]    CRC-32C (Castagnoli) of bytes [8:16+n] of the record: the LSN and the payload
//	[8:16]   LSN
//	[16:16+n] payload
//
// The file is preallocated to Prealloc bytes of zeros on creation, and
// grows past that only when a pass does. A reader:
//
//  1. treats a missing file, a file shorter than 32 bytes and a header
//     of zeros as a log without records (its creation never completed,
//     so nothing was acknowledged from it);
//  2. refuses a different magic (FormatError); treats a header marked
//     clean as a log without records to replay (every one was applied);
//     refuses a WAL ID other than its store's (ErrForeign);
//  3. reads records from byte 32 and stops, without error, at the first
//     frame that is shorter than 16 bytes, has a length of 0 or above
//     MaxRecord or past the end of the file, fails its CRC, or whose LSN
//     is not the previous record's plus one. A zero frame (16 zero
//     bytes) is the usual end: the preallocated zeros, or a fence after
//     a failed append. The first record's LSN may be anything: the
//     caller checks that it continues what it has applied.
//
// An append that ends inside a block is followed by a skip frame that
// pads the block: length field 0xFFFFFFFF, then k (uint32, below Block)
// the number of zero bytes after the frame, then the CRC-32C of the
// frame's first 8 bytes, then 4 zero bytes. A reader skips the frame and
// its k bytes; the next record must still continue the LSN sequence. So
// the next append starts a block of its own, and an append of a step's
// record writes one block rather than, half the time, two. (When less
// than a frame is left in the block, there is no padding.)
//
// Writes with O_DIRECT cover whole 4096-byte blocks (Block): the part of
// the current block already written is written again, unchanged, ahead
// of the new records, and the rest of the last block is zero-filled.
// Those zeros read as a zero frame, so they end the records too.
package wal
