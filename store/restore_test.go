package store

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/store/internal/wal"
)

func TestRestore(t *testing.T) {
	db, live, m, b := backedUp(t)
	backup := filepath.Join(filepath.Dir(live), "backup.db")
	if err := os.WriteFile(backup, b, 0o600); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, db, newMission(mid(2))) // after the backup

	// Refused while the store is open.
	if _, err := Restore(backup, live); !errors.Is(err, ErrLocked) {
		t.Fatalf("Restore under an open store: %v, want ErrLocked", err)
	}
	// The agent dies: its log stays beside the file.
	oldLog, _ := os.ReadFile(wal.Path(live))
	mustClose(t, db)
	writeFile(t, wal.Path(live), oldLog)

	kept, err := Restore(backup, live)
	if err != nil {
		t.Fatal(err)
	}
	if len(kept) != 2 || !strings.Contains(kept[0], "missions.db.before-restore-") || !strings.Contains(kept[1], "missions.db-wal.before-restore-") {
		t.Errorf("kept %v, want the old file and its log", kept)
	}
	if _, err := os.Stat(wal.Path(live)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the old log is still beside the restored file: %v", err)
	}
	if left, _ := filepath.Glob(live + tempRestore + "*"); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	r := openAt(t, live)
	if got := mustGet(t, r, m.ID); got.Version != m.Version {
		t.Errorf("restored v%d, want the backup's v%d", got.Version, m.Version)
	}
	if _, err := r.Get(t.Context(), mid(2)); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("a mission made after the backup: %v, want not found", err)
	}
}

func TestRestoreRefusesBadBackup(t *testing.T) {
	db, _, _, b := backedUp(t)
	mustClose(t, db)
	for name, content := range map[string][]byte{"not a database": []byte("not a database"), "half a backup": b[:len(b)/2]} {
		dir := t.TempDir()
		live := filepath.Join(dir, "missions.db")
		bad := filepath.Join(dir, "bad.db")
		writeFile(t, bad, content)
		if _, err := Restore(bad, live); err == nil {
			t.Fatalf("%s: restored", name)
		}
		// Nothing is left, not even the empty stand-in.
		if _, err := os.Stat(live); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: a failed restore left %s: %v", name, live, err)
		}
	}
}

// Two restores in a row keep both files they replaced; a restore into a
// data directory that does not exist yet makes it.
func TestRestoreTwiceAndIntoNewDir(t *testing.T) {
	db, live, _, b := backedUp(t)
	mustClose(t, db)
	backup := writeBackup(t, b)
	if err := os.Chmod(live, 0o640); err != nil {
		t.Fatal(err)
	}
	k1, err := Restore(backup, live)
	if err != nil {
		t.Fatal(err)
	}
	k2, err := Restore(backup, live)
	if err != nil {
		t.Fatal(err)
	}
	if len(k1) != 1 || len(k2) != 1 || k1[0] == k2[0] {
		t.Fatalf("kept %v then %v, want two different files", k1, k2)
	}
	for _, k := range append(k1, k2...) {
		if err := CheckFile(k); err != nil {
			t.Errorf("kept %s: %v", k, err)
		}
	}
	if fi, err := os.Stat(live); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("restored file: %v %v, want the mode of the one it replaced (0640)", fi.Mode(), err)
	}
	fresh := filepath.Join(t.TempDir(), "new", "data", "missions.db")
	if _, err := Restore(backup, fresh); err != nil {
		t.Fatalf("restore into a new directory: %v", err)
	}
	openAt(t, fresh)
}

// With no database yet, Restore locks a stand-in for the time it
// writes, so a store starting meanwhile waits and then opens the
// restored file instead of creating one the swap would unlink.
func TestRestoreIntoNothing(t *testing.T) {
	db, _, m, b := backedUp(t)
	mustClose(t, db)
	backup := writeBackup(t, b)
	live := filepath.Join(t.TempDir(), "missions.db")
	if _, err := Restore(backup, live); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, openAt(t, live), m.ID); got.Version != m.Version {
		t.Errorf("restored v%d", got.Version)
	}
}

// A backup copy leaves no file behind, and Open removes what a dead
// process left.
func TestBackupFileLeavesNothing(t *testing.T) {
	db, path, _, _ := backedUp(t)
	defer mustClose(t, db)
	rc, n, err := db.BackupFile()
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(rc)
	err = errors.Join(err, rc.Close())
	if err != nil || int64(len(b)) != n || n == 0 {
		t.Fatalf("read %d of %d bytes: %v", len(b), n, err)
	}
	dir := filepath.Dir(path)
	if left, _ := filepath.Glob(filepath.Join(dir, "*"+tempBackup+"*")); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	mustClose(t, db)
	for _, name := range []string{tempBackup + "123", tempRestore + "456"} {
		writeFile(t, path+name, []byte("stale"))
	}
	writeFile(t, filepath.Join(dir, "unrelated"+tempBackup+"1"), []byte("keep"))
	openAt(t, path)
	left, _ := os.ReadDir(dir)
	var names []string
	for _, e := range left {
		names = append(names, e.Name())
	}
	for _, n := range names {
		if strings.Contains(n, tempBackup+"123") || strings.Contains(n, tempRestore) {
			t.Errorf("Open left %s", n)
		}
	}
	if !slices.Contains(names, "unrelated"+tempBackup+"1") {
		t.Errorf("Open removed a file not its own: %v", names)
	}
}

// writeBackup writes backup bytes to a file of their own.
func writeBackup(t *testing.T, b []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "backup.db")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A store that got the lock of a file a restore has just replaced opens
// the file now at its path, not the old one.
func TestOpenFollowsReplacedFile(t *testing.T) {
	db, live, m, b := backedUp(t)
	mustSave(t, db, m, driver.StateRunning) // the live file moves on past the backup
	mustClose(t, db)
	backup := writeBackup(t, b)
	swapped := false
	lockedHook = func(path string) {
		if swapped || path != live {
			return
		}
		swapped = true
		// What a restore does between our open and our check.
		if err := os.Rename(backup, live); err != nil {
			t.Error(err)
		}
	}
	defer func() { lockedHook = nil }()
	got := mustGet(t, openAt(t, live), m.ID)
	if !swapped {
		t.Fatal("the hook did not run")
	}
	if got.Version != m.Version {
		t.Errorf("opened v%d, the replaced file's; want the file now at the path (v%d)", got.Version, m.Version)
	}
}

// A restore that fails once it holds the lock (here: a backup without
// the meta bucket an identity needs) leaves no empty stand-in behind.
func TestRestoreFailureRemovesStandIn(t *testing.T) {
	backup := filepath.Join(t.TempDir(), "old.db")
	bdb, err := bolt.Open(backup, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := bdb.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket(bMissions); return err }); err != nil {
		t.Fatal(err)
	}
	mustClose(t, bdb)
	if err := CheckFile(backup); err != nil {
		t.Fatalf("the test needs a backup CheckFile accepts: %v", err)
	}
	live := filepath.Join(t.TempDir(), "missions.db")
	if _, err := Restore(backup, live); err == nil {
		t.Fatal("restored a backup with no meta bucket")
	}
	if _, err := os.Stat(live); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the stand-in is still there: %v", err)
	}
}

// TestRestoredOutboxNeverReusesASeq: the hub acks by outbox seq; a
// store restored from a backup must not hand out again the seqs its
// original wrote after the backup (the hub would take new entries for
// ones it stored, and its ack would delete them unsent).
func TestRestoredOutboxNeverReusesASeq(t *testing.T) {
	live := filepath.Join(t.TempDir(), "missions.db")
	opts := testOptions()
	opts.Outbox = true
	db, err := Open(live, opts)
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(t, db, newMission(mid(1)))
	var buf bytes.Buffer
	if _, err := db.Backup(&buf); err != nil {
		t.Fatal(err)
	}
	for i := 2; i <= 4; i++ {
		mustCreate(t, db, newMission(mid(i))) // after the backup: seqs the hub may have
	}
	es, err := db.Outbox(t.Context(), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	highest := es[len(es)-1].Seq
	original := db.OutboxID()
	mustClose(t, db)
	if again := openAt(t, live); again.OutboxID() != original || original == "" {
		t.Fatalf("the outbox is %q reopened, %q before", again.OutboxID(), original)
	} else {
		mustClose(t, again)
	}
	backup := filepath.Join(filepath.Dir(live), "backup.db")
	writeFile(t, backup, buf.Bytes())
	if _, err := Restore(backup, live); err != nil {
		t.Fatal(err)
	}
	r, err := Open(live, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer mustClose(t, r)
	mustCreate(t, r, newMission(mid(5)))
	es, err = r.Outbox(t.Context(), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := es[len(es)-1].Seq; got <= highest {
		t.Fatalf("the restored store's new entry has seq %d, not above the original's %d", got, highest)
	}
	if r.OutboxID() == original {
		t.Fatalf("the restored store names its outbox %q, as the original did", original)
	}
}
