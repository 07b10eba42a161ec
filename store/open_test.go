package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
)

func TestOpenLocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sortie.db")
	first, err := Open(path, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(t, first, newMission(mid(1)))

	// flock locks belong to open files, not processes, so a second Open
	// in this process contends like another agent would.
	opts := testOptions()
	opts.Timeout = 150 * time.Millisecond
	started := time.Now()
	second, err := Open(path, opts)
	waited := time.Since(started)
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open = %v, want ErrLocked (Close: %v)", err, second.Close())
	}
	if msg := err.Error(); !strings.Contains(msg, path) || !strings.Contains(msg, "150ms") {
		t.Errorf("error %q does not name the file and the timeout", msg)
	}
	if waited < 100*time.Millisecond || waited > 5*time.Second {
		t.Errorf("second Open gave up after %s, want about 150ms", waited)
	}

	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	db := openAt(t, path)
	mustGet(t, db, mid(1))
}

func TestOpenDefaultTimeout(t *testing.T) {
	if o := (Options{Timeout: -1}).withDefaults(); o.Timeout != DefaultTimeout || o.Logger == nil || o.Mode != 0o600 {
		t.Errorf("defaults = %+v", o)
	}
}

func TestOpenCorrupt(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	garbage := make([]byte, 64<<10)
	for i := range garbage {
		garbage[i] = byte(rng.Uint32())
	}

	// valid is a real store with its pages after the two meta pages
	// overwritten: bbolt's meta checksums pass, its tree is garbage.
	dir := t.TempDir()
	valid := filepath.Join(dir, "valid.db")
	db, err := Open(valid, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		mustCreate(t, db, newMission(mid(i)))
	}
	mustClose(t, db)
	good, err := os.ReadFile(valid)
	if err != nil {
		t.Fatal(err)
	}
	pageSize := os.Getpagesize()
	smashed := append([]byte(nil), good...)
	for i := 2 * pageSize; i < len(smashed); i++ {
		smashed[i] = byte(rng.Uint32())
	}
	badMeta := append([]byte(nil), good...)
	for i := 0; i < 2*pageSize; i += 7 {
		badMeta[i] ^= 0xff
	}

	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"garbage", garbage},
		{"short", []byte("hello, not a database")},
		{"bad meta pages", badMeta},
		{"smashed pages", smashed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "sortie.db")
			if err := os.WriteFile(path, tc.data, 0o600); err != nil {
				t.Fatal(err)
			}
			db, err := Open(path, testOptions())
			if err == nil {
				t.Fatalf("Open succeeded (Close: %v)", db.Close())
			}
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), path) {
				t.Errorf("Open = %v, want ErrCorrupt naming %s", err, path)
			}
			// A failed Open must not keep the file locked.
			writeFile(t, path, nil)
			db, err = Open(path, testOptions())
			if err != nil {
				t.Fatalf("Open after replacing the file: %v", err)
			}
			mustClose(t, db)
		})
	}
}

func TestOpenUnwritable(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "plain")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := map[string]string{
		"parent is a file":  filepath.Join(file, "sortie.db"),
		"missing directory": filepath.Join(dir, "absent", "sortie.db"),
	}
	if os.Geteuid() != 0 { // root writes anywhere
		ro := filepath.Join(dir, "ro")
		if err := os.Mkdir(ro, 0o500); err != nil {
			t.Fatal(err)
		}
		cases["read-only directory"] = filepath.Join(ro, "sortie.db")
	}
	for name, path := range cases {
		t.Run(name, func(t *testing.T) {
			db, err := Open(path, testOptions())
			if err == nil {
				t.Fatalf("Open succeeded (Close: %v)", db.Close())
			}
			if !strings.Contains(err.Error(), path) || errors.Is(err, ErrCorrupt) || errors.Is(err, ErrLocked) {
				t.Errorf("Open = %v, want a plain error naming %s", err, path)
			}
		})
	}
}

// writeBolt makes a bbolt file by hand, as an older or newer build, or
// another program, would have left it.
func writeBolt(t *testing.T, fill func(tx *bolt.Tx) error) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sortie.db")
	bdb, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := bdb.Update(fill); err != nil {
		t.Fatal(err)
	}
	if err := bdb.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func putV0(b *bolt.Bucket, m *driver.Mission) error {
	data, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return b.Put([]byte(m.ID), data)
}

func TestMigrateV0(t *testing.T) {
	live, done, keyed := newMission(mid(1)), newMission(mid(2)), newMission(mid(3))
	done.State, done.Version, done.Meta.Finished = driver.StateSucceeded, 7, t0.Add(time.Hour)
	keyed.Meta.RequestKey = "req-3"
	path := writeBolt(t, func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket(bMissions)
		if err != nil {
			return err
		}
		for _, m := range []*driver.Mission{keyed, live, done} {
			if err := putV0(b, m); err != nil {
				return err
			}
		}
		return nil
	})

	db := openAt(t, path)
	for _, m := range []*driver.Mission{live, done, keyed} {
		sameJSON(t, mustGet(t, db, m.ID), m)
	}
	active, _ := db.Active(t.Context())
	if got := ids(active); len(got) != 2 || got[0] != live.ID || got[1] != keyed.ID {
		t.Errorf("Active = %v, want [%s %s]", got, live.ID, keyed.ID)
	}
	page, _, _ := db.List(t.Context(), driver.Filter{})
	if got := ids(page); len(got) != 3 || got[0] != keyed.ID || got[2] != live.ID {
		t.Errorf("List = %v, want ID order reversed", got)
	}
	dup := newMission(mid(4))
	dup.Meta.RequestKey = "req-3"
	if got, created, err := db.Create(t.Context(), dup, nil); err != nil || created || got.ID != keyed.ID {
		t.Errorf("request key of a migrated mission: got %v created %v err %v", got, created, err)
	}
	n := mustSave(t, db, done, driver.StateRunning) // the migrated version is kept
	if n.Version != 8 {
		t.Errorf("version after save = %d", n.Version)
	}
	var schema []byte
	if err := db.view(func(tx *bolt.Tx) error {
		schema = append(schema, tx.Bucket(bMeta).Get(kSchema)...)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if binary.BigEndian.Uint64(schema) != Schema {
		t.Errorf("meta schema = %x, want %d", schema, Schema)
	}
}

func TestMigrateV0Corrupt(t *testing.T) {
	path := writeBolt(t, func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket(bMissions)
		if err != nil {
			return err
		}
		if err := putV0(b, newMission(mid(1))); err != nil {
			return err
		}
		return b.Put([]byte(mid(2)), []byte("{not json"))
	})
	_, err := Open(path, testOptions())
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), mid(2)) || !strings.Contains(err.Error(), "migrate schema 0 to 1") {
		t.Fatalf("Open = %v, want ErrCorrupt naming the record and the migration", err)
	}
	// The failed migration rolled back: the file is still at schema 0,
	// its records as they were.
	bdb, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer mustClose(t, bdb)
	if err := bdb.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bMeta).Get(kSchema); binary.BigEndian.Uint64(v) != 0 {
			t.Errorf("schema after a failed migration = %x, want 0", v)
		}
		if v := tx.Bucket(bMissions).Get([]byte(mid(1))); len(v) == 0 || v[0] != '{' {
			t.Errorf("v0 record after a failed migration = %.20q, want it untouched", v)
		}
		if tx.Bucket(bOrder).Stats().KeyN != 0 {
			t.Error("failed migration left index entries behind")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestOpenRejectsSchema(t *testing.T) {
	for _, tc := range []struct {
		name string
		fill func(tx *bolt.Tx) error
		want string
	}{
		{"newer", func(tx *bolt.Tx) error {
			b, _ := tx.CreateBucket(bMeta)
			return b.Put(kSchema, be64(Schema+1))
		}, fmt.Sprintf("schema %d, newer than this build's %d", Schema+1, Schema)},
		{"far newer", func(tx *bolt.Tx) error {
			b, _ := tx.CreateBucket(bMeta)
			return b.Put(kSchema, be64(1<<40))
		}, fmt.Sprintf("newer than this build's %d", Schema)},
		{"foreign", func(tx *bolt.Tx) error {
			_, err := tx.CreateBucket([]byte("sessions"))
			return err
		}, `not a sortie store (it has bucket "sessions"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeBolt(t, tc.fill)
			db, err := Open(path, testOptions())
			if err == nil {
				t.Fatalf("Open succeeded (Close: %v)", db.Close())
			}
			if !errors.Is(err, ErrSchema) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
				t.Errorf("Open = %v, want ErrSchema with %q and the path", err, tc.want)
			}
		})
	}
	t.Run("bad meta", func(t *testing.T) {
		path := writeBolt(t, func(tx *bolt.Tx) error {
			b, _ := tx.CreateBucket(bMeta)
			return b.Put(kSchema, []byte("1"))
		})
		if _, err := Open(path, testOptions()); !errors.Is(err, ErrCorrupt) {
			t.Errorf("Open = %v, want ErrCorrupt", err)
		}
	})
}

func TestRecordSchema(t *testing.T) {
	db := openTest(t)
	m := newMission(mid(1))
	mustCreate(t, db, m)
	if err := db.checkpoint(); err != nil { // the record is edited in bbolt
		t.Fatal(err)
	}
	for _, tc := range []struct {
		schema byte
		want   error
	}{{driver.SchemaVersion + 1, ErrSchema}, {0, ErrCorrupt}} {
		err := db.bolt.Update(func(tx *bolt.Tx) error {
			b := tx.Bucket(bMissions)
			rec := append([]byte(nil), b.Get([]byte(m.ID))...)
			rec[1] = tc.schema
			return b.Put([]byte(m.ID), rec)
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Get(t.Context(), m.ID); !errors.Is(err, tc.want) {
			t.Errorf("Get of a schema %d record = %v, want %v", tc.schema, err, tc.want)
		}
		n, evs := advance(m, driver.StateRunning)
		if err := db.Save(t.Context(), n, evs); !errors.Is(err, tc.want) {
			t.Errorf("Save over a schema %d record = %v, want %v", tc.schema, err, tc.want)
		}
	}
	// Put it back so the cleanup's invariant check passes.
	if err := db.bolt.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bMissions)
		rec := append([]byte(nil), b.Get([]byte(m.ID))...)
		rec[1] = driver.SchemaVersion
		return b.Put([]byte(m.ID), rec)
	}); err != nil {
		t.Fatal(err)
	}
}

// TestOpenDamagedRootPageIsErrCorrupt: a file whose meta pages are
// intact but whose root page is damaged fails Open with ErrCorrupt.
//
// Found by review (as TestReviewOpenDamagedRootPanics): Open came to
// read the tree in replayWAL (its View for walMeta, and the replay's
// Update) before init, whose recover turned bbolt's panics on a damaged
// file into ErrCorrupt, so such a file made Open panic instead.
func TestOpenDamagedRootPageIsErrCorrupt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sortie.db")
	db, err := Open(path, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		mustCreate(t, db, newMission(mid(i)))
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The newer of the two meta pages names the root bucket's page.
	pageSize := int(binary.LittleEndian.Uint32(data[16+8:]))
	var root uint64
	var txid uint64
	for i := range 2 {
		m := data[i*pageSize+16:]
		if tx := binary.LittleEndian.Uint64(m[48:]); tx >= txid {
			txid, root = tx, binary.LittleEndian.Uint64(m[16:])
		}
	}
	page := bytes.Repeat([]byte{0xff}, pageSize)
	writeAt(t, path, int64(root)*int64(pageSize), page)

	err = func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("Open panicked: %v", r)
			}
		}()
		db, err := Open(path, testOptions())
		if err == nil {
			return errors.Join(errors.New("Open succeeded"), db.Close())
		}
		return err
	}()
	if !errors.Is(err, ErrCorrupt) {
		t.Errorf("Open of a file with a damaged root page = %v, want ErrCorrupt", err)
	}
}
