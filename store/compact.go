package store

import (
	"errors"
	"fmt"
	"os"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/store/internal/wal"
)

// CompactResult is what Compact did.
type CompactResult struct {
	// Before and After are the file's sizes; After is Before when the
	// original was kept.
	Before, After int64
	// Copy is the size of the compacted copy, kept or not.
	Copy int64
	// Kept says that the copy was no smaller than the original, which is
	// then left as it was.
	Kept bool
}

// Compact rewrites the store file at path without its free pages, for a
// gateway whose flash is small: bbolt reuses freed pages but never
// shrinks its file, so after retention has deleted many missions the
// file keeps its peak size. The store must not be open (an agent using
// it makes Compact fail with ErrLocked after opts.Timeout). The new file
// is written beside the old one and renamed over it only once complete,
// so a crash leaves the original intact. A copy that would be no smaller
// than the original (a file retention's Reclaim has already rewritten
// has little to give back, and a copy grows in steps of up to a MiB) is
// dropped and the original kept: compaction never grows the file.
func Compact(path string, opts Options) (res CompactResult, err error) {
	opts = opts.withDefaults()
	// Opening and closing the store applies a log a crash left behind, so
	// the copy has every acknowledged write, and brings the schema up to
	// date.
	db, err := Open(path, opts)
	if err != nil {
		return res, err
	}
	if err := db.Close(); err != nil {
		return res, err
	}
	src, err := openBolt(path, opts)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, src.Close()) }()
	fi, err := os.Stat(path)
	if err != nil {
		return res, fmt.Errorf("compact %s: %w", path, err)
	}
	res.Before, res.After = fi.Size(), fi.Size()
	tmp := path + ".compact"
	_ = os.Remove(tmp)
	dst, err := bolt.Open(tmp, fi.Mode().Perm(), &bolt.Options{Timeout: opts.Timeout, FreelistType: bolt.FreelistMapType})
	if err != nil {
		return res, fmt.Errorf("compact %s: %w", path, err)
	}
	// As the store grows its file: bbolt's default (16 MiB) rounds a copy
	// up to the next power of two, which made 6.2 MiB of missions an 8 MiB
	// file.
	dst.AllocSize = allocSize
	// Commit every 64 MiB so a large store does not build one huge
	// transaction in memory.
	if err := bolt.Compact(dst, src, 64<<20); err != nil {
		return res, fmt.Errorf("compact %s: %w", path, errors.Join(err, dst.Close(), os.Remove(tmp)))
	}
	if err := dst.Close(); err != nil {
		return res, fmt.Errorf("compact %s: %w", path, errors.Join(err, os.Remove(tmp)))
	}
	nfi, err := os.Stat(tmp)
	if err != nil {
		return res, fmt.Errorf("compact %s: %w", path, err)
	}
	res.Copy = nfi.Size()
	if res.Copy >= res.Before {
		res.Kept = true
		if err := os.Remove(tmp); err != nil {
			return res, fmt.Errorf("compact %s: %w", path, err)
		}
		return res, nil
	}
	if err := os.Rename(tmp, path); err != nil {
		return res, fmt.Errorf("compact %s: %w", path, errors.Join(err, os.Remove(tmp)))
	}
	// Until the directory is synced a power cut may bring the original
	// back: harmless (it holds everything), but the compaction reported
	// would not have happened.
	if err := wal.SyncDir(path); err != nil {
		return res, fmt.Errorf("compact %s: %w", path, err)
	}
	res.After = res.Copy
	return res, nil
}
