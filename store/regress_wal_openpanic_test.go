package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestReviewOpenDamagedRootPanics: Open now reads the tree in
// replayWAL (its View for walMeta, and the replay's Update) before
// init, whose recover turned bbolt's panics on a damaged file into
// ErrCorrupt. A file whose meta pages are intact but whose root page is
// damaged makes Open panic instead of failing with ErrCorrupt.
func TestReviewOpenDamagedRootPanics(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sortie.db")
	db, err := Open(path, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		mustCreate(t, db, newMission(mid(i)))
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The newer of the two meta pages names the root bucket's page.
	pageSize := int(binary.LittleEndian.Uint32(data[16+8:]))
	var root uint64
	var txid uint64
	for i := range 2 {
		m := data[i*pageSize+16:]
		if tx := binary.LittleEndian.Uint64(m[48:]); tx >= txid {
			txid, root = tx, binary.LittleEndian.Uint64(m[16:])
		}
	}
	page := make([]byte, pageSize)
	for i := range page {
		page[i] = 0xff
	}
	writeAt(t, path, int64(root)*int64(pageSize), page)

	err = func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("Open panicked: %v", r)
			}
		}()
		db, err := Open(path, testOptions())
		if err == nil {
			db.Close()
			return errors.New("Open succeeded")
		}
		return err
	}()
	if !errors.Is(err, ErrCorrupt) {
		t.Errorf("Open of a file with a damaged root page = %v, want ErrCorrupt", err)
	}
}
