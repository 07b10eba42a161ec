package pagecheck

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// boltFile returns the bytes of a bbolt file with nested buckets, a
// value spilling onto overflow pages and enough keys for branch pages.
func boltFile(tb testing.TB) []byte {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "x.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("outer"))
		if err != nil {
			return err
		}
		for i := range 2000 {
			if err := b.Put(fmt.Appendf(nil, "key-%05d", i), bytes.Repeat([]byte("v"), 40)); err != nil {
				return err
			}
		}
		inner, err := b.CreateBucket([]byte("inner"))
		if err != nil {
			return err
		}
		return inner.Put([]byte("big"), bytes.Repeat([]byte("x"), 20000))
	})
	if err := db.Close(); err != nil {
		tb.Fatal(err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	return data
}

// TestCheck: an intact file passes; damage that would make bbolt read
// outside the file or a page is refused.
func TestCheck(t *testing.T) {
	good := boltFile(t)
	pageSize := int(binary.LittleEndian.Uint32(good[16+8:]))
	// The newer meta page names the root.
	var root, txid uint64
	for i := range 2 {
		m := good[i*pageSize+16:]
		if tx := binary.LittleEndian.Uint64(m[48:]); tx >= txid {
			txid, root = tx, binary.LittleEndian.Uint64(m[16:])
		}
	}
	damage := func(f func(d []byte) []byte) []byte { return f(bytes.Clone(good)) }
	for _, tc := range []struct {
		name string
		data []byte
		ok   bool
	}{
		{"intact", good, true},
		{"empty", nil, false},
		{"truncated to the meta pages", good[:2*pageSize], false},
		{"meta pages zeroed", damage(func(d []byte) []byte { clear(d[:2*pageSize]); return d }), false},
		{"root page says it is another", damage(func(d []byte) []byte {
			binary.LittleEndian.PutUint64(d[int(root)*pageSize:], root+1)
			return d
		}), false},
		{"root page overflows past the file", damage(func(d []byte) []byte {
			binary.LittleEndian.PutUint32(d[int(root)*pageSize+12:], 1<<30)
			return d
		}), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(bytes.NewReader(tc.data), int64(len(tc.data)))
			if (err == nil) != tc.ok {
				t.Errorf("Check = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}
