package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
)

// ErrForeign means the log's header names another store: replaying it
// would apply another file's writes (the store file was restored from a
// backup, say).
var ErrForeign = errors.New("write-ahead log belongs to another store file")

// A FormatError means the file at a log's path is not a log this package
// writes: another program's file, or a newer format.
type FormatError struct {
	Path string
}

func (e *FormatError) Error() string { return e.Path + " is not a sortie write-ahead log" }

// Record is one record read back from a log.
type Record struct {
	LSN     uint64
	Payload []byte
}

// Read returns the records of the log at path that belong to the store
// with the given WAL ID, in LSN order; the caller skips those it has
// applied already. A missing file or one without a complete header has
// none, and so does one a clean Close marked. A header naming another
// store is ErrForeign, one with another magic a *FormatError.
func Read(path string, id uint64) ([]Record, error) {
	return ReadOn(OS, path, id)
}

// ReadOn is Read on the file system fsys.
func ReadOn(fsys FS, path string, id uint64) ([]Record, error) {
	// The header first: after a clean close, the usual case, it is all
	// there is to read.
	if hdr, _, err := fsys.Head(path, HeaderLen); err == nil && closedClean(hdr) {
		return nil, nil
	}
	data, err := fsys.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) < HeaderLen || bytes.Equal(data[:HeaderLen], make([]byte, HeaderLen)) {
		// Created but its header never reached the disk: nothing was
		// acknowledged from it.
		return nil, nil
	}
	if !bytes.Equal(data[:len(magic)], magic) && !bytes.Equal(data[:len(magicV1)], magicV1) {
		return nil, &FormatError{Path: path}
	}
	if closedClean(data) {
		return nil, nil
	}
	if got := binary.BigEndian.Uint64(data[16:24]); got != id {
		return nil, fmt.Errorf("%w: %s has WAL ID %016x, the store's is %016x; if the store file was restored from a backup, move the log aside", ErrForeign, path, got, id)
	}
	return Parse(data[HeaderLen:]), nil
}

// Parse reads records from data, the bytes after a header, until the
// first that is incomplete, damaged or out of sequence. It never panics,
// whatever data holds, and the payloads it returns are copies.
func Parse(data []byte) []Record {
	var out []Record
	for len(data) >= FrameLen {
		n := binary.BigEndian.Uint32(data[0:4])
		if n == skipMarker {
			k := binary.BigEndian.Uint32(data[4:8])
			if k >= Block || uint64(len(data)-FrameLen) < uint64(k) ||
				crc32.Checksum(data[0:8], castagn) != binary.BigEndian.Uint32(data[8:12]) {
				break
			}
			data = data[FrameLen+int(k):]
			continue
		}
		if n == 0 || n > MaxRecord || uint64(len(data)-FrameLen) < uint64(n) {
			break
		}
		body := data[8 : FrameLen+int(n)]
		if crc32.Checksum(body, castagn) != binary.BigEndian.Uint32(data[4:8]) {
			break
		}
		lsn := binary.BigEndian.Uint64(data[8:16])
		if len(out) > 0 && lsn != out[len(out)-1].LSN+1 {
			break
		}
		out = append(out, Record{LSN: lsn, Payload: bytes.Clone(data[FrameLen : FrameLen+int(n)])})
		data = data[FrameLen+int(n):]
	}
	return out
}

// ClosedClean reports whether the log at path was closed clean
// (Close(true)), and so holds nothing to replay into any store; false
// for a missing file.
func ClosedClean(path string) (bool, error) {
	hdr, _, err := OS.Head(path, HeaderLen)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return closedClean(hdr), err
}

// closedClean reports whether a log's first bytes are a header a clean
// Close marked: every record in it was applied to the store that closed
// it, whichever store now reads it (a backup copied in by hand gets a
// log it need not refuse).
func closedClean(data []byte) bool {
	return len(data) >= HeaderLen && bytes.Equal(data[:len(magic)], magic) && binary.BigEndian.Uint64(data[24:HeaderLen]) != 0
}
