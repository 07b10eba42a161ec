package store

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/sortie-edge/sortie/store/internal/wal"
)

// Restore puts a copy of backup in place of the store file at path,
// which no store may have open: it fails with ErrLocked if one has. The
// backup must pass CheckFile. The copy gets its own WAL ID (NewIdentity),
// the owner and mode of the file it replaces, and replaces it in one
// rename, so path always names a whole store file. The file it replaces,
// and a log a crash left beside it (a log a clean close marked holds
// nothing and is removed), are kept under new names with the suffix
// ".before-restore-<UTC time>", so a restore can be undone by hand; kept
// lists them. A crash before the log is moved leaves it beside the
// restored file, which refuses it (ErrForeignLog) rather than replay it.
func Restore(backup, path string) (kept []string, err error) {
	if err := CheckFile(backup); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	// The file at path is locked across the swap. A store that opened it
	// meanwhile finds, once it has the lock, that path names another file,
	// and opens that one (see openBolt). Where there is no file yet, an
	// empty one stands in, so that a store starting now waits too instead
	// of creating a database the rename would then unlink under it.
	placeholder := false
	old, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		old, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		placeholder = err == nil
	}
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	// Nothing is written through old: closing it only releases the lock.
	defer func() { _ = old.Close() }()
	locked, err := tryLockFile(old)
	if err != nil {
		return nil, fmt.Errorf("restore: lock %s: %w", path, err)
	}
	if !locked {
		return nil, fmt.Errorf("restore: %w: %s is open in a running store (is the agent running?)", ErrLocked, path)
	}
	swapped := false
	if placeholder {
		defer func() {
			if err != nil && !swapped {
				err = errors.Join(err, os.Remove(path)) // still our empty, locked stand-in
			}
		}()
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+tempRestore+"*")
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	defer removeTemp(tmp.Name(), &err)
	if err := fillFrom(tmp, backup); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	if !placeholder {
		if err := sameOwnerAndMode(tmp.Name(), old); err != nil {
			return nil, fmt.Errorf("restore: %w", err)
		}
	}
	if err := NewIdentity(tmp.Name()); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	suffix := ".before-restore-" + time.Now().UTC().Format("20060102T150405.000000000Z")
	if !placeholder {
		// A second name for the old file, so the rename below replaces
		// path without a moment where it names nothing.
		if err := keepAs(path, path+suffix); err != nil {
			return nil, fmt.Errorf("restore: keep %s: %w", path, err)
		}
		kept = append(kept, path+suffix)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return kept, fmt.Errorf("restore: %w", err)
	}
	swapped = true
	// A log closed clean holds nothing of the replaced file's: no copy
	// to keep, and no log for the restored one to refuse.
	if clean, err := wal.ClosedClean(wal.Path(path)); err == nil && clean {
		if err := os.Remove(wal.Path(path)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return kept, fmt.Errorf("restore: remove %s: %w", wal.Path(path), err)
		}
	}
	switch err := os.Rename(wal.Path(path), wal.Path(path)+suffix); {
	case err == nil:
		kept = append(kept, wal.Path(path)+suffix)
	case !errors.Is(err, fs.ErrNotExist):
		return kept, fmt.Errorf("restore: keep %s: %w", wal.Path(path), err)
	}
	if err := wal.SyncDir(path); err != nil {
		return kept, fmt.Errorf("restore: %w", err)
	}
	return kept, nil
}

// keepAs gives the file at path the second name kept: a hard link, or,
// where the file system has none, a copy, made under a temporary name
// so that kept never names a partial one. It never replaces kept.
func keepAs(path, kept string) (err error) {
	err = os.Link(path, kept)
	if err == nil || errors.Is(err, fs.ErrExist) {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(kept), filepath.Base(kept)+".part-*")
	if err != nil {
		return err
	}
	defer removeTemp(f.Name(), &err)
	if err := fillFrom(f, path); err != nil {
		return err
	}
	if _, err := os.Lstat(kept); err == nil {
		return fs.ErrExist
	}
	return os.Rename(f.Name(), kept)
}

// fillFrom copies the file src into f, syncs and closes it.
func fillFrom(f *os.File, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return errors.Join(err, f.Close())
	}
	defer func() { _ = in.Close() }() // read-only: nothing to lose
	_, err = fill(f, in)
	return err
}

// removeTemp removes a temporary file, which a rename may already have
// taken away, adding a failure to *err.
func removeTemp(name string, err *error) {
	if rerr := os.Remove(name); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
		*err = errors.Join(*err, rerr)
	}
}

// fill copies r into f, syncs and closes it.
func fill(f *os.File, r io.Reader) (int64, error) {
	n, err := io.Copy(f, r)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return n, err
}

// WriteBackup writes the backup that r reads (GET /api/backup) to dst,
// replacing it, so that dst never names a partial copy: under a
// temporary name beside dst first, synced, of size want when want is not
// negative, checked (CheckFile), given its own WAL identity
// (NewIdentity, so that restored beside the live database's log it
// refuses that log instead of replaying writes made after the backup),
// and only then renamed into place. It refuses a dst a store has open:
// replacing it would leave that store writing to a file no one sees.
func WriteBackup(r io.Reader, want int64, dst string) (n int64, err error) {
	if busy, err := InUse(dst); err != nil {
		return 0, fmt.Errorf("backup: %w", err)
	} else if busy {
		return 0, fmt.Errorf("backup: %w: %s is the database of a running agent; name another file", ErrLocked, dst)
	}
	dir := filepath.Dir(dst)
	f, err := os.CreateTemp(dir, filepath.Base(dst)+".part-*")
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err // its path is a temporary name nobody asked for
		}
		return 0, fmt.Errorf("backup: cannot write in %s: %w", dir, err)
	}
	defer removeTemp(f.Name(), &err)
	n, err = fill(f, r)
	switch {
	case err != nil:
		return n, fmt.Errorf("backup: after %d bytes: %w", n, err)
	case want >= 0 && n != want:
		return n, fmt.Errorf("backup: the copy received is %d bytes, not the %d announced; %s not written", n, want, dst)
	}
	// Checked before it is written to: bbolt answers a page past the end
	// of a cut file with SIGBUS.
	if err := CheckFile(f.Name()); err != nil {
		return n, fmt.Errorf("backup: the copy received is not a whole database; %s not written: %w", dst, err)
	}
	if err := NewIdentity(f.Name()); err != nil {
		return n, fmt.Errorf("backup: %w", err)
	}
	if err := os.Rename(f.Name(), dst); err != nil {
		return n, fmt.Errorf("backup: %w", err)
	}
	if err := wal.SyncDir(dst); err != nil {
		return n, fmt.Errorf("backup: %w", err)
	}
	return n, nil
}
