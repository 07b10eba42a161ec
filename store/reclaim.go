package store

import (
	"context"
	"errors"
	"fmt"
	"os"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/store/internal/wal"
)

// bbolt reuses the pages deletions free, so under a steady retention the
// file stops growing; but it never gives them back to the file system.
// After a burst (thousands of live missions at once) or a tighter
// retention, the file keeps its peak size, which on a gateway's small
// flash is space the rest of the system lacks. Reclaim rewrites it while
// the store runs.

// tempReclaim names the file Reclaim writes before it takes the store's
// place; Open removes one a crash left behind.
const tempReclaim = ".reclaim"

// Reclaim rewrites the store file without its free pages and puts the
// copy in its place, while the store stays open: calls wait meanwhile
// (the copy takes a few milliseconds per MiB of data), writes already in
// the log stay there and are checkpointed into the new file. It returns
// the file's size before and after. A crash at any point leaves either
// the old file or the new one, complete, at the path.
func (db *DB) Reclaim(ctx context.Context) (before, after int64, err error) {
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	db.gate.Lock()
	defer db.gate.Unlock()
	db.mu.Lock()
	if db.closed {
		db.mu.Unlock()
		return 0, 0, fmt.Errorf("store %s: %w", db.path, driver.ErrClosed)
	}
	db.inflight.Add(1)
	db.mu.Unlock()
	defer db.inflight.Done()
	db.ckMu.Lock() // no checkpoint writes to the file being copied
	defer db.ckMu.Unlock()

	fi, err := os.Stat(db.path)
	if err != nil {
		return 0, 0, fmt.Errorf("reclaim %s: %w", db.path, err)
	}
	tmp := db.path + tempReclaim
	_ = os.Remove(tmp)
	dst, err := bolt.Open(tmp, fi.Mode().Perm(), &bolt.Options{Timeout: DefaultTimeout, FreelistType: bolt.FreelistMapType})
	if err != nil {
		return 0, 0, fmt.Errorf("reclaim %s: %w", db.path, err)
	}
	dst.AllocSize = allocSize
	fail := func(err error) (int64, int64, error) {
		return 0, 0, fmt.Errorf("reclaim %s: %w", db.path, errors.Join(err, dst.Close(), os.Remove(tmp)))
	}
	// Commit every 4 MiB: the copy's dirty pages are held in memory
	// until each commit.
	if err := bolt.Compact(dst, db.bolt, 4<<20); err != nil {
		return fail(err)
	}
	// dst holds tmp's lock, which follows the file to its new name: no
	// other store can open the path between the rename and the swap.
	if err := os.Rename(tmp, db.path); err != nil {
		return fail(err)
	}
	if err := wal.SyncDir(db.path); err != nil {
		db.log.Warn("reclaim: the directory's rename may not be durable", "err", err)
	}
	old := db.bolt
	db.bolt = dst
	if err := old.Close(); err != nil {
		db.log.Warn("reclaim: closing the old file", "err", err)
	}
	nfi, err := os.Stat(db.path)
	if err != nil {
		return fi.Size(), 0, fmt.Errorf("reclaim %s: %w", db.path, err)
	}
	db.log.Info("gave free space back", "before", fi.Size(), "after", nfi.Size())
	return fi.Size(), nfi.Size(), nil
}

// freeBytes is how much of the file is free pages: what Reclaim would
// give back, roughly. The caller holds the gate or ckMu.
func (db *DB) freeBytes() int64 {
	st := db.bolt.Stats()
	return int64(st.FreeAlloc)
}
