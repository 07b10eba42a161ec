package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/store/internal/wal"
)

// pruneBatch bounds the missions one prune transaction deletes, so that
// pruning a large backlog never holds the write lock for long.
const pruneBatch = 64

// Prune deletes terminal missions that finished before olderThan, with
// their timelines and index entries, but always keeps the keep most
// recently finished ones. It works in small transactions, checking ctx
// between them, and returns how many missions it deleted (including
// those deleted before an error). A pruned mission's request key is free
// again.
func (db *DB) Prune(ctx context.Context, olderThan time.Time, keep int) (int, error) {
	if olderThan.IsZero() || olderThan.UnixNano() <= 0 {
		return 0, nil
	}
	cutoff := be64(uint64(olderThan.UnixNano()))
	keep = max(keep, 0)
	deleted := 0
	for {
		if err := ctx.Err(); err != nil {
			return deleted, err
		}
		n, err := db.pruneOnce(cutoff, keep)
		deleted += n
		if err != nil {
			return deleted, fmt.Errorf("prune: %w", err)
		}
		if n < pruneBatch {
			if deleted > 0 {
				db.log.Info("pruned missions", "deleted", deleted, "older_than", olderThan, "keep", keep)
			}
			return deleted, nil
		}
	}
}

// PruneBytes deletes the oldest finished missions, with their timelines
// and index entries, until the store's data takes at most maxBytes of
// its file (the file less its free pages, which bbolt reuses and Reclaim
// gives back). Live missions are never deleted, so their data alone may
// exceed it. It works in small transactions, as Prune does, and returns
// how many missions it deleted.
func (db *DB) PruneBytes(ctx context.Context, maxBytes int64) (int, error) {
	deleted := 0
	for {
		if err := ctx.Err(); err != nil {
			return deleted, err
		}
		used, err := db.usedBytes()
		if err != nil || used <= maxBytes {
			if deleted > 0 {
				db.log.Info("pruned missions to fit the byte budget", "deleted", deleted, "max_bytes", maxBytes, "used", used)
			}
			return deleted, err
		}
		n, err := db.pruneOnce(be64(^uint64(0)), 0)
		deleted += n
		if err != nil {
			return deleted, fmt.Errorf("prune to %d bytes: %w", maxBytes, err)
		}
		if n == 0 {
			db.log.Warn("the store's live missions alone exceed the byte budget", "max_bytes", maxBytes, "used", used)
			return deleted, nil
		}
	}
}

// usedBytes is the store's data: the file's pages less the free ones.
func (db *DB) usedBytes() (int64, error) {
	var used int64
	err := db.scan(func(tx *bolt.Tx) error {
		used = tx.Size() - db.freeBytes()
		return nil
	})
	return used, err
}

func (db *DB) pruneOnce(cutoff []byte, keep int) (int, error) {
	if err := db.enter(); err != nil {
		return 0, err
	}
	defer db.leave()
	// Under wmu, with the log applied: no save of a mission deleted here
	// can be checked before the deletion and applied after it.
	db.wmu.Lock()
	defer db.wmu.Unlock()
	if err := db.checkpoint(); err != nil {
		return 0, err
	}
	n := 0
	var before, after counts // the deletions, by state, for OnPrune
	err := db.bolt.Update(func(tx *bolt.Tx) error {
		b := bucketsOf(tx)
		c := b.finished.Cursor()
		// Entries at or after the keep-th newest are kept whatever their age.
		var bound []byte
		if keep > 0 {
			k, _ := c.Last()
			for i := 1; i < keep && k != nil; i++ {
				k, _ = c.Prev()
			}
			if k == nil {
				return nil
			}
			bound = bytes.Clone(k)
		}
		var victims [][]byte
		for k, _ := c.First(); k != nil && len(victims) < pruneBatch; k, _ = c.Next() {
			if bound != nil && bytes.Compare(k, bound) >= 0 || len(k) < 8 || bytes.Compare(k[:8], cutoff) >= 0 {
				break
			}
			victims = append(victims, bytes.Clone(k))
		}
		cs, err := readCounts(tx)
		if err != nil {
			return err
		}
		before = cs
		for _, k := range victims {
			if err := deleteMission(b, &cs, k); err != nil {
				return err
			}
		}
		after, n = cs, len(victims)
		return writeCounts(tx, &cs)
	})
	if err == nil {
		for code := range before.states {
			if d := before.states[code] - after.states[code]; d > 0 {
				db.onPrune(stateOf(byte(code)), int(d))
			}
		}
	}
	return n, err
}

// deleteMission removes a finished mission, named by its finished-index
// key, from every bucket. Index entries whose mission is already gone are
// removed too, so a damaged index shrinks rather than blocking pruning.
func deleteMission(b *txBuckets, c *counts, fkey []byte) error {
	id := fkey[8:]
	form := byte(formJSON)
	if rec := b.missions.Get(id); rec != nil {
		if h, _, err := record(b.missions, b.live, id); err == nil {
			form = h.form
			c.add(h.state, -1)
			if err := b.order.Delete(be64(h.order)); err != nil {
				return err
			}
			body, evs, err := h.contents(true)
			c.events -= int64(len(evs))
			var m struct {
				Meta struct {
					RequestKey string `json:"request_key"`
				} `json:"meta"`
			}
			if err == nil && json.Unmarshal(body, &m) == nil && m.Meta.RequestKey != "" {
				rk := []byte(m.Meta.RequestKey)
				if bytes.Equal(b.requests.Get(rk), id) {
					if err := b.requests.Delete(rk); err != nil {
						return err
					}
				}
			}
		}
		if err := b.missions.Delete(id); err != nil {
			return err
		}
		if err := b.live.Delete(id); err != nil {
			return err
		}
	}
	if err := b.active.Delete(id); err != nil {
		return err
	}
	if form == formJSON {
		evs, err := oldEvents(b, string(id), envelope{order: 1})
		if err != nil {
			return err
		}
		c.events -= int64(len(evs))
	}
	return b.finished.Delete(fkey)
}

// WriteError returns why the store's last write failed (a commit to the
// log, or a checkpoint into the file: a full disk, an I/O error), or nil
// once a write has succeeded since. A store that answers reads but fails
// every write is not ready (the agent's /readyz).
func (db *DB) WriteError() error {
	for _, slot := range []*atomic.Pointer[error]{&db.commitErr, &db.checkpointErr} {
		if p := slot.Load(); p != nil {
			return *p
		}
	}
	return nil
}

// noteWrite records the outcome of a commit or a checkpoint in its slot
// for WriteError. A closed store is not a failing one.
func noteWrite(slot *atomic.Pointer[error], err error) {
	switch {
	case err == nil:
		if slot.Load() != nil {
			slot.Store(nil)
		}
	case !errors.Is(err, driver.ErrClosed):
		slot.Store(&err)
	}
}

// Stats is a snapshot of the store's size.
type Stats struct {
	Missions int   // stored missions
	Active   int   // missions that are not terminal
	Finished int   // terminal missions (Prune candidates)
	Events   int   // timeline entries
	Requests int   // request keys remembered for idempotent Create
	FileSize int64 // bytes on disk
	// FreeBytes is the part of FileSize that is free pages: bbolt reuses
	// them, and Reclaim gives them back to the file system.
	FreeBytes int64
	Schema    int // layout version
	// Commits and Writes count, since Open, the group-commit transactions
	// and the Create and Save calls they carried; Writes/Commits is the
	// mean batch size.
	Commits uint64
	Writes  uint64
	// Checkpoints counts, since Open, the bbolt transactions that applied
	// logged writes to the file.
	Checkpoints uint64
}

// Stats reports the store's counts, kept by every write (no walk of the
// missions), and its file size: cheap enough for a metrics scrape. The
// counts are as of the last checkpoint (at most Options.CheckpointDelay
// old): a scrape does not force one, which would write flash.
func (db *DB) Stats() (Stats, error) {
	var s Stats
	err := db.view(func(tx *bolt.Tx) error {
		c, err := readCounts(tx)
		if err != nil {
			return err
		}
		for code, n := range c.states {
			s.Missions += int(n)
			if stateOf(byte(code)).Terminal() {
				s.Finished += int(n)
			} else {
				s.Active += int(n)
			}
		}
		s.Events = int(c.events)
		s.FreeBytes = db.freeBytes()
		s.Requests = tx.Bucket(bRequests).Stats().KeyN
		s.Schema = Schema
		return nil
	})
	if err != nil {
		return Stats{}, fmt.Errorf("store stats: %w", err)
	}
	fi, err := os.Stat(db.path)
	if err != nil {
		return Stats{}, fmt.Errorf("store stats: %w", err)
	}
	s.FileSize = fi.Size()
	s.Commits, s.Writes, s.Checkpoints = db.commits.Load(), db.writes.Load(), db.checkpoints.Load()
	return s, nil
}

// FileSizes returns the bytes on disk of the store file and of its
// write-ahead log (preallocated: at least wal.Prealloc while the store is
// open), from the file system alone: cheap enough for every metrics
// scrape.
func (db *DB) FileSizes() (file, log int64, err error) {
	fi, err := os.Stat(db.path)
	if err != nil {
		return 0, 0, fmt.Errorf("store file size: %w", err)
	}
	switch li, err := os.Stat(wal.Path(db.path)); {
	case err == nil:
		log = li.Size()
	case !errors.Is(err, os.ErrNotExist):
		return 0, 0, fmt.Errorf("store log size: %w", err)
	}
	return fi.Size(), log, nil
}

// StateCounts returns how many stored missions are in each state (states
// with none are left out), from the counts every write keeps: start-up
// reads them rather than the missions. Like Stats, as of the last
// checkpoint.
func (db *DB) StateCounts(ctx context.Context) (map[driver.State]int, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var c counts
	err := db.view(func(tx *bolt.Tx) error {
		var err error
		c, err = readCounts(tx)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("store state counts: %w", err)
	}
	out := map[driver.State]int{}
	for code, n := range c.states {
		if n != 0 {
			out[stateOf(byte(code))] += int(n)
		}
	}
	return out, nil
}
