package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"syscall"
	"unsafe"
)

// The on-disk format's sizes; doc.go describes the format.
const (
	// HeaderLen is the header's size: records start right after it.
	HeaderLen = 32
	// FrameLen is a record's frame: payload length, CRC and LSN.
	FrameLen = 16
	// Block is the alignment of direct writes: the largest logical block
	// size in use, so it suits 512-byte devices too.
	Block = 4096
	// Prealloc is written up front: overwriting written blocks needs no
	// file-size or extent update in each sync.
	Prealloc = 4 << 20
	// MaxRecord bounds a payload: reading refuses longer lengths, which
	// only a damaged frame has, so Append refuses them too.
	MaxRecord = 64 << 20
)

var (
	magic = []byte("SORTIE-WAL\x00\x00\x00\x00\x00\x02")
	// magicV1 is the format before skip frames; Read still reads it.
	magicV1 = []byte("SORTIE-WAL\x00\x00\x00\x00\x00\x01")
	castagn = crc32.MakeTable(crc32.Castagnoli)
)

// Path returns the log of the store file at path, named as SQLite names
// its own.
func Path(path string) string { return path + "-wal" }

// Log is an open log, positioned after its last record. It is not safe
// for concurrent use: its one writer is the store's commit leader.
type Log struct {
	fs   FS
	f    File
	path string
	off  int64  // where the next record goes
	lsn  uint64 // last LSN written
	buf  []byte

	// direct is set when f was opened O_DIRECT|O_DSYNC: a write is then
	// durable when it returns, without the page cache and a separate
	// fdatasync (about a third cheaper here), but it must cover whole
	// aligned blocks, so the records already in the block that off is in
	// are kept in tail and written again, unchanged, ahead of new ones.
	direct bool
	hdr    []byte
	tail   []byte
	blk    []byte // aligned write buffer

	// failedEnd is where records of a failed append may reach, until the
	// log has been written past them; zero otherwise.
	failedEnd int64
	// recEnd is where the last append's records end, before its padding.
	recEnd int64
}

// Create (re)creates the log at path for the store with the given WAL
// ID, empty, with lsn as the last LSN already used. The header and the
// directory entry are durable before it returns, so no record is ever
// written behind a missing one.
func Create(path string, id, lsn uint64, mode os.FileMode) (*Log, error) {
	return CreateOn(OS, path, id, lsn, mode, Prealloc)
}

// CreateOn is Create on the file system fsys, preallocating prealloc
// bytes (a multiple of Block; Create's is Prealloc): tests that run the
// log thousands of times on a simulated disk make it smaller, which also
// makes the log grow past it.
func CreateOn(fsys FS, path string, id, lsn uint64, mode os.FileMode, prealloc int) (*Log, error) {
	if prealloc < Block || prealloc%Block != 0 {
		return nil, fmt.Errorf("create %s: preallocation %d is not a positive multiple of %d", path, prealloc, Block)
	}
	hdr := make([]byte, HeaderLen)
	copy(hdr, magic)
	binary.BigEndian.PutUint64(hdr[16:24], id)
	if l, err := reuse(fsys, path, hdr, lsn, prealloc); l != nil || err != nil {
		return l, err
	}
	f, err := fsys.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	// Zeros rather than fallocate's unwritten extents: the first write to
	// an unwritten extent also commits the file system's journal.
	fill := make([]byte, prealloc)
	copy(fill, hdr)
	fail := func(what string, err error) (*Log, error) {
		return nil, errors.Join(fmt.Errorf("%s %s: %w", what, path, err), f.Close())
	}
	if _, err := f.WriteAt(fill, 0); err != nil {
		return fail("write", err)
	}
	if err := f.Sync(); err != nil {
		return fail("sync", err)
	}
	if err := fsys.SyncDir(path); err != nil {
		return fail("sync directory of", err)
	}
	return newLog(fsys, f, path, hdr, lsn), nil
}

// newLog returns the log on f, a buffered descriptor of a file whose
// header is hdr and whose every write is durable, positioned for the
// first record after lsn; it switches to direct writes where it can.
func newLog(fsys FS, f File, path string, hdr []byte, lsn uint64) *Log {
	l := &Log{fs: fsys, f: f, path: path, off: HeaderLen, lsn: lsn, hdr: hdr}
	if df, err := l.openDirect(); err == nil {
		// The buffered descriptor wrote nothing since its sync: closing
		// it loses nothing, whatever Close says.
		_ = f.Close()
		l.f, l.direct = df, true
		l.tail = append(l.tail, hdr...)
	}
	return l
}

// reuse opens the file a clean Close kept at path, when its header is
// hdr's (the format and the store's WAL ID), marked clean at lsn, and it
// is preallocated: writing and syncing prealloc bytes of zeros again is
// most of a store's open. It returns nil, nil when the file is not one
// to reuse, or its mark could not be cleared, and Create makes a new one. Every record in a file marked
// clean has an LSN of lsn or lower (Close marks only such a file), so
// the new pass, which starts after lsn, never reads into them, as after
// Rewind. The mark is cleared, durably, before the first append: a crash
// from then on leaves a log the next open replays and creates afresh.
func reuse(fsys FS, path string, hdr []byte, lsn uint64, prealloc int) (*Log, error) {
	head, size, err := fsys.Head(path, HeaderLen)
	if err != nil || size < int64(prealloc) || len(head) < HeaderLen || !bytes.Equal(head[:24], hdr[:24]) ||
		binary.BigEndian.Uint64(head[24:HeaderLen]) != cleanMark(lsn) {
		return nil, nil // missing, short, another store's or not closed clean: created anew
	}
	f, err := fsys.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, nil //nolint:nilerr // Create's own open reports what is wrong with the path
	}
	l := newLog(fsys, f, path, hdr, lsn)
	if err := l.clearMark(); err != nil {
		// Created anew instead, which rewrites the whole file: a write
		// that failed here must not keep a store from opening when a
		// new log can still be made (and Create says why when it cannot).
		_ = l.f.Close()
		return nil, nil //nolint:nilerr // see above
	}
	return l, nil
}

// clearMark makes the header's clean mark zero, durably. Direct, it
// writes the first block as the header and zeros, as the first append
// would (the last pass's records there are stale): one synchronous
// block write. Buffered, it writes the mark's 8 bytes and syncs.
func (l *Log) clearMark() error {
	if l.direct {
		l.buf = l.buf[:0]
		err := l.writeDirect(0)
		if err == nil || !errors.Is(err, syscall.EINVAL) {
			return err
		}
		// As in Append: a file system that refuses these writes.
		if err := l.buffered(); err != nil {
			return err
		}
	}
	if _, err := l.f.WriteAt(l.hdr[24:HeaderLen], 24); err != nil {
		return err
	}
	return l.f.Sync()
}

// cleanMark is what a clean Close writes at [24:32] of the header: one
// more than the last LSN written, so that it is never zero.
func cleanMark(lsn uint64) uint64 { return lsn + 1 }

// LSN returns the last LSN written (or given to Create).
func (l *Log) LSN() uint64 { return l.lsn }

// Offset returns where the next record goes: the length of the current
// pass, header included.
func (l *Log) Offset() int64 { return l.off }

// End returns where the last append's records end: before the skip
// frame that pads its block, if it has one.
func (l *Log) End() int64 { return l.recEnd }

// Direct reports whether appends bypass the page cache (O_DIRECT), which
// the file system may refuse.
func (l *Log) Direct() bool { return l.direct }

// Append writes the payloads as consecutive records and makes them
// durable. It returns the LSN of the first. On failure the offset and
// LSN are not advanced, so the next append takes the same place and
// LSNs; but the failed bytes may have landed, and if the next batch is
// shorter, the failed one's later records would continue the sequence
// and be replayed as if acknowledged. So until the log is written past
// them, every append ends with a zero frame, where reading stops.
func (l *Log) Append(payloads [][]byte) (uint64, error) {
	for _, p := range payloads {
		if len(p) == 0 || len(p) > MaxRecord {
			return 0, fmt.Errorf("append to %s: a %d-byte record, outside 1 to %d", l.path, len(p), MaxRecord)
		}
	}
	l.buf = l.buf[:0]
	first := l.lsn + 1
	for i, p := range payloads {
		l.buf = AppendRecord(l.buf, first+uint64(i), p)
	}
	records := len(l.buf)
	l.recEnd = l.off + int64(records)
	if l.failedEnd > l.recEnd {
		l.buf = append(l.buf, make([]byte, FrameLen)...)
	} else {
		records += l.pad(records)
	}
	err := l.write(records)
	if err != nil && l.direct && errors.Is(err, syscall.EINVAL) {
		// A file system that took O_DIRECT at open but refuses these
		// writes (a block size above Block): go buffered for good.
		if berr := l.buffered(); berr == nil {
			err = l.write(records)
		}
	}
	if err != nil {
		// Only its records can continue a later pass's sequence: its skip
		// frame, read after a shorter retry, skips to zeros or to records
		// of lower LSNs, where reading stops anyway.
		l.failedEnd = max(l.failedEnd, l.recEnd)
		// The outcome is unknown: the bytes may be on disk. Fence them
		// off now, so that a crash before the next append cannot replay
		// writes their callers were told failed; if even that fails, the
		// caller may see them again after a restart.
		l.fence()
		return 0, err // it names the file
	}
	l.off += int64(records)
	if l.off >= l.failedEnd {
		l.failedEnd = 0
	}
	l.lsn = first + uint64(len(payloads)) - 1
	return first, nil
}

// pad ends the batch in buf, records bytes long, at a block boundary with
// a skip frame, and returns the bytes it added. The next append then
// starts a block of its own instead of writing this one's last block
// again: on flash a direct write costs whole blocks, and a step's record
// is smaller than one, so without padding half the appends write two.
// A remainder too small for a frame is left, and filled by the next one.
func (l *Log) pad(records int) int {
	end := l.off + int64(records)
	rem := int((Block - end%Block) % Block)
	if rem < FrameLen {
		return 0
	}
	l.buf = AppendSkip(l.buf, rem-FrameLen)
	return rem
}

// AppendSkip appends a skip frame and the k zero bytes it skips.
func AppendSkip(dst []byte, k int) []byte {
	start := len(dst)
	dst = binary.BigEndian.AppendUint32(dst, skipMarker)
	dst = binary.BigEndian.AppendUint32(dst, uint32(k))
	dst = binary.BigEndian.AppendUint32(dst, crc32.Checksum(dst[start:start+8], castagn))
	dst = append(dst, 0, 0, 0, 0)
	return append(dst, make([]byte, k)...)
}

// skipMarker in a frame's length field makes it a skip frame.
const skipMarker = 0xFFFFFFFF

// AppendRecord appends to dst the record Append writes for payload p at
// lsn: for tools and tests that craft a log.
func AppendRecord(dst []byte, lsn uint64, p []byte) []byte {
	start := len(dst)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(p)))
	dst = append(dst, 0, 0, 0, 0)
	dst = binary.BigEndian.AppendUint64(dst, lsn)
	dst = append(dst, p...)
	binary.BigEndian.PutUint32(dst[start+4:start+8], crc32.Checksum(dst[start+8:], castagn))
	return dst
}

// write writes buf at off, durably; records is the length of its records.
func (l *Log) write(records int) error {
	if l.direct {
		return l.writeDirect(records)
	}
	if _, err := l.f.WriteAt(l.buf, l.off); err != nil {
		return err
	}
	if err := l.f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", l.path, err)
	}
	return nil
}

// fence writes a zero frame at off, durably, where reading stops.
func (l *Log) fence() {
	l.buf = append(l.buf[:0], make([]byte, FrameLen)...)
	// Best effort, on a path that already reports the append's error:
	// Append's doc says what a failed fence can bring back.
	_ = l.write(0)
}

// buffered reopens the log for buffered writes and fdatasync.
func (l *Log) buffered() error {
	f, err := l.fs.OpenFile(l.path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	// Every direct write was durable when it returned: closing the old
	// descriptor loses nothing, whatever Close says.
	_ = l.f.Close()
	l.f, l.direct, l.tail = f, false, nil
	return nil
}

// writeDirect writes tail and buf from the start of off's block, padded
// with zeros to whole blocks, and keeps as the new tail what precedes the
// end of buf's first n bytes (its records). The bytes before off are the
// ones already on disk, so rewriting them changes nothing a torn write
// could lose.
func (l *Log) writeDirect(n int) error {
	start := l.off - int64(len(l.tail))
	total := len(l.tail) + len(l.buf)
	size := (total + Block - 1) / Block * Block
	if len(l.blk) < size {
		l.blk = alignedBlock(size * 2)
	}
	blk := l.blk[:size]
	copy(blk, l.tail)
	copy(blk[len(l.tail):], l.buf)
	clear(blk[total:])
	if _, err := l.f.WriteAt(blk, start); err != nil {
		return err
	}
	end := len(l.tail) + n
	l.tail = append(l.tail[:0], blk[end-end%Block:end]...)
	return nil
}

// openDirect opens the log for writes that bypass the page cache and are
// durable on return, where the platform and the file system allow it.
func (l *Log) openDirect() (File, error) {
	if DirectFlags == 0 {
		return nil, errors.ErrUnsupported
	}
	return l.fs.OpenFile(l.path, os.O_RDWR|DirectFlags, 0)
}

// alignedBlock returns n bytes starting on a Block boundary, as O_DIRECT
// requires of buffers.
func alignedBlock(n int) []byte {
	b := make([]byte, n+Block)
	skip := Block - int(uintptr(unsafe.Pointer(&b[0]))%Block)
	return b[skip : skip+n : skip+n]
}

// Rewind starts the next append right after the header, so the file
// stays at its preallocated size, when records were written in this pass
// and applied, the last LSN the caller has applied elsewhere, covers
// all of them; otherwise it does nothing. It reports whether it rewound.
func (l *Log) Rewind(applied uint64) bool {
	if l.off == HeaderLen || applied != l.lsn {
		return false
	}
	// failedEnd stays: a failed append's LSNs were never used, so its
	// bytes could continue the new pass's sequence just as well.
	l.off = HeaderLen
	if l.direct {
		l.tail = append(l.tail[:0], l.hdr...)
	}
	return true
}

// Close closes the file. When clean is set (the caller applied
// everything logged), it marks the header clean at the last LSN, durably,
// so that the next Create reuses the preallocated file; a log that may
// still hold a failed append's records past that LSN (a fence not yet
// written over), or whose mark cannot be written, is removed instead, as
// Create would make it anew anyway.
func (l *Log) Close(clean bool) error {
	err := l.f.Close()
	if !clean || err != nil {
		return err
	}
	if l.failedEnd == 0 && l.markClean() == nil {
		return nil
	}
	if rerr := l.fs.Remove(l.path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		return rerr
	}
	return nil
}

// markClean writes the clean mark into the header through a buffered
// descriptor (the mark is 8 bytes, not a block) and syncs it.
func (l *Log) markClean() error {
	f, err := l.fs.OpenFile(l.path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	var mark [8]byte
	binary.BigEndian.PutUint64(mark[:], cleanMark(l.lsn))
	if _, err := f.WriteAt(mark[:], 24); err != nil {
		return errors.Join(err, f.Close())
	}
	return errors.Join(f.Sync(), f.Close())
}
