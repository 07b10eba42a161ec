package store

import (
	"fmt"
	"io"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Backup writes a copy of the database to w while the store stays in
// use, and returns how many bytes it wrote. The copy holds every write
// acknowledged before Backup began (it checkpoints first) and is one
// consistent bbolt snapshot: a complete store file, with no log to go
// with it. It is one read transaction, which writers do not wait for,
// except a checkpoint that must grow the file while a large copy is still
// being read.
//
// To restore: stop the agent, put the copy in place of the database file
// and delete any write-ahead log beside it (path + "-wal"), which belongs
// to the state the copy replaces.
func (db *DB) Backup(w io.Writer) (int64, error) {
	var n int64
	err := db.scan(func(tx *bolt.Tx) error {
		var err error
		n, err = tx.WriteTo(w)
		return err
	})
	if err != nil {
		return n, fmt.Errorf("backup: %w", err)
	}
	return n, nil
}

// CheckFile opens a store file read-only and checks that it is one this
// build can open: a bbolt file whose pages are consistent and whose
// schema is not newer than Schema. It does not look at a write-ahead log.
// The file must not be open in a running store (that one holds its lock):
// it is for backups.
func CheckFile(path string) error {
	bdb, err := openCheck(path)
	if err != nil {
		return err
	}
	defer bdb.Close()
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	return bdb.View(func(tx *bolt.Tx) error {
		// Before any page is read: a page past the end of a truncated
		// file is not an error but a SIGBUS.
		if fi.Size() < tx.Size() {
			return fmt.Errorf("%s: %w: %d bytes, but its meta page says %d", path, ErrCorrupt, fi.Size(), tx.Size())
		}
		if _, err := schemaOf(tx); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if tx.Bucket(bMissions) == nil {
			return fmt.Errorf("%s: %w: no missions bucket", path, ErrCorrupt)
		}
		var first error
		for err := range tx.Check() { // drained: the checker stops only then
			if first == nil {
				first = fmt.Errorf("%s: %w: %v", path, ErrCorrupt, err)
			}
		}
		return first
	})
}

// openCheck opens path read-only, turning bbolt's panics on a damaged
// file into ErrCorrupt.
func openCheck(path string) (bdb *bolt.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			bdb, err = nil, fmt.Errorf("%s: %w: %v", path, ErrCorrupt, r)
		}
	}()
	bdb, err = bolt.Open(path, 0, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return bdb, nil
}
