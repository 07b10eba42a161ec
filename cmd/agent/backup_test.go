package main

import (
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/store"
)

// TestBackupRestore: agent backup copies the database of the running
// agent; the copy, put in place of the database, is what a restarted
// agent finds.
func TestBackupRestore(t *testing.T) {
	e := newEnv(t, "")
	e.start()
	id := e.goHome("bk-1", 22)
	e.proc.mu.Lock()
	addr := e.proc.http
	e.proc.mu.Unlock()
	t.Setenv(tokenEnv, "")
	copyPath := filepath.Join(t.TempDir(), "backup.db")
	code, out, errOut := runCLI("backup", copyPath, "-addr", addr)
	if code != 0 || !strings.Contains(out, "backup written to "+copyPath) {
		t.Fatalf("agent backup: exit %d\n%s%s", code, out, errOut)
	}
	if err := store.CheckFile(copyPath); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(copyPath + ".part-*"); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
	// A mission after the backup is not in it.
	later := e.goHome("bk-2", 23)
	if code := e.proc.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d", code)
	}
	data := filepath.Join(e.dir, "data", "missions.db")
	b, err := os.ReadFile(copyPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(data, b, 0o600); err != nil {
		t.Fatal(err)
	}
	os.Remove(data + "-wal")
	e.start()
	var d missionDetail
	if code := e.get("/api/missions/"+id, &d); code != http.StatusOK || d.Mission == nil || d.Mission.State != driver.StateSucceeded {
		t.Errorf("restored mission %s: HTTP %d, %+v", id, code, d.Mission)
	}
	if code := e.get("/api/missions/"+later, nil); code != http.StatusNotFound {
		t.Errorf("mission made after the backup: HTTP %d, want 404", code)
	}
}

func TestBackupAPIErrors(t *testing.T) {
	f := newAPIFixture(t, "")
	get := func() (*http.Response, []byte, error) {
		resp, err := http.Get(f.srv.URL + "/api/backup")
		if err != nil {
			return nil, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp, b, err
	}
	f.api.Backup = func(w io.Writer, sized func(int64)) (int64, error) {
		sized(5)
		n, err := w.Write([]byte("whole"))
		return int64(n), err
	}
	if resp, b, err := get(); err != nil || resp.StatusCode != 200 || string(b) != "whole" || resp.Header.Get("Content-Type") != "application/octet-stream" || resp.ContentLength != 5 {
		t.Errorf("backup: %v %v %q", resp, err, b)
	}
	// A failure before the first byte is an error answer.
	f.api.Backup = func(io.Writer, func(int64)) (int64, error) { return 0, errors.New("disk on fire") }
	if resp, b, err := get(); err != nil || resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(b), "disk on fire") {
		t.Errorf("failed backup: %v %v %q", resp, err, b)
	}
	// A failure after it breaks the transfer: the copy never looks whole.
	f.api.Backup = func(w io.Writer, sized func(int64)) (int64, error) {
		sized(128 << 10)
		n, _ := w.Write([]byte(strings.Repeat("x", 64<<10)))
		return int64(n), errors.New("read error")
	}
	done := make(chan error, 1)
	go func() { _, _, err := get(); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("a backup broken off mid-way read as complete")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("client hung on a broken-off backup")
	}
}
