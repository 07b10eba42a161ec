package store

import (
	"errors"
	"fmt"
	"os"

	bolt "go.etcd.io/bbolt"
)

// Compact rewrites the store file at path without its free pages, for a
// gateway whose flash is small: bbolt reuses freed pages but never
// shrinks its file, so after retention has deleted many missions the
// file keeps its peak size. The store must not be open (an agent using
// it makes Compact fail with ErrLocked after opts.Timeout). The new file
// is written beside the old one and renamed over it only once complete,
// so a crash leaves the original intact. It returns the sizes before and
// after.
func Compact(path string, opts Options) (before, after int64, err error) {
	opts = opts.withDefaults()
	// Opening and closing the store applies a log a crash left behind, so
	// the copy has every acknowledged write, and brings the schema up to
	// date.
	db, err := Open(path, opts)
	if err != nil {
		return 0, 0, err
	}
	if err := db.Close(); err != nil {
		return 0, 0, err
	}
	src, err := openBolt(path, opts)
	if err != nil {
		return 0, 0, err
	}
	defer func() { err = errors.Join(err, src.Close()) }()
	fi, err := os.Stat(path)
	if err != nil {
		return 0, 0, fmt.Errorf("compact %s: %w", path, err)
	}
	tmp := path + ".compact"
	_ = os.Remove(tmp)
	dst, err := bolt.Open(tmp, fi.Mode().Perm(), &bolt.Options{Timeout: opts.Timeout, FreelistType: bolt.FreelistMapType})
	if err != nil {
		return 0, 0, fmt.Errorf("compact %s: %w", path, err)
	}
	// Commit every 64 MiB so a large store does not build one huge
	// transaction in memory.
	if err := bolt.Compact(dst, src, 64<<20); err != nil {
		return 0, 0, fmt.Errorf("compact %s: %w", path, errors.Join(err, dst.Close(), os.Remove(tmp)))
	}
	if err := dst.Close(); err != nil {
		return 0, 0, fmt.Errorf("compact %s: %w", path, errors.Join(err, os.Remove(tmp)))
	}
	nfi, err := os.Stat(tmp)
	if err != nil {
		return 0, 0, fmt.Errorf("compact %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return 0, 0, fmt.Errorf("compact %s: %w", path, errors.Join(err, os.Remove(tmp)))
	}
	return fi.Size(), nfi.Size(), nil
}
