package store

import (
	"bytes"
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
)

// A migration rewrites a file from schema v to v+1 inside Open's
// transaction; every bucket of the current layout exists when it runs.
type migration struct {
	name  string
	apply func(tx *bolt.Tx) error
}

// migrations[v] upgrades schema v to v+1.
var migrations = [Schema]migration{
	0: {name: "envelope missions and build indexes", apply: migrateV0},
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
		order, err := b.order.NextSequence()
		if err != nil {
			return err
		}
		w := write{id: m.ID, reqKey: m.Meta.RequestKey, version: m.Version, finished: finishedAt(&m), body: body}
		if err := w.insert(b, order); err != nil {
			return err
		}
	}
	return nil
}
