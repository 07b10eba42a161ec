package store

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sortie-edge/sortie/driver"
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
	wal, _ := os.ReadFile(walPath(live))
	db.Close()
	os.WriteFile(walPath(live), wal, 0o600)

	kept, err := Restore(backup, live)
	if err != nil {
		t.Fatal(err)
	}
	if len(kept) != 2 || !strings.Contains(kept[0], "missions.db.before-restore-") || !strings.Contains(kept[1], "missions.db-wal.before-restore-") {
		t.Errorf("kept %v, want the old file and its log", kept)
	}
	if _, err := os.Stat(walPath(live)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the old log is still beside the restored file: %v", err)
	}
	if left, _ := filepath.Glob(live + ".restoring"); len(left) > 0 {
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
	dir := t.TempDir()
	live := filepath.Join(dir, "missions.db")
	bad := filepath.Join(dir, "bad.db")
	os.WriteFile(bad, []byte("not a database"), 0o600)
	if _, err := Restore(bad, live); err == nil {
		t.Fatal("restored a file that is not a database")
	}
	if _, err := os.Stat(live); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed restore created %s", live)
	}
}

// Two restores in a row keep both files they replaced; a restore into a
// data directory that does not exist yet makes it.
func TestRestoreTwiceAndIntoNewDir(t *testing.T) {
	db, live, _, b := backedUp(t)
	db.Close()
	backup := filepath.Join(t.TempDir(), "backup.db")
	if err := os.WriteFile(backup, b, 0o600); err != nil {
		t.Fatal(err)
	}
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
