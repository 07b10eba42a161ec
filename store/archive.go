package store

import (
	"bytes"
	"compress/flate"
	_ "embed" // the archive dictionary
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
)

// A finished mission is stored as an archive: its mission JSON (uvarint
// length, bytes), then its timeline events in seq order (each uvarint
// seq, uvarint length, bytes), compressed
// together with DEFLATE against a preset dictionary. A 3-step mission's
// ~6 KB of JSON (its record and twelve events) becomes ~0.7 KB, and its
// timeline leaves the timeline bucket, where each event cost a key of its
// own. Live missions stay JSON with their events in the timeline bucket:
// they are rewritten at every step, and only the checkpointer, in the
// background, pays for compression, once per mission.
//
// The dictionary is a mission of the demo's go_home scene with its
// timeline: most of an archive's keys and many of its values
// (device.command, "succeeded", state names) are then found in it. Its
// size is the cost: deflate hashes all of it into every archive's window
// before the archive, and a 15 KB dictionary of two missions compressed
// no better (a 6-step mission of another scene came to the same bytes)
// for a third more CPU per archive.
// Archives name the dictionary they were made with (archiveDict1), and
// the file must never change: TestArchiveDictionaryIsPinned checks it.
//
//go:embed archive_dict.txt
var archiveDict []byte

const archiveDict1 = 1

// archiveLevel: level 3 with the dictionary makes go_home's archive 382
// bytes in ~35 µs; level 6 saves 10% more for 25% more time, and level 1
// (deflate's fast path) ignores preset dictionaries.
const archiveLevel = 3

// compressors keeps one flate writer (~700 KB of tables) between
// checkpoints; an idle gateway's GC takes it back.
var compressors = sync.Pool{New: func() any {
	w, err := flate.NewWriterDict(io.Discard, archiveLevel, archiveDict)
	if err != nil {
		panic(err) // a constant level: cannot happen
	}
	return w
}}

var decompressors = sync.Pool{New: func() any {
	return flate.NewReaderDict(bytes.NewReader(nil), archiveDict)
}}

// appendArchive appends the archive of a mission body and its events to
// dst: the dictionary number, then the compressed stream.
func appendArchive(dst, body []byte, events []eventRec) []byte {
	n := len(body) + binary.MaxVarintLen32
	for _, ev := range events {
		n += len(ev.data) + 2*binary.MaxVarintLen64
	}
	raw := make([]byte, 0, n)
	raw = appendBytes(raw, body)
	for _, ev := range events {
		raw = binary.AppendUvarint(raw, ev.seq)
		raw = appendBytes(raw, ev.data)
	}
	dst = append(dst, archiveDict1)
	buf := bytes.NewBuffer(dst)
	w := compressors.Get().(*flate.Writer)
	w.Reset(buf)
	// Writes to a bytes.Buffer do not fail.
	_, _ = w.Write(raw)
	_ = w.Close()
	w.Reset(io.Discard) // do not keep buf alive in the pool
	compressors.Put(w)
	return buf.Bytes()
}

// archiveReader inflates an archive.
type archiveReader struct {
	fr io.ReadCloser
	br *byteReader
	// max bounds an item's length: DEFLATE expands at most ~1032 times,
	// so a damaged length asks for no more than the archive could hold.
	max uint64
}

// byteReader is the minimum of a buffered reader that binary.ReadUvarint
// needs, over the inflater, without bufio.Reader's 4 KB buffer.
type byteReader struct{ r io.Reader }

func (b *byteReader) ReadByte() (byte, error) {
	var one [1]byte
	_, err := io.ReadFull(b.r, one[:])
	return one[0], err
}

func openArchive(a []byte) (*archiveReader, error) {
	if len(a) < 1 {
		return nil, fmt.Errorf("%w: empty archive", ErrCorrupt)
	}
	if a[0] != archiveDict1 {
		return nil, fmt.Errorf("%w: archive made with dictionary %d, which this build does not have", ErrSchema, a[0])
	}
	fr := decompressors.Get().(io.ReadCloser)
	if err := fr.(flate.Resetter).Reset(bytes.NewReader(a[1:]), archiveDict); err != nil {
		decompressors.Put(fr)
		return nil, fmt.Errorf("%w: archive: %w", ErrCorrupt, err)
	}
	return &archiveReader{fr: fr, br: &byteReader{fr}, max: min(1032*uint64(len(a)), maxArchiveItem)}, nil
}

func (r *archiveReader) close() { decompressors.Put(r.fr) }

// next returns the next item, or nil at the end of the archive.
func (r *archiveReader) next() ([]byte, error) {
	n, err := r.uvarint()
	if errors.Is(err, io.EOF) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	// The inflated size of an archive is bounded by what a log record
	// may hold; a damaged length must not allocate past it.
	if n > r.max {
		return nil, fmt.Errorf("%w: archive item of %d bytes", ErrCorrupt, n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r.fr, b); err != nil {
		return nil, fmt.Errorf("%w: archive: %w", ErrCorrupt, err)
	}
	return b, nil
}

const maxArchiveItem = 64 << 20

func (r *archiveReader) uvarint() (uint64, error) {
	n, err := binary.ReadUvarint(r.br)
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, fmt.Errorf("%w: archive: %w", ErrCorrupt, err)
	}
	return n, err
}

// readArchive returns the mission JSON of an archive and, with events
// set, its events in seq order; without, it inflates only as far as the
// mission.
func readArchive(a []byte, events bool) (body []byte, evs []eventRec, err error) {
	r, err := openArchive(a)
	if err != nil {
		return nil, nil, err
	}
	defer r.close()
	if body, err = r.next(); err == nil && body == nil {
		err = fmt.Errorf("%w: archive without a mission", ErrCorrupt)
	}
	if err != nil || !events {
		return body, nil, err
	}
	for {
		seq, err := r.uvarint()
		if errors.Is(err, io.EOF) {
			return body, evs, nil
		}
		if err != nil {
			return nil, nil, err
		}
		ev, err := r.next()
		if err == nil && ev == nil {
			err = fmt.Errorf("%w: archive: event %d without its bytes", ErrCorrupt, seq)
		}
		if err != nil {
			return nil, nil, err
		}
		evs = append(evs, eventRec{seq: seq, data: ev})
	}
}
