package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	berrors "go.etcd.io/bbolt/errors"

	"github.com/sortie-edge/sortie/driver"
)

// FuzzDecodeMission feeds arbitrary bytes to the record decoder, which
// reads whatever a damaged file holds: it must fail cleanly, never panic,
// and anything it accepts must survive a round trip.
func FuzzDecodeMission(f *testing.F) {
	m := newMission(mid(1))
	body, _ := json.Marshal(m)
	good := envelope{schema: driver.SchemaVersion, order: 1, version: m.Version, body: body}.encode()
	f.Add(good)
	f.Add(good[:headerLen])
	f.Add(good[:headerLen-1])
	f.Add([]byte{})
	f.Add(envelope{schema: driver.SchemaVersion + 1, version: 1, body: body}.encode())
	f.Add(envelope{schema: driver.SchemaVersion, version: 1, body: []byte(`{"version":1,"steps":[{"timeout":"-5s"}]}`)}.encode())
	f.Add(envelope{schema: driver.SchemaVersion, version: 9, body: []byte(`null`)}.encode())
	ev, _ := json.Marshal(event(m, 1, driver.StatePending))
	arch := envelope{form: formArchive, schema: driver.SchemaVersion, state: stateCode(m.State), order: 1, version: m.Version, finished: 1, seq: 1}
	archived := appendArchive(make([]byte, headerLen), body, []eventRec{{1, ev}, {2, ev}})
	arch.putHeader(archived)
	f.Add(archived)
	f.Add(archived[:len(archived)-3])
	f.Add(append([]byte{driver.SchemaVersion}, good[3:]...)) // schema 1's header
	f.Fuzz(func(t *testing.T, rec []byte) {
		if h, err := parseEnvelope(rec); err == nil {
			_, _ = h.events() // an archive's timeline is decoded as carefully
		}
		m, err := decodeMission(rec)
		if err != nil {
			return
		}
		h, _ := parseEnvelope(rec)
		body, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("decoded mission does not encode: %v", err)
		}
		again, err := decodeMission(envelope{schema: h.schema, order: h.order, version: h.version, finished: h.finished, body: body}.encode())
		if err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
		sameJSON(t, again, m)
	})
}

// sameWrite compares the logged fields of two writes; nil and empty
// slices are the same.
func sameWrite(t *testing.T, got, want *write) {
	t.Helper()
	same := got.create == want.create && got.id == want.id && got.reqKey == want.reqKey && got.state == want.state &&
		got.version == want.version && got.finished == want.finished && got.seq == want.seq &&
		bytes.Equal(got.body, want.body) && len(got.events) == len(want.events) && len(got.outbox) == len(want.outbox)
	for i := 0; same && i < len(got.events); i++ {
		same = got.events[i].seq == want.events[i].seq && bytes.Equal(got.events[i].data, want.events[i].data)
	}
	for i := 0; same && i < len(got.outbox); i++ {
		same = bytes.Equal(got.outbox[i], want.outbox[i])
	}
	if !same {
		t.Fatalf("write differs:\ngot  %+v\nwant %+v", got, want)
	}
}

// FuzzDecodeWrite feeds arbitrary bytes to the log payload decoder, which
// replay runs on whatever a CRC-valid record holds: it must fail with
// ErrCorrupt, never panic, and what it accepts must survive a round trip.
// The other arguments make a write that encodeWrite then decodeWrite
// must return unchanged.
func FuzzDecodeWrite(f *testing.F) {
	m := newMission(mid(1))
	m.Meta.RequestKey = "req-1"
	create, err := newWrite(true, m, []driver.Event{event(m, 1, driver.StatePending)})
	if err != nil {
		f.Fatal(err)
	}
	if err := create.encodeOutbox(m); err != nil {
		f.Fatal(err)
	}
	next, evs := advance(m, driver.StateSucceeded)
	evs = append(evs, event(next, next.Seq+1, driver.StateSucceeded))
	save, err := newWrite(false, next, evs)
	if err != nil {
		f.Fatal(err)
	}
	for _, w := range []*write{create, save} {
		p := encodeWrite(nil, w)
		f.Add(p, w.create, w.id, w.reqKey, w.version, w.finished, w.seq, w.body, []byte("a,b"))
		f.Add(p[:len(p)/2], false, "x", "", uint64(0), uint64(0), uint64(0), []byte{}, []byte{})
		f.Add(append(bytes.Clone(p), 0), true, "", "k", ^uint64(0), ^uint64(0), ^uint64(0), []byte(nil), []byte(","))
	}
	f.Add([]byte{}, false, "", "", uint64(0), uint64(0), uint64(0), []byte(nil), []byte(nil))
	f.Add([]byte{1}, true, "a", "", uint64(1), uint64(1), uint64(1), []byte("{}"), []byte("x"))
	// Counts far beyond the payload, and a non-minimal uvarint.
	f.Add([]byte{0, 1, 'a', 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f}, false, "a", "", uint64(1), uint64(0), uint64(0), []byte(nil), []byte(nil))
	f.Add([]byte{2, 1, 'a', 0x80, 0x00, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0}, false, "a", "", uint64(1), uint64(0), uint64(0), []byte(nil), []byte(nil))
	f.Fuzz(func(t *testing.T, p []byte, create bool, id, reqKey string, version, finished, seq uint64, body, lists []byte) {
		if w, err := decodeWrite(p); err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("decodeWrite error %v does not wrap ErrCorrupt", err)
			}
		} else {
			if w.id == "" {
				t.Fatal("decodeWrite accepted a write without an ID")
			}
			again := encodeWrite(nil, w)
			if len(again) > len(p) {
				t.Fatalf("re-encoding grew the payload from %d to %d bytes", len(p), len(again))
			}
			w2, err := decodeWrite(again)
			if err != nil {
				t.Fatalf("re-encoded payload does not decode: %v", err)
			}
			sameWrite(t, w2, w)
			if !bytes.Equal(encodeWrite(nil, w2), again) {
				t.Fatal("encodeWrite is not deterministic")
			}
		}

		if id == "" {
			return // decodeWrite rejects it, and newWrite never makes one
		}
		w := &write{create: create, id: id, reqKey: reqKey, version: version, finished: finished, seq: seq, body: body}
		if len(lists) > 0 {
			for i, part := range bytes.Split(lists, []byte(",")) {
				w.events = append(w.events, eventRec{seq: seq + uint64(i), data: part})
				w.outbox = append(w.outbox, bytes.Clone(part))
			}
			w.outbox = w.outbox[:len(w.outbox)/2]
		}
		enc := encodeWrite([]byte("prefix"), w)
		got, err := decodeWrite(enc[len("prefix"):])
		if err != nil {
			t.Fatalf("decodeWrite(encodeWrite(%+v)): %v", w, err)
		}
		sameWrite(t, got, w)
	})
}

// FuzzCheckFile damages a small store file byte by byte (the input is a
// list of patches: two bytes of offset, one of value) and checks it:
// whatever the damage, CheckFile answers, and never crashes the process
// that checks a backup before restoring it.
func FuzzCheckFile(f *testing.F) {
	base := checkBase(f, 5, 0)
	for _, off := range []int{0, 16, 20, 24, 32, 56, 64, 4096, 4096 + 56, 8192, 12288, 16384} {
		f.Add([]byte{byte(off >> 8), byte(off), 0xff})
		f.Add([]byte{byte(off >> 8), byte(off), 0x00, byte(off >> 8), byte(off + 1), 0x7f})
	}
	f.Fuzz(func(t *testing.T, patch []byte) {
		checkPatched(t, base, patch, 2)
	})
}

// FuzzCheckFileLarge is FuzzCheckFile on a file with branch pages,
// nested buckets of several pages and overflow pages (a mission with a
// large context), with three bytes of offset per patch.
func FuzzCheckFileLarge(f *testing.F) {
	base := checkBase(f, 300, 20000)
	for _, off := range []int{0, 4096 + 56, 8192, 3 * 4096, 5 * 4096, 9*4096 + 10, 17 * 4096} {
		f.Add([]byte{byte(off >> 16), byte(off >> 8), byte(off), 0xff})
		f.Add([]byte{byte(off >> 16), byte(off >> 8), byte(off + 12), 0x40})
	}
	f.Fuzz(func(t *testing.T, patch []byte) {
		checkPatched(t, base, patch, 3)
	})
}

// checkBase is the bytes of a store file (a backup) holding n missions,
// the first with a context value of big bytes; CheckFile accepts it.
func checkBase(tb testing.TB, n, big int) []byte {
	tb.Helper()
	db, err := Open(filepath.Join(tb.TempDir(), "base.db"), testOptions())
	if err != nil {
		tb.Fatal(err)
	}
	for i := range n {
		m := newMission(mid(i))
		if i == 0 && big > 0 {
			m.Context.Values = map[string]any{"big": strings.Repeat("x", big)}
		}
		if _, _, err := db.Create(context.Background(), m, []driver.Event{event(m, 1, driver.StatePending)}); err != nil {
			tb.Fatal(err)
		}
	}
	var buf bytes.Buffer
	if _, err := db.Backup(&buf); err != nil {
		tb.Fatal(err)
	}
	if err := db.Close(); err != nil {
		tb.Fatal(err)
	}
	if err := CheckFile(writeTemp(tb, tb.TempDir(), buf.Bytes())); err != nil {
		tb.Fatalf("the undamaged file: %v", err)
	}
	return buf.Bytes()
}

// checkPatched applies patches of offLen offset bytes and one value byte
// to a copy of base and checks the result: it must not crash, and a
// refusal must say the file is damaged or not a store.
func checkPatched(t *testing.T, base, patch []byte, offLen int) {
	b := bytes.Clone(base)
	for i := 0; i+offLen < len(patch); i += offLen + 1 {
		off := 0
		for _, x := range patch[i : i+offLen] {
			off = off<<8 | int(x)
		}
		b[off%len(b)] = patch[i+offLen]
	}
	err := CheckFile(writeTemp(t, t.TempDir(), b))
	if err != nil && !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrSchema) && !errors.Is(err, berrors.ErrInvalid) &&
		!errors.Is(err, berrors.ErrVersionMismatch) && !errors.Is(err, berrors.ErrChecksum) {
		t.Errorf("refused without saying the file is damaged: %v", err)
	}
}

func writeTemp(tb testing.TB, dir string, b []byte) string {
	tb.Helper()
	p := filepath.Join(dir, "check.db")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		tb.Fatal(err)
	}
	return p
}
