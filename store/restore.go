package store

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// Restore puts a copy of backup in place of the store file at path,
// which no store may have open: it fails with ErrLocked if one has. The
// backup must pass CheckFile. The copy gets its own WAL ID (NewIdentity)
// and is renamed into place only once complete. The file it replaces,
// and a log beside it, are not deleted but renamed with the suffix
// ".before-restore-<UTC time>", so a restore can be undone by hand; kept
// lists their new names.
func Restore(backup, path string) (kept []string, err error) {
	if err := CheckFile(backup); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	if f, err := os.Open(path); err == nil {
		// Held across the swap, so no store opens the old file meanwhile.
		locked, err := tryLockFile(f)
		defer f.Close() // releases the lock
		if err != nil {
			return nil, fmt.Errorf("restore: lock %s: %w", path, err)
		}
		if !locked {
			return nil, fmt.Errorf("restore: %w: %s is open in a running store (is the agent running?)", ErrLocked, path)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("restore: %w", err)
	}
	tmp := path + ".restoring"
	if err := copySynced(backup, tmp); err != nil {
		os.Remove(tmp)
		return nil, fmt.Errorf("restore: %w", err)
	}
	defer os.Remove(tmp) // gone once renamed
	if err := NewIdentity(tmp); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	suffix := ".before-restore-" + time.Now().UTC().Format("20060102T150405Z")
	for _, p := range []string{path, walPath(path)} {
		switch err := os.Rename(p, p+suffix); {
		case err == nil:
			kept = append(kept, p+suffix)
		case !errors.Is(err, fs.ErrNotExist):
			return kept, fmt.Errorf("restore: keep %s: %w", p, err)
		}
	}
	if err := os.Rename(tmp, path); err != nil {
		return kept, fmt.Errorf("restore: %w", err)
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return kept, fmt.Errorf("restore: %w", err)
	}
	return kept, nil
}

// copySynced copies src to a new file dst and syncs it.
func copySynced(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}
