package wal

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"
)

// FuzzParse feeds arbitrary bytes to the record reader, which reads
// whatever a crash left on disk: it must never panic, must return only
// records with consecutive LSNs that frame back to the very bytes it
// read, and must return records framed as Append frames them, whatever
// follows them.
func FuzzParse(f *testing.F) {
	var good []byte
	for i, p := range []string{"one", "two", strings.Repeat("three", 100)} {
		good = AppendRecord(good, 7+uint64(i), []byte(p))
	}
	f.Add(good, uint64(1), []byte{3, 1, 200})
	f.Add(good[:len(good)-1], uint64(7), []byte{0})
	f.Add(append(bytes.Clone(good), good...), ^uint64(0), []byte{255, 255})
	f.Add(make([]byte, 64), uint64(0), []byte{})
	f.Add([]byte{}, uint64(5), []byte{1, 2, 3})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, uint64(1), []byte{10})
	f.Add(AppendRecord(AppendRecord(nil, 1, []byte("a")), 3, []byte("b")), uint64(2), []byte{})
	f.Add(AppendRecord(AppendSkip(AppendRecord(nil, 1, []byte("a")), 40), 2, []byte("b")), uint64(3), []byte{4})
	f.Add(AppendSkip(nil, Block), uint64(1), []byte{})
	f.Fuzz(func(t *testing.T, data []byte, first uint64, sizes []byte) {
		recs := Parse(data)
		pos := 0
		for i, r := range recs {
			if i > 0 && r.LSN != recs[i-1].LSN+1 {
				t.Fatalf("LSN %d follows %d", r.LSN, recs[i-1].LSN)
			}
			if len(r.Payload) == 0 || len(r.Payload) > MaxRecord {
				t.Fatalf("LSN %d has a %d-byte payload", r.LSN, len(r.Payload))
			}
			// Records frame back to bytes read in order, with at most
			// skip frames between them.
			fr := AppendRecord(nil, r.LSN, r.Payload)
			at := bytes.Index(data[pos:], fr)
			if at < 0 || i == 0 && at > 0 && binary.BigEndian.Uint32(data) != skipMarker {
				t.Fatalf("LSN %d does not frame back to the bytes it was read from", r.LSN)
			}
			pos += at + len(fr)
		}

		var payloads [][]byte
		var framed []byte
		for i, s := range sizes {
			p := make([]byte, 1+int(s))
			for j := range p {
				if len(data) > 0 {
					p[j] = data[(i+j)%len(data)]
				}
			}
			payloads = append(payloads, p)
			framed = AppendRecord(framed, first+uint64(i), p)
		}
		got := Parse(append(framed, data...))
		if len(got) < len(payloads) {
			t.Fatalf("read %d of %d framed records", len(got), len(payloads))
		}
		for i, p := range payloads {
			if got[i].LSN != first+uint64(i) || !bytes.Equal(got[i].Payload, p) {
				t.Fatalf("record %d read back as LSN %d, %d bytes", i, got[i].LSN, len(got[i].Payload))
			}
		}
	})
}
