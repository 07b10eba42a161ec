package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
)

// bControls keeps the answers to the hub's latest control requests by
// request ID, each after an 8-byte big-endian order stamp.
var bControls = []byte("controls")

// MaxControls is how many control answers RememberControl keeps: far
// more than a hub can have waiting on one gateway.
const MaxControls = 256

// RememberControl keeps the answer to control request id, so that the
// request sent again after the gateway restarted is answered from here
// rather than carried out twice. Past MaxControls the oldest answer is
// forgotten. A request already remembered keeps its first answer.
func (db *DB) RememberControl(ctx context.Context, id string, answer []byte) error {
	if err := driver.ValidateID("control id", id); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	err := db.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bControls)
		if b.Get([]byte(id)) != nil {
			return nil
		}
		stamp, err := b.NextSequence()
		if err != nil {
			return err
		}
		v := make([]byte, 8, 8+len(answer))
		binary.BigEndian.PutUint64(v, stamp)
		if err := b.Put([]byte(id), append(v, answer...)); err != nil {
			return err
		}
		// Few entries and a rare write: a scan for the oldest is cheaper
		// than an index kept beside them.
		var oldest []byte
		low, n := uint64(1<<64-1), 0
		c := b.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			n++
			if len(v) >= 8 && binary.BigEndian.Uint64(v) < low {
				low, oldest = binary.BigEndian.Uint64(v), k
			}
		}
		if n > MaxControls && oldest != nil {
			return b.Delete(bytes.Clone(oldest))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("remember control %s: %w", id, err)
	}
	return nil
}

// RecallControl returns the answer RememberControl kept for request id.
func (db *DB) RecallControl(ctx context.Context, id string) ([]byte, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	var answer []byte
	err := db.view(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bControls).Get([]byte(id)); len(v) >= 8 {
			answer = bytes.Clone(v[8:])
		}
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("recall control %s: %w", id, err)
	}
	return answer, answer != nil, nil
}
