package store

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/store/internal/pagecheck"
)

// Backup writes a copy of the database to w while the store stays in
// use, and returns how many bytes it wrote. The copy holds every write
// acknowledged before Backup began (it checkpoints first) and is one
// consistent bbolt snapshot: a complete store file, with no log to go
// with it.
//
// It is one bbolt read transaction, as long as writing to w takes. A
// checkpoint that must grow the file meanwhile waits for it, and with
// it, once the log is full, every commit and read. So w should be fast:
// a local file, not a network client.
//
// The copy keeps the store's WAL ID, so a log left beside the database
// it replaces would be replayed into it: give it its own with NewIdentity
// before restoring it, or delete that log (path + "-wal").
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

// outboxLeap is how far a copy's outbox seqs jump: more entries than
// the database it was copied from can have written since, so the copy
// never reuses a seq the hub has seen (it acks by seq, and would take a
// reused one for one it stored).
const outboxLeap = 1 << 40

// NewIdentity gives a store file that is not in use, such as a backup,
// a WAL ID of its own. A log written for the database it was copied from
// is then refused (ErrForeignLog) if the copy is restored beside it,
// instead of replaying, on top of the copy, the writes made after it.
// Its outbox seqs go on outboxLeap further than the copy's.
func NewIdentity(path string) error {
	bdb, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	err = bdb.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bMeta)
		if meta == nil {
			return fmt.Errorf("%w: no meta bucket", ErrCorrupt)
		}
		if err := meta.Delete(kWALID); err != nil {
			return err
		}
		if ob := tx.Bucket(bOutbox); ob != nil {
			if err := ob.SetSequence(ob.Sequence() + outboxLeap); err != nil {
				return err
			}
		}
		return ensureWALID(tx)
	})
	if cerr := bdb.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("new identity for %s: %w", path, err)
	}
	return nil
}

// BackupFile writes a copy of the database, as Backup does, into a
// temporary file beside it, and returns it for reading from its start,
// with its size. The file loses its name at once where the system
// allows (unix), so nothing is left behind if the process dies; Close
// frees its space. Sending it from there keeps Backup's read transaction
// as short as a local copy, however slow the reader.
func (db *DB) BackupFile() (io.ReadCloser, int64, error) {
	f, err := os.CreateTemp(filepath.Dir(db.path), filepath.Base(db.path)+tempBackup+"*")
	if err != nil {
		return nil, 0, fmt.Errorf("backup: %w", err)
	}
	c := &tempCopy{File: f, named: os.Remove(f.Name()) != nil}
	n, err := db.Backup(f)
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("backup: %w", errors.Join(err, c.Close()))
	}
	return c, n, nil
}

// tempCopy is a temporary file that Close also removes, if it still has
// a name.
type tempCopy struct {
	*os.File
	named bool
}

func (c *tempCopy) Close() error {
	err := c.File.Close()
	if c.named {
		// Left behind, the next Open's sweep removes it; but say so.
		err = errors.Join(err, os.Remove(c.Name()))
	}
	return err
}

// Name parts of the temporary files beside a store file: a backup copy
// (BackupFile, where the system keeps names of open files) and a restore
// being written (Restore). Open removes those a dead process left.
const (
	tempBackup  = ".backup-"
	tempRestore = ".restoring-"
)

// sweepTemps removes the temporary files a process that died left beside
// path. Whoever made them is gone: the caller holds path's lock, which a
// restore holds while it writes, and a backup copy belongs to the store
// that had it.
func sweepTemps(path string, log *slog.Logger) {
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		return
	}
	base := filepath.Base(path)
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, base+tempBackup) && !strings.HasPrefix(name, base+tempRestore) && name != base+tempReclaim {
			continue
		}
		p := filepath.Join(filepath.Dir(path), name)
		if err := os.Remove(p); err == nil {
			log.Info("removed a temporary file an earlier run left", "file", p)
		}
	}
}

// readAll reads every key and value of every bucket through bbolt's
// cursors, in the calling goroutine. On a damaged file that is where a
// page pointer past the file faults, as a panic CheckFile recovers,
// before tx.Check reads the same pages from a goroutine of its own, where
// a fault would end the process. A page cycle is cut short by counting:
// a file of size bytes cannot hold more than size/16 keys, nor buckets
// nested deeper than maxNesting.
func readAll(tx *bolt.Tx, size int64) error {
	const maxNesting = 8
	keys := size / 16
	var sum uint32
	var read func(b *bolt.Bucket, depth int) error
	read = func(b *bolt.Bucket, depth int) error {
		if depth > maxNesting {
			return fmt.Errorf("%w: buckets nested %d deep", ErrCorrupt, depth)
		}
		c := b.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if keys--; keys < 0 {
				return fmt.Errorf("%w: more keys than the file can hold", ErrCorrupt)
			}
			// Every byte is read: a key or value past the mapping faults now.
			sum = crc32.Update(crc32.Update(sum, crc32.IEEETable, k), crc32.IEEETable, v)
			if v == nil {
				if nb := b.Bucket(k); nb != nil {
					if err := read(nb, depth+1); err != nil {
						return err
					}
				}
			}
		}
		return nil
	}
	return tx.ForEach(func(_ []byte, b *bolt.Bucket) error { return read(b, 1) })
}

// checkRecords decodes every mission and every timeline event, as the
// agent will: bbolt keeps no checksums of values, so damage inside one is
// found only by reading it. (Damage that leaves valid JSON is not.)
func checkRecords(tx *bolt.Tx) error {
	checkEvent := func(id []byte, seq uint64, v []byte) error {
		var ev driver.Event
		if err := json.Unmarshal(v, &ev); err != nil {
			return fmt.Errorf("%w: mission %q, event %d: %w", ErrCorrupt, id, seq, err)
		}
		return nil
	}
	missions, live := tx.Bucket(bMissions), tx.Bucket(bLive)
	if err := missions.ForEach(func(k, v []byte) error {
		h, _, err := record(missions, live, k)
		var body []byte
		var evs []eventRec
		if err == nil {
			body, evs, err = h.contents(true)
		}
		if err == nil {
			_, err = h.decode(body)
		}
		if err != nil {
			return fmt.Errorf("mission %q: %w", k, err)
		}
		for _, ev := range evs {
			if err := checkEvent(k, ev.seq, ev.data); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return err
	}
	tl := tx.Bucket(bTimeline)
	if tl == nil {
		return nil
	}
	return tl.ForEach(func(k, v []byte) error {
		id, seq := k, uint64(0)
		if len(k) > 9 {
			id, seq = k[:len(k)-9], binary.BigEndian.Uint64(k[len(k)-8:])
		}
		return checkEvent(id, seq, v)
	})
}

// InUse reports whether a store has the file at path open (it holds its
// lock). A file that does not exist is not in use.
func InUse(path string) (bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	// Opened read-only, so nothing is lost if Close fails; it releases
	// the lock if we took it.
	defer func() { _ = f.Close() }()
	locked, err := tryLockFile(f)
	return !locked, err
}

// CheckFile opens a store file read-only and checks that it is one this
// build can open: a bbolt file whose pages are consistent and whose
// schema is not newer than Schema. It does not look at a write-ahead log.
// The file must not be open in a running store (that one holds its lock):
// it is for backups. Every mission and event is decoded, so damage
// inside one is found too. A damaged file is refused with an error (most
// wrap ErrCorrupt), whatever the damage, and never brings the process down,
// although bbolt panics on some damage, and on other damage reads past
// the file's mapping (FuzzCheckFile): the page structure is checked
// first (pagecheck.Check), and bbolt's reads here run with faults turned into
// panics, which are recovered.
func CheckFile(path string) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%s: %w: %v", path, ErrCorrupt, r)
		}
	}()
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }() // read-only: nothing to lose
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	// Before bbolt maps the file: it trusts the page structure, and a
	// damaged one can make it, or its checker's own goroutine, read past
	// the mapping.
	if err := pagecheck.Check(f, fi.Size()); err != nil {
		return fmt.Errorf("%s: %w: %w", path, ErrCorrupt, err)
	}
	bdb, err := bolt.Open(path, 0, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer func() { err = errors.Join(err, bdb.Close()) }()
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
		if err := readAll(tx, fi.Size()); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if err := checkRecords(tx); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		var first error
		for err := range tx.Check() { // drained: the checker stops only then
			if first == nil {
				first = fmt.Errorf("%s: %w: %w", path, ErrCorrupt, err)
			}
		}
		return first
	})
}
