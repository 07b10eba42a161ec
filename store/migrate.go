package store

import (
	"bytes"
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
)

// A migration rewrites a file from schema v to v+1. Those with apply run
// inside Open's transaction, with every bucket of the current layout
// present; those with batched run after it, in transactions of their
// own, and pick up where an interrupted run left off.
type migration struct {
	name    string
	apply   func(tx *bolt.Tx) error
	batched func(db *bolt.DB) error
}

// migrations[v] upgrades schema v to v+1.
var migrations = [Schema]migration{
	0: {name: "envelope missions and build indexes", apply: migrateV0},
	1: {name: "compact records: archive finished missions with their timelines, count missions by state", batched: migrateV1},
}

// migrateV0 upgrades the pre-release layout: a missions bucket of bare
// mission JSON with no meta, indexes or timelines. Missions get envelopes
// and index entries, numbered in ID order (IDs sort by creation).
func migrateV0(tx *bolt.Tx) error {
	b := bucketsOf(tx)
	type rec struct{ key, val []byte }
	var recs []rec
	// Collect first: bbolt cursors must not run over a bucket being written.
	if err := b.missions.ForEach(func(k, v []byte) error {
		recs = append(recs, rec{bytes.Clone(k), bytes.Clone(v)})
		return nil
	}); err != nil {
		return err
	}
	c, err := readCounts(tx)
	if err != nil {
		return err
	}
	a := newApplier(b, &c)
	for _, r := range recs {
		var m driver.Mission
		if err := json.Unmarshal(r.val, &m); err != nil {
			return fmt.Errorf("%w: v0 mission %q: %w", ErrCorrupt, r.key, err)
		}
		if m.ID != string(r.key) {
			return fmt.Errorf("%w: v0 mission under key %q has id %q", ErrCorrupt, r.key, m.ID)
		}
		body, err := json.Marshal(&m)
		if err != nil {
			return fmt.Errorf("v0 mission %q: %w", m.ID, err)
		}
		if err := b.missions.Delete(r.key); err != nil {
			return err
		}
		w := &write{create: true, id: m.ID, reqKey: m.Meta.RequestKey, version: m.Version, finished: finishedAt(&m), state: stateCode(m.State), seq: m.Seq, body: body}
		if err := a.add(w); err != nil {
			return err
		}
	}
	if err := a.flush(func(string, error) {}); err != nil {
		return err
	}
	return writeCounts(tx, &c)
}

// migrateBatch is how many missions one transaction of migrateV1
// converts: a gateway's file of 100,000 missions is never rewritten in
// one transaction held in memory.
var migrateBatch = 512

// afterMigrateBatch, when set (by tests), runs after each batch of
// migrateV1 commits; an error stops the migration there.
var afterMigrateBatch func() error

var kMigrateCursor = []byte("migrate_cursor")

// migrateV1 rewrites schema 1 records (a 33-byte header and JSON, their
// events in the timeline bucket) as schema 2 records: finished missions
// become archives holding their events, live ones get the new header.
// Each batch records the last mission it converted and adds what it
// converted to the per-state counts, so a run cut short by a crash
// resumes after it; records already in the new form are skipped.
func migrateV1(bdb *bolt.DB) error {
	for {
		done := false
		err := bdb.Update(func(tx *bolt.Tx) error {
			b := bucketsOf(tx)
			meta := tx.Bucket(bMeta)
			c, err := readCounts(tx)
			if err != nil {
				return err
			}
			type rec struct{ key, val []byte }
			var recs []rec
			cur := b.missions.Cursor()
			k, v := cur.First()
			if from := meta.Get(kMigrateCursor); from != nil {
				if k, v = cur.Seek(from); k != nil && bytes.Equal(k, from) {
					k, v = cur.Next()
				}
			}
			for ; k != nil; k, v = cur.Next() {
				if len(v) > 0 && v[0] == 1 { // a schema 1 envelope
					recs = append(recs, rec{bytes.Clone(k), bytes.Clone(v)})
				}
				if len(recs) == migrateBatch {
					break // at the last one taken: the cursor records it
				}
			}
			done = k == nil
			last := k
			for _, r := range recs {
				if err := convertV1(b, &c, r.key, r.val); err != nil {
					return err
				}
			}
			if err := writeCounts(tx, &c); err != nil {
				return err
			}
			if done {
				return meta.Delete(kMigrateCursor)
			}
			return meta.Put(kMigrateCursor, bytes.Clone(last))
		})
		if err != nil || done {
			return err
		}
		if afterMigrateBatch != nil {
			if err := afterMigrateBatch(); err != nil {
				return err
			}
		}
	}
}

// convertV1 rewrites one schema 1 record. A record that does not decode
// is left as it is, for reads to report.
func convertV1(b *txBuckets, c *counts, key, val []byte) error {
	h, err := parseEnvelope(val)
	if err != nil {
		return nil
	}
	var m struct {
		State driver.State `json:"state"`
	}
	if json.Unmarshal(h.body, &m) != nil {
		return nil
	}
	h.form, h.state = formJSON, stateCode(m.State)
	c.add(h.state, 1)
	if h.finished == 0 {
		n, err := countTimeline(b, string(key))
		if err != nil {
			return err
		}
		c.events += n
		if err := b.live.Put(key, h.body); err != nil {
			return err
		}
		h.form, h.body = formLive, nil
		return b.missions.Put(key, h.encode())
	}
	evs, err := oldEvents(b, string(key), h)
	if err != nil {
		return err
	}
	c.events += int64(len(evs))
	h.form = formArchive
	out := make([]byte, headerLen, headerLen+len(h.body)/4)
	out = appendArchive(out, h.body, evs)
	h.putHeader(out)
	return b.missions.Put(key, out)
}

func countTimeline(b *txBuckets, id string) (int64, error) {
	prefix := timelinePrefix(id)
	var n int64
	c := b.timeline.Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		n++
	}
	return n, nil
}

// recount counts the stored missions and events from scratch, for a file
// whose counts were damaged.
func recount(tx *bolt.Tx) (counts, error) {
	var c counts
	b := bucketsOf(tx)
	err := b.missions.ForEach(func(k, v []byte) error {
		h, err := parseEnvelope(v)
		if err != nil {
			return nil // reported by reads of it
		}
		c.add(h.state, 1)
		if h.form == formArchive {
			evs, err := h.events()
			if err == nil {
				c.events += int64(len(evs))
			}
		}
		return nil
	})
	if err != nil {
		return counts{}, err
	}
	c.events += int64(b.timeline.Stats().KeyN)
	return c, nil
}
