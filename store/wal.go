package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"slices"
	"syscall"
	"unsafe"
)

// The write-ahead log makes a Create or Save durable with one synchronous
// append (an O_DIRECT|O_DSYNC write, or a write and an fdatasync), where
// a bbolt commit costs two fsyncs (data pages, then the meta page) plus
// the pages of every bucket it touches. bbolt stays the store
// of record: a checkpoint applies logged writes to it in one transaction
// per batch, off the callers' path, and records the last applied LSN in
// the same transaction, so replay after a crash applies each write once.
// It is the layout etcd uses in front of its own bbolt backend.
//
// File layout:
//
//	[0:16]   magic "SORTIE-WAL\x00\x00\x00\x00\x00\x01"
//	[16:24]  the store's WAL ID (meta "wal_id"), big-endian
//	[24:32]  zero
//	then records, each:
//	[0:4]    payload length, big-endian
//	[4:8]    CRC-32C of bytes [8:] of the record
//	[8:16]   LSN, big-endian
//	[16:]    payload (see encodeWrite)
//
// Records run contiguously from the header; LSNs rise by one. Once every
// record has been checkpointed, writing starts over after the header, so
// the file stays at its preallocated size. Reading stops at the first
// record that is short, fails its CRC or does not continue the LSN
// sequence: a torn tail (never acknowledged, since a write returns only
// once it is durable) or the remains of an earlier pass, whose LSNs are
// all lower. The one exception, a failed append's records, which carry
// the LSNs the next append reuses, is fenced off by zero frames (see
// append).
const (
	walHeaderLen = 32
	walFrameLen  = 16
	// walPrealloc is written up front: overwriting written blocks needs
	// no file-size or extent update in each sync.
	walPrealloc = 4 << 20
	// walLimit bounds the file: under a steady load the background
	// checkpoint rarely finds the log empty, which a rewind needs, so past
	// it the next commit checkpoints first (a few milliseconds, once per
	// walLimit of log) and rewinds.
	walLimit = walPrealloc
	// walMaxRecord refuses absurd lengths when reading a damaged file.
	walMaxRecord = 64 << 20
)

var (
	walMagic = []byte("SORTIE-WAL\x00\x00\x00\x00\x00\x01")
	castagn  = crc32.MakeTable(crc32.Castagnoli)

	kWALID  = []byte("wal_id")
	kWALLSN = []byte("wal_lsn")
)

// walFile is the open log. Only the commit leader appends, and only
// under DB.wmu, so it needs no lock of its own.
type walFile struct {
	f    *os.File
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

	// failedEnd is where bytes of a failed append may reach, until the
	// log has been written past them; zero otherwise.
	failedEnd int64
}

// walBlock is the alignment of direct writes: the largest logical block
// size in use, so it suits 512-byte devices too.
const walBlock = 4096

// walPath is the log beside the store file, as SQLite names its own.
func walPath(path string) string { return path + "-wal" }

// walRecord is one logged write read back from the file.
type walRecord struct {
	lsn     uint64
	payload []byte
}

// readWAL returns the records of the log at path that belong to the store
// with the given WAL ID, in LSN order. A missing file or one without a
// complete header has none. A header naming another store is
// ErrForeignLog: replaying it would apply another file's writes.
func readWAL(path string, id uint64) ([]walRecord, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) < walHeaderLen || bytes.Equal(data[:walHeaderLen], make([]byte, walHeaderLen)) {
		// Created but its header never reached the disk: nothing was
		// acknowledged from it.
		return nil, nil
	}
	if !bytes.Equal(data[:len(walMagic)], walMagic) {
		return nil, fmt.Errorf("%w: %s is not a sortie write-ahead log", ErrCorrupt, path)
	}
	if got := binary.BigEndian.Uint64(data[16:24]); got != id {
		return nil, fmt.Errorf("%w: %s has WAL ID %016x, the store's is %016x; if the store file was restored from a backup, move the log aside", ErrForeignLog, path, got, id)
	}
	return parseRecords(data[walHeaderLen:]), nil
}

// parseRecords reads records until the first that is incomplete, damaged
// or out of sequence. It never panics, whatever data holds.
func parseRecords(data []byte) []walRecord {
	var out []walRecord
	for len(data) >= walFrameLen {
		n := binary.BigEndian.Uint32(data[0:4])
		if n == 0 || n > walMaxRecord || uint64(len(data)-walFrameLen) < uint64(n) {
			break
		}
		body := data[8 : walFrameLen+int(n)]
		if crc32.Checksum(body, castagn) != binary.BigEndian.Uint32(data[4:8]) {
			break
		}
		lsn := binary.BigEndian.Uint64(data[8:16])
		if len(out) > 0 && lsn != out[len(out)-1].lsn+1 {
			break
		}
		out = append(out, walRecord{lsn: lsn, payload: bytes.Clone(data[walFrameLen : walFrameLen+int(n)])})
		data = data[walFrameLen+int(n):]
	}
	return out
}

// createWAL (re)creates the log at path for the store with the given ID,
// empty, with lsn as the last LSN already used. The header is durable
// before it returns, so no record is ever written behind a missing one.
func createWAL(path string, id, lsn uint64, mode os.FileMode) (*walFile, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	hdr := make([]byte, walHeaderLen)
	copy(hdr, walMagic)
	binary.BigEndian.PutUint64(hdr[16:24], id)
	// Zeros rather than fallocate's unwritten extents: the first write to
	// an unwritten extent also commits the file system's journal.
	fill := make([]byte, walPrealloc)
	copy(fill, hdr)
	if _, err := f.WriteAt(fill, 0); err != nil {
		f.Close()
		return nil, fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, fmt.Errorf("sync %s: %w", path, err)
	}
	if err := syncDir(path); err != nil {
		f.Close()
		return nil, fmt.Errorf("sync directory of %s: %w", path, err)
	}
	w := &walFile{f: f, path: path, off: walHeaderLen, lsn: lsn, hdr: hdr}
	if df, err := openDirect(path); err == nil {
		f.Close()
		w.f, w.direct = df, true
		w.tail = append(w.tail, hdr...)
	}
	return w, nil
}

// append writes the payloads as consecutive records and makes them
// durable. It returns the LSN of the first. On failure the offset and
// LSN are not advanced, so the next append takes the same place and
// LSNs; but the failed bytes may have landed, and if the next batch is
// shorter, the failed one's later records would continue the sequence
// and be replayed as if acknowledged. So until the log is written past
// them, every append ends with a zero frame, where reading stops.
func (w *walFile) append(payloads [][]byte) (uint64, error) {
	w.buf = w.buf[:0]
	first := w.lsn + 1
	for i, p := range payloads {
		start := len(w.buf)
		w.buf = binary.BigEndian.AppendUint32(w.buf, uint32(len(p)))
		w.buf = append(w.buf, 0, 0, 0, 0)
		w.buf = binary.BigEndian.AppendUint64(w.buf, first+uint64(i))
		w.buf = append(w.buf, p...)
		binary.BigEndian.PutUint32(w.buf[start+4:start+8], crc32.Checksum(w.buf[start+8:], castagn))
	}
	records := len(w.buf)
	if w.failedEnd > w.off+int64(records) {
		w.buf = append(w.buf, make([]byte, walFrameLen)...)
	}
	err := w.write(records)
	if err != nil && w.direct && errors.Is(err, syscall.EINVAL) {
		// A file system that took O_DIRECT at open but refuses these
		// writes (a block size above walBlock): go buffered for good.
		if berr := w.buffered(); berr == nil {
			err = w.write(records)
		}
	}
	if err != nil {
		// A direct write's padding is zeros, where reading stops anyway.
		w.failedEnd = max(w.failedEnd, w.off+int64(len(w.buf)))
		// The outcome is unknown: the bytes may be on disk. Fence them
		// off now, so that a crash before the next append cannot replay
		// writes their callers were told failed; if even that fails, the
		// caller may see them again after a restart.
		w.fence()
		return 0, err // it names the file
	}
	w.off += int64(records)
	if w.off >= w.failedEnd {
		w.failedEnd = 0
	}
	w.lsn = first + uint64(len(payloads)) - 1
	return first, nil
}

// write writes buf at off, durably; records is the length of its records.
func (w *walFile) write(records int) error {
	if w.direct {
		return w.writeDirect(records)
	}
	if _, err := w.f.WriteAt(w.buf, w.off); err != nil {
		return err
	}
	if err := datasync(w.f); err != nil {
		return fmt.Errorf("sync %s: %w", w.path, err)
	}
	return nil
}

// fence writes a zero frame at off, durably, where reading stops.
func (w *walFile) fence() {
	w.buf = append(w.buf[:0], make([]byte, walFrameLen)...)
	_ = w.write(0)
}

// buffered reopens the log for buffered writes and fdatasync.
func (w *walFile) buffered() error {
	f, err := os.OpenFile(w.path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	w.f.Close()
	w.f, w.direct, w.tail = f, false, nil
	return nil
}

// writeDirect writes tail and buf from the start of off's block, padded
// with zeros to whole blocks, and keeps as the new tail what precedes the
// end of buf's first n bytes (its records). The bytes before off are the
// ones already on disk, so rewriting them changes nothing a torn write
// could lose.
func (w *walFile) writeDirect(n int) error {
	start := w.off - int64(len(w.tail))
	total := len(w.tail) + len(w.buf)
	size := (total + walBlock - 1) / walBlock * walBlock
	if len(w.blk) < size {
		w.blk = alignedBlock(size * 2)
	}
	blk := w.blk[:size]
	copy(blk, w.tail)
	copy(blk[len(w.tail):], w.buf)
	clear(blk[total:])
	if _, err := w.f.WriteAt(blk, start); err != nil {
		return err
	}
	end := len(w.tail) + n
	w.tail = append(w.tail[:0], blk[end-end%walBlock:end]...)
	return nil
}

// alignedBlock returns n bytes starting on a walBlock boundary, as
// O_DIRECT requires of buffers.
func alignedBlock(n int) []byte {
	b := make([]byte, n+walBlock)
	skip := walBlock - int(uintptr(unsafe.Pointer(&b[0]))%walBlock)
	return b[skip : skip+n : skip+n]
}

// rewind starts the next append right after the header. The caller
// guarantees every record written so far is checkpointed.
func (w *walFile) rewind() {
	// failedEnd stays: a failed append's LSNs were never used, so its
	// bytes could continue the new pass's sequence just as well.
	w.off = walHeaderLen
	if w.direct {
		w.tail = append(w.tail[:0], w.hdr...)
	}
}

// close closes the file and, when remove is set (everything was
// checkpointed), deletes it so a stopped store is one file again.
func (w *walFile) close(remove bool) error {
	err := w.f.Close()
	if remove && err == nil {
		if rerr := os.Remove(w.path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			err = rerr
		}
	}
	return err
}

// Record payloads: one Create or Save, everything a checkpoint needs to
// apply it to bbolt without the caller.
//
//	flags      1 byte: 1 = create
//	id         uvarint length + bytes
//	reqKey     uvarint length + bytes
//	version    uvarint
//	finished   8 bytes big-endian
//	seq        uvarint
//	body       uvarint length + bytes (the mission JSON)
//	events     uvarint count, then each: uvarint seq, uvarint length + bytes
//	outbox     uvarint count, then each: uvarint length + bytes
//	obFirst    uvarint: the first outbox entry's seq (0 without entries)
func encodeWrite(dst []byte, w *write) []byte {
	dst = slices.Grow(dst, w.sizeBound())
	var flags byte
	if w.create {
		flags = 1
	}
	dst = append(dst, flags)
	dst = appendBytes(dst, []byte(w.id))
	dst = appendBytes(dst, []byte(w.reqKey))
	dst = binary.AppendUvarint(dst, w.version)
	dst = binary.BigEndian.AppendUint64(dst, w.finished)
	dst = binary.AppendUvarint(dst, w.seq)
	dst = appendBytes(dst, w.body)
	dst = binary.AppendUvarint(dst, uint64(len(w.events)))
	for _, ev := range w.events {
		dst = binary.AppendUvarint(dst, ev.seq)
		dst = appendBytes(dst, ev.data)
	}
	dst = binary.AppendUvarint(dst, uint64(len(w.outbox)))
	for _, v := range w.outbox {
		dst = appendBytes(dst, v)
	}
	return binary.AppendUvarint(dst, w.obFirst)
}

// sizeBound is at least the length encodeWrite gives w: each field's
// bytes plus generous room for its length prefix.
func (w *write) sizeBound() int {
	n := 64 + len(w.id) + len(w.reqKey) + len(w.body)
	for _, ev := range w.events {
		n += 16 + len(ev.data)
	}
	for _, v := range w.outbox {
		n += 16 + len(v)
	}
	return n
}

func appendBytes(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

// decodeWrite reads a payload encodeWrite made. It never panics: a
// malformed payload (which the CRC makes unlikely) is an ErrCorrupt.
func decodeWrite(p []byte) (*write, error) {
	r := payloadReader{b: p}
	w := &write{}
	flags := r.byte()
	w.create = flags&1 != 0
	w.id = string(r.bytes())
	w.reqKey = string(r.bytes())
	w.version = r.uvarint()
	w.finished = r.uint64()
	w.seq = r.uvarint()
	w.body = r.bytes()
	nev := r.count()
	for range nev {
		seq := r.uvarint()
		w.events = append(w.events, eventRec{seq: seq, data: r.bytes()})
	}
	nout := r.count()
	for range nout {
		w.outbox = append(w.outbox, r.bytes())
	}
	w.obFirst = r.uvarint()
	switch {
	case r.err != nil:
		return nil, fmt.Errorf("%w: log record: %w", ErrCorrupt, r.err)
	case len(r.b) != 0:
		return nil, fmt.Errorf("%w: log record: %d trailing bytes", ErrCorrupt, len(r.b))
	case w.id == "":
		return nil, fmt.Errorf("%w: log record without a mission ID", ErrCorrupt)
	}
	return w, nil
}

type payloadReader struct {
	b   []byte
	err error
}

func (r *payloadReader) fail() {
	if r.err == nil {
		r.err = io.ErrUnexpectedEOF
	}
	r.b = nil
}

func (r *payloadReader) byte() byte {
	if len(r.b) < 1 {
		r.fail()
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *payloadReader) uint64() uint64 {
	if len(r.b) < 8 {
		r.fail()
		return 0
	}
	v := binary.BigEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

func (r *payloadReader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail()
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *payloadReader) bytes() []byte {
	n := r.uvarint()
	if n > uint64(len(r.b)) {
		r.fail()
		return nil
	}
	out := r.b[:n:n]
	r.b = r.b[n:]
	return out
}

// count reads a list length, bounded by what the remaining bytes could
// hold (every element takes at least one byte), so a damaged count cannot
// make the loop run or allocate beyond the payload.
func (r *payloadReader) count() uint64 {
	n := r.uvarint()
	if n > uint64(len(r.b)) {
		r.fail()
		return 0
	}
	return n
}
