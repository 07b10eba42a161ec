package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/store/internal/wal"
)

// A backup taken while writes go on holds every write acknowledged
// before it began, is a store file of its own, and opens as one.
func TestBackupWhileRunning(t *testing.T) {
	db := openTest(t)
	ms := make([]*driver.Mission, 20)
	for i := range ms {
		ms[i] = newMission(mid(i))
		mustCreate(t, db, ms[i])
	}
	// The last write is in the log only: no checkpoint has run yet.
	ms[0] = mustSave(t, db, ms[0], driver.StateRunning)
	db.wmu.Lock()
	inLogOnly := db.appliedLSN() < logOf(db).LSN()
	db.wmu.Unlock()
	if !inLogOnly {
		t.Fatal("the last write was checkpointed already; the test needs it in the log only")
	}

	// Writers keep going during the backup.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 100; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			m := newMission(mid(i))
			if _, _, err := db.Create(context.Background(), m, []driver.Event{event(m, 1, driver.StatePending)}); err != nil {
				t.Error(err)
				return
			}
		}
	})
	var buf bytes.Buffer
	n, err := db.Backup(&buf)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("Backup: %v", err)
	}
	if n != int64(buf.Len()) {
		t.Errorf("Backup says %d bytes, wrote %d", n, buf.Len())
	}
	path := filepath.Join(t.TempDir(), "copy.db")
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := CheckFile(path); err != nil {
		t.Fatalf("CheckFile of the backup: %v", err)
	}
	cp := openAt(t, path)
	got := mustGet(t, cp, ms[0].ID)
	if got.State != driver.StateRunning || got.Version != ms[0].Version {
		t.Errorf("backup has %s v%d of %s, want the acknowledged RUNNING v%d", got.State, got.Version, got.ID, ms[0].Version)
	}
	for _, m := range ms[1:] {
		mustGet(t, cp, m.ID)
	}
}

func TestCheckFileRefusesDamage(t *testing.T) {
	db := openTest(t)
	mustCreate(t, db, newMission(mid(1)))
	var buf bytes.Buffer
	if _, err := db.Backup(&buf); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, b := range map[string][]byte{
		"truncated": buf.Bytes()[:buf.Len()/2],
		"empty":     nil,
		"not bbolt": bytes.Repeat([]byte("sortie"), 4096),
	} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := CheckFile(path); err == nil {
			t.Errorf("%s: CheckFile accepted it", name)
		}
	}
	if err := CheckFile(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v, want ErrNotExist", err)
	}
}

func TestBackupAfterClose(t *testing.T) {
	db, err := Open(filepath.Join(t.TempDir(), "s.db"), testOptions())
	if err != nil {
		t.Fatal(err)
	}
	mustClose(t, db)
	if _, err := db.Backup(&bytes.Buffer{}); err == nil {
		t.Error("Backup of a closed store succeeded")
	}
}

// A backup given its own identity refuses the log of the database it
// was copied from, rather than replaying writes made after it.
func TestNewIdentityRefusesOldLog(t *testing.T) {
	db, live, m, backup := backedUp(t)
	mustSave(t, db, m, driver.StateRunning) // after the backup, in the log only
	// The agent dies: the log stays. Keep a copy of it and let Close
	// remove the original.
	oldLog, err := os.ReadFile(wal.Path(live))
	if err != nil {
		t.Fatal(err)
	}
	mustClose(t, db)
	if err := os.WriteFile(live, backup, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(wal.Path(live), oldLog, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := NewIdentity(live); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(live, testOptions()); !errors.Is(err, ErrForeignLog) {
		t.Fatalf("Open beside the old log: %v, want ErrForeignLog", err)
	}
	if err := os.Remove(wal.Path(live)); err != nil {
		t.Fatal(err)
	}
	got := mustGet(t, openAt(t, live), m.ID)
	if got.Version != m.Version {
		t.Errorf("restored v%d, want the backup's v%d", got.Version, m.Version)
	}
}

// backedUp opens a store (the caller closes it) with one mission, and
// returns its path, the mission and a backup taken then.
func backedUp(t *testing.T) (db *DB, path string, m *driver.Mission, backup []byte) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "missions.db")
	db, err := Open(path, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	m = newMission(mid(1))
	mustCreate(t, db, m)
	var buf bytes.Buffer
	if _, err := db.Backup(&buf); err != nil {
		t.Fatal(err)
	}
	return db, path, m, buf.Bytes()
}

// WriteBackup puts a whole copy in place, and refuses, leaving the
// destination as it was, a copy shorter than announced or a destination
// a store has open.
func TestWriteBackup(t *testing.T) {
	db, live, m, b := backedUp(t)
	defer mustClose(t, db)
	dst := filepath.Join(t.TempDir(), "copy.db")
	if _, err := WriteBackup(bytes.NewReader(b[:len(b)-1]), int64(len(b)), dst); err == nil {
		t.Fatal("took a copy shorter than announced")
	}
	if _, err := os.Stat(dst); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused copy left %s: %v", dst, err)
	}
	if n, err := WriteBackup(bytes.NewReader(b), int64(len(b)), dst); err != nil || n != int64(len(b)) {
		t.Fatalf("WriteBackup: %d, %v", n, err)
	}
	mustGet(t, openAt(t, dst), m.ID)
	if _, err := WriteBackup(bytes.NewReader(b), -1, live); !errors.Is(err, ErrLocked) {
		t.Errorf("over an open store: %v, want ErrLocked", err)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(dst), "*.part-*")); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// TestCheckFileLayouts: CheckFile accepts every layout bbolt writes and
// opens, its own check of the page structure included: other page sizes,
// and a damaged first meta page, which bbolt passes over for the second.
// It refuses a file written without a freelist, which the store never
// writes.
func TestCheckFileLayouts(t *testing.T) {
	backup := checkBase(t, 40, 20000) // the big context takes overflow pages
	dir := t.TempDir()
	base := filepath.Join(dir, "base.db")
	if err := os.WriteFile(base, backup, 0o600); err != nil {
		t.Fatal(err)
	}
	relayout := func(name string, opts bolt.Options) string {
		src, err := bolt.Open(base, 0, &bolt.Options{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		defer mustClose(t, src)
		p := filepath.Join(dir, name)
		dst, err := bolt.Open(p, 0o600, &opts)
		if err != nil {
			t.Fatal(err)
		}
		if err := bolt.Compact(dst, src, 1<<20); err != nil {
			t.Fatal(err)
		}
		if err := dst.Close(); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, ps := range []int{1024, 16 << 10, 64 << 10, 128 << 10} {
		if err := CheckFile(relayout(fmt.Sprintf("pages-%d.db", ps), bolt.Options{PageSize: ps})); err != nil {
			t.Errorf("page size %d: %v", ps, err)
		}
	}
	b := bytes.Clone(backup)
	b[16+8] ^= 0x01 // meta page 0's page size
	damaged := filepath.Join(dir, "meta0.db")
	if err := os.WriteFile(damaged, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := CheckFile(damaged); err != nil {
		t.Errorf("a damaged first meta page, with the second intact: %v", err)
	}
	if err := CheckFile(relayout("nofreelist.db", bolt.Options{NoFreelistSync: true})); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "without a freelist") {
		t.Errorf("a file without a freelist: %v, want ErrCorrupt saying so", err)
	}
}

// TestCheckFileRecords: damage inside a mission record or a timeline
// event, which bbolt cannot see, is found by decoding them.
func TestCheckFileRecords(t *testing.T) {
	backup, id := checkBase(t, 1, 0), mid(0)
	for _, c := range []struct{ name, find, want string }{
		{"mission", `"id":"` + id + `"`, `mission "` + id + `"`},
		{"event", `"mission_id":"` + id + `"`, `mission "` + id + `", event 1`},
	} {
		b := bytes.Clone(backup)
		i := bytes.Index(b, []byte(c.find))
		if i < 0 {
			t.Fatalf("%s: %s not in the file", c.name, c.find)
		}
		b[i] = '!' // the record no longer decodes; its length is unchanged
		path := filepath.Join(t.TempDir(), "damaged.db")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := CheckFile(path); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s damaged: %v, want ErrCorrupt naming %s", c.name, err, c.want)
		}
	}
}
