package store

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
)

// unpackV1 puts the schema 1 fixture in a temporary directory: a file
// written by the build before compact records, copied while it ran (as a
// crash leaves it), with its write-ahead log holding writes not yet in
// the file: a mission created and finished, a live one saved, one
// created, and a failed one retried. v1-crashed.json is what that build
// read back from it after a clean restart.
func unpackV1(t *testing.T) (path string, want []v1Record) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "v1.db")
	for _, f := range []struct{ src, dst string }{
		{"testdata/v1-crashed.db.gz", path},
		{"testdata/v1-crashed.db-wal.gz", path + "-wal"},
	} {
		in, err := os.Open(f.src)
		if err != nil {
			t.Fatal(err)
		}
		zr, err := gzip.NewReader(in)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(zr)
		_ = in.Close()
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f.dst, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile("testdata/v1-crashed.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	return path, want
}

type v1Record struct {
	Mission  *driver.Mission `json:"mission"`
	Timeline []driver.Event  `json:"timeline"`
}

// checkAsV1Read checks that db holds exactly what the schema 1 build read
// back, every finished mission archived, and counts that match.
func checkAsV1Read(t *testing.T, db *DB, want []v1Record) {
	t.Helper()
	states := map[driver.State]int{}
	events := 0
	for _, w := range want {
		sameJSON(t, mustGet(t, db, w.Mission.ID), w.Mission)
		tl, err := db.Timeline(t.Context(), w.Mission.ID)
		if err != nil {
			t.Fatal(err)
		}
		sameJSON(t, tl, w.Timeline)
		states[w.Mission.State]++
		events += len(w.Timeline)
	}
	got, err := db.StateCounts(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	sameJSON(t, got, states)
	st, err := db.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Missions != len(want) || st.Events != events || st.Schema != Schema {
		t.Errorf("Stats = %+v, want %d missions, %d events, schema %d", st, len(want), events, Schema)
	}
	if m, err := db.Lookup(t.Context(), "req-5"); err != nil || m.ID != mid(5) {
		t.Errorf("Lookup(req-5) = %v, %v; want mission %s: request keys survive", m, err, mid(5))
	}
	checkInvariants(t, db)
}

func TestOpenMigratesSchema1FileAndReplaysItsLog(t *testing.T) {
	path, want := unpackV1(t)
	db, err := Open(path, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	checkAsV1Read(t, db, want)
	mustClose(t, db)
	// And again, now that it is a schema 2 file with nothing to replay.
	db = openAt(t, path)
	checkAsV1Read(t, db, want)
}

func TestInterruptedMigrationResumesWithoutCountingTwice(t *testing.T) {
	path, want := unpackV1(t)
	defer func(n int) { migrateBatch, afterMigrateBatch = n, nil }(migrateBatch)
	migrateBatch = 2
	stop := errors.New("power cut")
	afterMigrateBatch = func() error { return stop }
	if _, err := Open(path, testOptions()); !errors.Is(err, stop) {
		t.Fatalf("Open = %v, want the migration stopped by %v", err, stop)
	}
	// The file is half migrated: still schema 1, a cursor, both forms.
	bdb, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	forms := map[byte]int{}
	_ = bdb.View(func(tx *bolt.Tx) error {
		if s, _ := schemaOf(tx); s != 1 || tx.Bucket(bMeta).Get(kMigrateCursor) == nil {
			t.Errorf("after one batch: schema %d, cursor %q; want 1 and a cursor", s, tx.Bucket(bMeta).Get(kMigrateCursor))
		}
		return tx.Bucket(bMissions).ForEach(func(_, v []byte) error { forms[v[0]]++; return nil })
	})
	mustClose(t, bdb)
	if forms[1] == 0 || forms[formJSON]+forms[formArchive] == 0 {
		t.Errorf("record forms after one batch = %v, want some of each", forms)
	}
	afterMigrateBatch = nil
	db := openAt(t, path)
	checkAsV1Read(t, db, want)
}

// TestSchema1BackupRestores: a backup a schema 1 build made passes the
// restore's check and is migrated when the store opens it. (A backup
// has no log: the fixture's log is left out, so the missions it holds
// are those of the file, as the schema 1 build had checkpointed them.)
func TestSchema1BackupRestores(t *testing.T) {
	backup, _ := unpackV1(t)
	if err := os.Remove(backup + "-wal"); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "missions.db")
	if _, err := Restore(backup, path); err != nil {
		t.Fatalf("Restore of a schema 1 backup: %v", err)
	}
	db := openAt(t, path)
	for i := 1; i <= 4; i++ {
		m := mustGet(t, db, mid(i))
		tl, err := db.Timeline(t.Context(), m.ID)
		if err != nil || len(tl) == 0 || tl[len(tl)-1].Seq != m.Seq {
			t.Errorf("mission %s after restore: timeline %d events, %v; want up to seq %d", m.ID, len(tl), err, m.Seq)
		}
	}
	if st, err := db.Stats(); err != nil || st.Missions != 4 || st.Schema != Schema {
		t.Errorf("Stats after restore = %+v, %v; want the 4 checkpointed missions at schema %d", st, err, Schema)
	}
}
