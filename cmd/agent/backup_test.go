package main

import (
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/store"
)

// TestBackupRestore: agent backup copies the database of the running
// agent; agent restore refuses to run under it, and once it has stopped
// puts the copy in place: it is what the restarted agent finds.
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
	if code, out, errOut := runCLI("restore", "-config", e.cfgPath, copyPath); code != 1 || !strings.Contains(errOut, "stop the agent first") {
		t.Errorf("restore under a running agent: exit %d\n%s%s", code, out, errOut)
	}
	if code := e.proc.stop(t, syscall.SIGKILL); code == 0 {
		t.Fatalf("exit %d after SIGKILL", code)
	}
	// Killed, the agent left its log; restore keeps it aside with the
	// database it replaces.
	code, out, errOut = runCLI("restore", "-config", e.cfgPath, copyPath)
	if code != 0 || !strings.Contains(out, "restored "+copyPath) || !strings.Contains(out, "missions.db-wal.before-restore-") {
		t.Fatalf("agent restore: exit %d\n%s%s", code, out, errOut)
	}
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
