package store

import (
	"errors"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// TestReviewReplayBeforeSchemaCheck: Open replays the log before init
// checks the file's schema, so a file a newer build wrote (with that
// build's log beside it) is modified by this older build before Open
// rejects it with ErrSchema.
func TestReviewReplayBeforeSchemaCheck(t *testing.T) {
	db, path := openPaused(t)
	mustCreate(t, db, newMission(mid(1))) // only in the log
	crash(t, db)

	// As a newer build would have left the file.
	bdb, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := bdb.Update(func(tx *bolt.Tx) error { return tx.Bucket(bMeta).Put(kSchema, be64(Schema+1)) }); err != nil {
		t.Fatal(err)
	}
	bdb.Close()

	if db, err := Open(path, testOptions()); !errors.Is(err, ErrSchema) {
		if err == nil {
			db.Close()
		}
		t.Fatalf("Open = %v, want ErrSchema", err)
	}
	bdb, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer bdb.Close()
	bdb.View(func(tx *bolt.Tx) error {
		if _, lsn := walMeta(tx); lsn != 0 {
			t.Errorf("Open refused the newer file but first replayed its log into it (wal_lsn %d, want 0)", lsn)
		}
		if tx.Bucket(bMissions).Get([]byte(mid(1))) != nil {
			t.Errorf("the rejected file now holds %s, applied by this build's replay", mid(1))
		}
		return nil
	})
}
