package store

import (
	"bytes"
	"context"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
)

// Lookup returns the mission created with the given request key, or an
// error wrapping driver.ErrNotFound. Pruned missions forget their keys.
func (db *DB) Lookup(ctx context.Context, requestKey string) (*driver.Mission, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if id := db.overlayOwner(requestKey); id != "" {
		return db.Get(ctx, id)
	}
	var id []byte
	err := db.view(func(tx *bolt.Tx) error {
		id = bytes.Clone(tx.Bucket(bRequests).Get([]byte(requestKey)))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("lookup request %q: %w", requestKey, err)
	}
	if id == nil {
		return nil, fmt.Errorf("lookup request %q: %w", requestKey, driver.ErrNotFound)
	}
	return db.Get(ctx, string(id))
}
