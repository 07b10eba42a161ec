package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
)

// List page sizes.
const (
	// DefaultLimit is the page size when Filter.Limit is zero.
	DefaultLimit = 100
	// MaxLimit caps Filter.Limit.
	MaxLimit = 1000
)

// Get returns the mission with the given ID, or an error wrapping
// driver.ErrNotFound.
func (db *DB) Get(ctx context.Context, id string) (*driver.Mission, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var m *driver.Mission
	var err error
	if e, ok := db.overlayEnvelope(id); ok {
		m, err = e.mission()
	} else {
		err = db.view(func(tx *bolt.Tx) error {
			e, found, err := record(tx.Bucket(bMissions), tx.Bucket(bLive), []byte(id))
			if err != nil || !found {
				return err
			}
			m, err = e.mission() // decoding copies out of the mmap
			return err
		})
	}
	if err != nil {
		return nil, fmt.Errorf("get mission %q: %w", id, err)
	}
	if m == nil {
		return nil, fmt.Errorf("get mission %q: %w", id, driver.ErrNotFound)
	}
	return m, nil
}

// Active returns every mission that is not terminal, in ID order, reading
// the active index rather than every mission.
func (db *DB) Active(ctx context.Context) ([]*driver.Mission, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []*driver.Mission
	err := db.scan(func(tx *bolt.Tx) error {
		missions, live := tx.Bucket(bMissions), tx.Bucket(bLive)
		return tx.Bucket(bActive).ForEach(func(id, _ []byte) error {
			e, found, err := record(missions, live, id)
			if err != nil {
				return err
			}
			if !found {
				return fmt.Errorf("%w: active index names missing mission %q", ErrCorrupt, id)
			}
			m, err := e.mission() // decoding copies out of the mmap
			if err != nil {
				return err
			}
			out = append(out, m)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("active missions: %w", err)
	}
	return out, nil
}

// List returns missions that match f, newest (last created) first, and
// the cursor of the next page, "" when no further mission matches. A
// cursor stays valid across writes: pages continue below the last
// mission returned. Limit is DefaultLimit when zero or negative and at
// most MaxLimit. A cursor List did not return fails with ErrCursor.
func (db *DB) List(ctx context.Context, f driver.Filter) ([]*driver.Mission, string, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = DefaultLimit
	}
	limit = min(limit, MaxLimit)
	var below uint64 // exclusive bound on the creation sequence; 0: none
	if f.After != "" {
		var err error
		if below, err = parseCursor(f.After); err != nil {
			return nil, "", fmt.Errorf("list missions: %w", err)
		}
	}
	var (
		out  []*driver.Mission
		last uint64
		next string
	)
	err := db.scan(func(tx *bolt.Tx) error {
		missions, live := tx.Bucket(bMissions), tx.Bucket(bLive)
		c := tx.Bucket(bOrder).Cursor()
		k, id := c.Last()
		if below != 0 {
			if k, _ = c.Seek(be64(below)); k != nil {
				k, id = c.Prev()
			} else {
				k, id = c.Last()
			}
		}
		for n := 1; k != nil; k, id = c.Prev() {
			if n++; n%256 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			e, found, err := record(missions, live, id)
			if err == nil && !found {
				err = fmt.Errorf("%w: order index names missing mission %q", ErrCorrupt, id)
			}
			var m *driver.Mission
			if err == nil {
				// Decoding copies, so nothing returned aliases the mmap.
				m, err = e.mission()
			}
			if err != nil {
				return fmt.Errorf("mission %q: %w", id, err)
			}
			if !f.Match(m) {
				continue
			}
			if len(out) == limit {
				// One more match exists, so the cursor is not a dead end.
				next = formatCursor(last)
				break
			}
			out = append(out, m)
			last = binary.BigEndian.Uint64(k)
		}
		return nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("list missions: %w", err)
	}
	return out, next, nil
}

// The cursor is the creation sequence of the last mission returned, as
// text so that it travels in URLs and JSON.
func formatCursor(seq uint64) string { return hex.EncodeToString(be64(seq)) }

func parseCursor(s string) (uint64, error) {
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != 8 || binary.BigEndian.Uint64(b) == 0 {
		return 0, fmt.Errorf("%w: %q", ErrCursor, s)
	}
	return binary.BigEndian.Uint64(b), nil
}

// Timeline returns a mission's events in seq order, or an error wrapping
// driver.ErrNotFound for an unknown mission.
func (db *DB) Timeline(ctx context.Context, id string) ([]driver.Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var recs [][]byte
	found := false
	err := db.scan(func(tx *bolt.Tx) error {
		rec := tx.Bucket(bMissions).Get([]byte(id))
		if rec == nil {
			return nil
		}
		found = true
		h, err := parseEnvelope(rec)
		if err != nil {
			return err
		}
		if h.form == formArchive {
			evs, err := h.events()
			for _, ev := range evs {
				recs = append(recs, ev.data)
			}
			return err
		}
		prefix := timelinePrefix(id)
		c := tx.Bucket(bTimeline).Cursor()
		for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			recs = append(recs, bytes.Clone(v))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("timeline of %q: %w", id, err)
	}
	if !found {
		return nil, fmt.Errorf("timeline of %q: %w", id, driver.ErrNotFound)
	}
	out := make([]driver.Event, len(recs))
	for i, rec := range recs {
		if err := json.Unmarshal(rec, &out[i]); err != nil {
			return nil, fmt.Errorf("timeline of %q: %w: event: %w", id, ErrCorrupt, err)
		}
	}
	return out, nil
}
