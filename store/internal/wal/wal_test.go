package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// modes runs f with the log as Create opens it (direct where the file
// system allows O_DIRECT) and with buffered writes and fdatasync, what
// it falls back to elsewhere.
func modes(t *testing.T, f func(t *testing.T, buffered bool)) {
	t.Run("direct", func(t *testing.T) { f(t, false) })
	t.Run("buffered", func(t *testing.T) { f(t, true) })
}

// create makes a log in a fresh directory, with 7 as its WAL ID and no
// LSN used, buffered if asked, and closes it at cleanup.
func create(tb testing.TB, buffered bool) *Log {
	tb.Helper()
	l, err := Create(filepath.Join(tb.TempDir(), "x-wal"), 7, 0, 0o600)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := l.Close(false); err != nil {
			tb.Error(err)
		}
	})
	if buffered {
		if err := l.buffered(); err != nil {
			tb.Fatal(err)
		}
	}
	return l
}

// frame is the record the package doc describes, built from the doc
// rather than from AppendRecord, so the two are checked against each
// other.
func frame(dst []byte, lsn uint64, p []byte) []byte {
	var f [FrameLen]byte
	binary.BigEndian.PutUint32(f[0:4], uint32(len(p)))
	binary.BigEndian.PutUint64(f[8:16], lsn)
	crc := crc32.Update(crc32.Checksum(f[8:16], crc32.MakeTable(crc32.Castagnoli)), crc32.MakeTable(crc32.Castagnoli), p)
	binary.BigEndian.PutUint32(f[4:8], crc)
	return append(append(dst, f[:]...), p...)
}

// sized returns a payload that makes a record of n bytes, frame included.
func sized(n int, fill byte) []byte {
	return bytes.Repeat([]byte{fill}, n-FrameLen)
}

func mustAppend(tb testing.TB, l *Log, payloads ...[]byte) uint64 {
	tb.Helper()
	first, err := l.Append(payloads)
	if err != nil {
		tb.Fatal(err)
	}
	return first
}

func mustRead(tb testing.TB, l *Log) []Record {
	tb.Helper()
	recs, err := Read(l.path, 7)
	if err != nil {
		tb.Fatal(err)
	}
	return recs
}

func lsnsOf(recs []Record) []uint64 {
	out := make([]uint64, len(recs))
	for i, r := range recs {
		out[i] = r.LSN
	}
	return out
}

func sameLSNs(tb testing.TB, what string, got, want []uint64) {
	tb.Helper()
	if !slices.Equal(got, want) {
		tb.Errorf("%s: got %v, want %v", what, got, want)
	}
}

// failAfterWriting appends payloads as an Append whose write reached the
// disk but whose sync then failed would: the bytes are in the file, the
// log's offset and LSN stay, and it records how far the bytes reach.
func failAfterWriting(tb testing.TB, l *Log, payloads ...[]byte) {
	tb.Helper()
	twin := *l
	twin.tail = bytes.Clone(l.tail)
	twin.buf, twin.blk = nil, nil
	if _, err := twin.Append(payloads); err != nil {
		tb.Fatal(err)
	}
	// What Append's error path records (TestFailedAppendFencesLaterAppends
	// checks that it does).
	l.failedEnd = twin.recEnd
}

// TestAppendWritesDocumentedFormat: the header and records are laid out
// as the package doc says, LSNs continue from Create's across appends,
// and Read returns what Append wrote.
func TestAppendWritesDocumentedFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x-wal")
	l, err := Create(path, 0xfeed, 41, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := l.Close(true); err != nil {
			t.Error(err)
		}
	}()
	payloads := [][]byte{[]byte("a"), bytes.Repeat([]byte("b"), 300), []byte("ccc")}
	if first := mustAppend(t, l, payloads[:1]...); first != 42 {
		t.Fatalf("first LSN = %d, want 42", first)
	}
	if first := mustAppend(t, l, payloads[1:]...); first != 43 {
		t.Fatalf("first LSN = %d, want 43", first)
	}
	// Each append ends its block with a skip frame over the rest of it.
	want := frame(nil, 42, payloads[0])
	want = AppendSkip(want, Block-HeaderLen-len(want)-FrameLen)
	want = frame(want, 43, payloads[1])
	want = frame(want, 44, payloads[2])
	want = AppendSkip(want, 2*Block-HeaderLen-len(want)-FrameLen)
	if l.Offset() != HeaderLen+int64(len(want)) || l.LSN() != 44 {
		t.Errorf("after appends offset=%d LSN=%d, want %d and 44", l.Offset(), l.LSN(), HeaderLen+len(want))
	}
	if skip := want[17 : 17+FrameLen]; !bytes.Equal(skip[:4], []byte{0xff, 0xff, 0xff, 0xff}) ||
		binary.BigEndian.Uint32(skip[4:8]) != uint32(Block-HeaderLen-17-FrameLen) ||
		binary.BigEndian.Uint32(skip[8:12]) != crc32.Checksum(skip[:8], crc32.MakeTable(crc32.Castagnoli)) ||
		!bytes.Equal(skip[12:16], make([]byte, 4)) {
		t.Errorf("skip frame = % x, want the marker, the bytes it skips, their CRC and zeros", skip)
	}
	if got := AppendRecord(nil, 42, payloads[0]); !bytes.Equal(got, frame(nil, 42, payloads[0])) {
		t.Errorf("AppendRecord = %x, want %x", got, frame(nil, 42, payloads[0]))
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) != Prealloc {
		t.Errorf("file is %d bytes, want the %d preallocated", len(data), Prealloc)
	}
	if !bytes.HasPrefix(data, []byte("SORTIE-WAL\x00\x00\x00\x00\x00\x02")) || binary.BigEndian.Uint64(data[16:24]) != 0xfeed || !bytes.Equal(data[24:32], make([]byte, 8)) {
		t.Errorf("header = %x", data[:HeaderLen])
	}
	if got := data[HeaderLen : HeaderLen+len(want)]; !bytes.Equal(got, want) {
		t.Fatalf("records:\ngot  %x\nwant %x", got, want)
	}
	if rest := data[HeaderLen+len(want):]; !bytes.Equal(rest[:FrameLen], make([]byte, FrameLen)) {
		t.Errorf("no zero frame after the records: % x", rest[:FrameLen])
	}
	recs, err := Read(path, 0xfeed)
	if err != nil {
		t.Fatal(err)
	}
	sameLSNs(t, "LSNs read", lsnsOf(recs), []uint64{42, 43, 44})
	for i, r := range recs {
		if !bytes.Equal(r.Payload, payloads[i]) {
			t.Errorf("record %d payload %q, want %q", r.LSN, r.Payload, payloads[i])
		}
	}
	if Path("/data/sortie.db") != "/data/sortie.db-wal" {
		t.Errorf("Path = %q", Path("/data/sortie.db"))
	}
}

// TestReadHeader: a log whose creation never completed has no records;
// a header naming another store, or another format, is refused.
func TestReadHeader(t *testing.T) {
	dir := t.TempDir()
	l, err := Create(filepath.Join(dir, "a-wal"), 7, 0, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	mustAppend(t, l, []byte("one"))
	if err := l.Close(false); err != nil {
		t.Fatal(err)
	}
	good, err := os.ReadFile(l.path)
	if err != nil {
		t.Fatal(err)
	}
	good = good[:Block]
	var formatErr *FormatError
	for _, tc := range []struct {
		name    string
		log     []byte // nil: no file
		records int
		want    func(error) bool
	}{
		{"no file", nil, 0, nil},
		{"empty", []byte{}, 0, nil},
		{"short header", good[:HeaderLen-1], 0, nil},
		{"zero header before records", append(make([]byte, HeaderLen), good[HeaderLen:]...), 0, nil},
		{"intact", good, 1, nil},
		{"another store's", append(binary.BigEndian.AppendUint64(bytes.Clone(good[:16]), 8), good[24:]...), 0, func(err error) bool { return errors.Is(err, ErrForeign) }},
		{"unknown magic", append([]byte("NOT-A-SORTIE-LOG"), good[16:]...), 0, func(err error) bool { return errors.As(err, &formatErr) }},
		{"version 1, without skip frames", append(append(bytes.Clone(good[:15]), 1), good[16:]...), 1, nil},
		{"newer version", append(append(bytes.Clone(good[:15]), 3), good[16:]...), 0, func(err error) bool { return errors.As(err, &formatErr) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "x-wal")
			if tc.log != nil {
				if err := os.WriteFile(path, tc.log, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			recs, err := Read(path, 7)
			switch {
			case tc.want == nil && err != nil:
				t.Fatalf("Read = %v", err)
			case tc.want != nil && (err == nil || !tc.want(err)):
				t.Fatalf("Read = %d records, %v; want the error", len(recs), err)
			case len(recs) != tc.records:
				t.Errorf("Read = %d records, want %d", len(recs), tc.records)
			}
			if err != nil && !bytes.Contains([]byte(err.Error()), []byte(path)) {
				t.Errorf("error %q does not name %s", err, path)
			}
		})
	}
}

// TestAppendAcrossBlocks: appends of every size, crossing block
// boundaries (which direct writes handle by rewriting the tail of the
// current block), with rewinds between passes, always read back as
// exactly the records appended since the last rewind.
func TestAppendAcrossBlocks(t *testing.T) {
	modes(t, func(t *testing.T, buffered bool) {
		seed := uint64(time.Now().UnixNano())
		t.Logf("seed %d", seed)
		rng := rand.New(rand.NewPCG(seed, seed>>1))
		l := create(t, buffered)
		t.Logf("direct writes: %v", l.Direct())
		var want []Record
		for round := range 32 {
			if round%8 == 7 {
				if !l.Rewind(l.LSN()) {
					t.Fatal("Rewind with everything applied did not rewind")
				}
				want = nil
			}
			batch := make([][]byte, 1+rng.IntN(3))
			for i := range batch {
				n := 1 + rng.IntN(3*Block)
				if rng.IntN(4) == 0 {
					n = 1 + rng.IntN(64)
				}
				batch[i] = make([]byte, n)
				for j := range batch[i] {
					batch[i][j] = byte(rng.Uint32())
				}
			}
			first := mustAppend(t, l, batch...)
			for i, p := range batch {
				want = append(want, Record{LSN: first + uint64(i), Payload: p})
			}
			got := mustRead(t, l)
			if len(got) != len(want) {
				t.Fatalf("round %d (seed %d): read LSNs %v, want %v", round, seed, lsnsOf(got), lsnsOf(want))
			}
			for i := range got {
				if got[i].LSN != want[i].LSN || !bytes.Equal(got[i].Payload, want[i].Payload) {
					t.Fatalf("round %d (seed %d): record %d differs", round, seed, want[i].LSN)
				}
			}
		}
	})
}

// TestRewindNeedsEverythingApplied: Rewind refuses while a record the
// caller has not applied is in the pass, or when the pass is empty.
func TestRewindNeedsEverythingApplied(t *testing.T) {
	l := create(t, false)
	if l.Rewind(0) {
		t.Error("Rewind of an empty pass rewound")
	}
	mustAppend(t, l, []byte("one"), []byte("two"))
	if l.Rewind(1) {
		t.Error("Rewind with LSN 2 not applied rewound")
	}
	if !l.Rewind(2) || l.Offset() != HeaderLen {
		t.Errorf("Rewind with everything applied: offset %d, want %d", l.Offset(), HeaderLen)
	}
	if first := mustAppend(t, l, []byte("three")); first != 3 {
		t.Errorf("first LSN after a rewind = %d, want 3", first)
	}
}

// TestRewoundPassHidesEarlierOne: the records of an earlier pass that
// the new one does not overwrite are never read back, even where a frame
// boundary lines up with one of them.
func TestRewoundPassHidesEarlierOne(t *testing.T) {
	modes(t, func(t *testing.T, buffered bool) {
		l := create(t, buffered)
		const size = (Block - HeaderLen) / 2 // two records fill the first block
		for i := range 5 {
			mustAppend(t, l, sized(size, byte('a'+i))) // LSNs 1 to 5
		}
		l.Rewind(5)
		mustAppend(t, l, sized(size, 'x')) // LSN 6, over LSN 1
		mustAppend(t, l, sized(size, 'y')) // LSN 7, over LSN 2
		data, err := os.ReadFile(l.path)
		if err != nil {
			t.Fatal(err)
		}
		// Every append took a block of its own; the pass's two are
		// followed by the earlier pass's third.
		sameLSNs(t, "stale records behind the pass", lsnsOf(Parse(data[l.Offset():])), []uint64{3, 4, 5})
		sameLSNs(t, "log", lsnsOf(mustRead(t, l)), []uint64{6, 7})
	})
}

// TestAppendRefusesRecordsReadingWouldDrop: a payload Read would stop at
// (empty, or longer than MaxRecord) is refused rather than acknowledged
// and lost at the next replay.
func TestAppendRefusesRecordsReadingWouldDrop(t *testing.T) {
	l := create(t, false)
	for _, p := range [][]byte{{}, make([]byte, MaxRecord+1)} {
		if _, err := l.Append([][]byte{[]byte("ok"), p}); err == nil {
			t.Errorf("Append of a %d-byte payload succeeded", len(p))
		}
	}
	if l.LSN() != 0 || l.Offset() != HeaderLen {
		t.Errorf("refused appends moved the log: LSN %d offset %d", l.LSN(), l.Offset())
	}
	if recs := mustRead(t, l); len(recs) != 0 {
		t.Errorf("refused appends left LSNs %v", lsnsOf(recs))
	}
}

// TestFailedAppendFencesLaterAppends: an append that fails remembers how
// far its bytes may reach, and the appends after it end with a zero frame
// until the log is written past that point.
func TestFailedAppendFencesLaterAppends(t *testing.T) {
	l := create(t, false)
	big := bytes.Repeat([]byte("b"), 3000)
	mustAppend(t, l, []byte("first"))
	off, lsn := l.off, l.lsn
	good := l.f
	bad, err := os.Open(l.path) // read-only: the write fails
	if err != nil {
		t.Fatal(err)
	}
	l.f = osFile{bad}
	if _, err := l.Append([][]byte{big}); err == nil {
		t.Fatal("append on a read-only file succeeded")
	}
	l.f = good
	if err := bad.Close(); err != nil {
		t.Fatal(err)
	}
	if l.off != off || l.lsn != lsn {
		t.Fatalf("failed append moved the log: offset %d LSN %d, want %d %d", l.off, l.lsn, off, lsn)
	}
	if l.failedEnd < off+int64(FrameLen+len(big)) {
		t.Fatalf("failedEnd = %d, want at least %d", l.failedEnd, off+int64(FrameLen+len(big)))
	}
	// Shorter than the failed batch: ends with a zero frame.
	mustAppend(t, l, []byte("second"))
	data, err := os.ReadFile(l.path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data[l.off:l.off+FrameLen], make([]byte, FrameLen)) {
		t.Errorf("no zero frame after the records while failed bytes may follow: % x", data[l.off:l.off+FrameLen])
	}
	// Written past the failed range: no longer needed.
	mustAppend(t, l, big)
	if l.failedEnd != 0 {
		t.Errorf("failedEnd = %d after the log passed it, want 0", l.failedEnd)
	}
	if recs := mustRead(t, l); len(recs) != 3 {
		t.Fatalf("read LSNs %v, want 1 to 3", lsnsOf(recs))
	}
}

// TestFailedAppendNotReadBack: an append that fails leaves the offset
// and LSNs for the next one to reuse. When the failed append's bytes did
// land (fdatasync reported an error after the write, or the write was
// short), and the next append is shorter and ends on a frame boundary of
// the failed one, the failed batch's later records would continue the
// LSN sequence and be read back after a crash: a write the caller was
// told failed would override an acknowledged one.
func TestFailedAppendNotReadBack(t *testing.T) {
	modes(t, func(t *testing.T, buffered bool) {
		l := create(t, buffered)
		mustAppend(t, l, sized(100, 'c')) // LSN 1
		start := l.Offset()
		// A failed batch of two, the first ending on a block boundary, so
		// a direct write of a record in its place pads nothing after it.
		first := sized(Block-int(start%Block), 'p')
		failAfterWriting(t, l, first, sized(200, 'q'))
		// The caller, told both failed, logs LSN 2 again, differently, in
		// a record of the same size.
		mustAppend(t, l, sized(len(first)+FrameLen, 'r'))
		if boundary := start + int64(len(first)+FrameLen); l.Offset() != boundary {
			t.Fatalf("test premise: the retry ends at %d, not on the failed batch's frame boundary %d", l.Offset(), boundary)
		}
		recs := mustRead(t, l)
		sameLSNs(t, "log", lsnsOf(recs), []uint64{1, 2})
		if len(recs) == 2 && recs[1].Payload[0] != 'r' {
			t.Errorf("LSN 2 read back as the failed write %q..., want the retry", recs[1].Payload[:1])
		}
	})
}

// TestRewindAfterFailedAppendKeepsFence: a failed append's records carry
// the LSNs the next append reuses. When everything before them was
// applied, the next commit rewinds; the new pass must still end with a
// zero frame, or, ending on a frame boundary of the failed batch, it is
// continued by the failed batch's later records, and a crash replays a
// write its caller was told had failed.
//
// Found by review: Rewind used to clear failedEnd, so the new pass wrote
// no zero frame.
func TestRewindAfterFailedAppendKeepsFence(t *testing.T) {
	modes(t, func(t *testing.T, buffered bool) {
		l := create(t, buffered)
		mustAppend(t, l, sized(100, 'c')) // LSN 1, applied
		// The failed batch, LSNs 2 and 3, its first record ending on a
		// block boundary.
		failAfterWriting(t, l, sized(Block-HeaderLen-100, 'p'), sized(200, 'q'))
		if !l.Rewind(1) {
			t.Fatal("test premise: Rewind with everything applied did not rewind")
		}
		// The retry of LSN 2 fills the first block, ending where the
		// failed LSN 3 starts.
		mustAppend(t, l, sized(Block-HeaderLen, 'r'))
		if l.Offset() != Block {
			t.Fatalf("test premise: offset %d after the rewound append, want %d", l.Offset(), Block)
		}
		sameLSNs(t, "log", lsnsOf(mustRead(t, l)), []uint64{2})
	})
}

// TestDirectRefusedFallsBack: a file system that accepts O_DIRECT at
// open but refuses the writes (EINVAL: here, a misaligned buffer stands
// in for a larger block size) gets buffered writes instead of a log that
// fails every append.
func TestDirectRefusedFallsBack(t *testing.T) {
	l := create(t, false)
	if !l.Direct() {
		t.Skip("this file system refuses O_DIRECT at open")
	}
	l.blk = make([]byte, 3*Block+1)[1:] // misaligned: O_DIRECT refuses it
	if _, err := l.Append([][]byte{[]byte("first"), []byte("second")}); err != nil {
		t.Fatalf("append after a refused direct write: %v", err)
	}
	if l.Direct() {
		t.Error("still writing O_DIRECT after EINVAL")
	}
	mustAppend(t, l, []byte("third"))
	recs := mustRead(t, l)
	if len(recs) != 3 || string(recs[2].Payload) != "third" {
		t.Fatalf("read LSNs %v, want the three records", lsnsOf(recs))
	}
}

// TestCleanCloseKeepsTheFileForTheNextCreate: Close(true) keeps the
// preallocated file, marked clean at its last LSN, and a Create that
// continues from that LSN reuses it: the old records stay behind the new
// pass and are never read back, and the mark is cleared before the first
// append, so a crash from then on is replayed as usual.
func TestCleanCloseKeepsTheFileForTheNextCreate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x-wal")
	l, err := Create(path, 7, 0, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	mustAppend(t, l, []byte("one"))
	mustAppend(t, l, []byte("two"))
	if err := l.Close(true); err != nil {
		t.Fatal(err)
	}
	data := mustReadFile(t, path)
	if got := binary.BigEndian.Uint64(data[24:32]); got != 3 {
		t.Fatalf("clean mark %d after a clean close at LSN 2, want 3", got)
	}
	// Nothing to replay, whichever store reads it (one restored from a
	// backup by hand has another WAL ID).
	for _, id := range []uint64{7, 8} {
		if recs, err := Read(path, id); err != nil || len(recs) != 0 {
			t.Errorf("Read of a log closed clean, as store %d: LSNs %v, %v; want none and no error", id, lsnsOf(recs), err)
		}
	}

	l, err = Create(path, 7, 2, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	data = mustReadFile(t, path)
	if got := binary.BigEndian.Uint64(data[24:32]); got != 0 {
		t.Errorf("clean mark %d once reopened, want 0", got)
	}
	// Each append took a block: the second's is as it was (clearing the
	// mark writes at most the first block).
	if recs := Parse(data[Block:]); len(recs) != 1 || recs[0].LSN != 2 {
		t.Errorf("the reused file's second block holds LSNs %v, want the last pass's 2 (not rewritten)", lsnsOf(recs))
	}
	mustAppend(t, l, []byte("three"))
	if recs := mustRead(t, l); len(recs) != 1 || recs[0].LSN != 3 || string(recs[0].Payload) != "three" {
		t.Errorf("read LSNs %v after one append to the reused file, want [3]", lsnsOf(recs))
	}
	if err := l.Close(false); err != nil {
		t.Fatal(err)
	}
	if got := binary.BigEndian.Uint64(mustReadFile(t, path)[24:32]); got != 0 {
		t.Errorf("clean mark %d after Close(false), want 0", got)
	}

	// Not marked (Close(false), as after a crash): created anew.
	l, err = Create(path, 7, 3, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if recs := Parse(mustReadFile(t, path)[HeaderLen:]); len(recs) != 0 {
		t.Errorf("a log closed unclean was reused: it holds LSNs %v", lsnsOf(recs))
	}
	mustAppend(t, l, []byte("four"))
	if err := l.Close(true); err != nil {
		t.Fatal(err)
	}
	// Marked at another LSN than the store's (a store file from
	// elsewhere): created anew.
	l, err = Create(path, 7, 9, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if recs := Parse(mustReadFile(t, path)[HeaderLen:]); len(recs) != 0 {
		t.Errorf("a log marked clean at LSN 4 was reused at 9: it holds LSNs %v", lsnsOf(recs))
	}
	if err := l.Close(false); err != nil {
		t.Fatal(err)
	}
}

// TestCleanCloseRemovesALogWithAFence: a log that may still hold a
// failed append's records past its last LSN is not kept for reuse (they
// could continue the next pass's sequence); Close(false) keeps any log.
func TestCleanCloseRemovesALogWithAFence(t *testing.T) {
	for _, clean := range []bool{false, true} {
		l, err := Create(filepath.Join(t.TempDir(), "x-wal"), 7, 0, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		mustAppend(t, l, []byte("one"))
		failAfterWriting(t, l, []byte("failed"))
		if err := l.Close(clean); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(l.path); errors.Is(err, os.ErrNotExist) != clean {
			t.Errorf("Close(%v) with a fence: Stat = %v", clean, err)
		}
	}
}

func mustReadFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
