package store

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/sortie-edge/sortie/driver"
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
			mustCreate(t, db, newMission(mid(i)))
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
	db.Close()
	if _, err := db.Backup(&bytes.Buffer{}); err == nil {
		t.Error("Backup of a closed store succeeded")
	}
}
