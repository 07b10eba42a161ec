package store

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"slices"

	"github.com/sortie-edge/sortie/driver"
)

// Record payloads: one Create or Save, everything a checkpoint needs to
// apply it to bbolt without the caller.
//
//	flags      1 byte: 1 = create, 2 = state follows
//	state      1 byte, the mission's stateCode (absent in logs of schema 1
//	           builds: the state is then read from body)
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
	flags := byte(2)
	if w.create {
		flags |= 1
	}
	dst = append(dst, flags, w.state)
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
	hasState := flags&2 != 0
	if hasState {
		w.state = r.byte()
	}
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
	if !hasState {
		var m struct {
			State driver.State `json:"state"`
		}
		if err := json.Unmarshal(w.body, &m); err != nil {
			return nil, fmt.Errorf("%w: log record of mission %q: %w", ErrCorrupt, w.id, err)
		}
		w.state = stateCode(m.State)
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
