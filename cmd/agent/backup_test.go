package main

import (
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

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
	live := filepath.Join(e.dir, "data", "missions.db")
	if code, _, errOut := runCLI("backup", live, "-addr", addr); code != 1 || !strings.Contains(errOut, "database of a running agent") {
		t.Errorf("backup over the live database: exit %d %s", code, errOut)
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

func TestBackupAPI(t *testing.T) {
	f := newAPIFixture(t, "")
	get := func(method string) (*http.Response, []byte) {
		req, _ := http.NewRequest(method, f.srv.URL+"/api/backup", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, b
	}
	f.api.Backup = func() (io.ReadCloser, int64, error) {
		return io.NopCloser(strings.NewReader("whole")), 5, nil
	}
	if resp, b := get("GET"); resp.StatusCode != 200 || string(b) != "whole" || resp.Header.Get("Content-Type") != "application/octet-stream" || resp.ContentLength != 5 {
		t.Errorf("backup: %d %q %v", resp.StatusCode, b, resp.Header)
	}
	// The copy is made locally before a byte is sent: a failure is an
	// error answer, not a cut transfer.
	f.api.Backup = func() (io.ReadCloser, int64, error) { return nil, 0, errors.New("disk on fire") }
	if resp, b := get("GET"); resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(b), "disk on fire") {
		t.Errorf("failed backup: %d %q", resp.StatusCode, b)
	}
	if resp, _ := get("HEAD"); resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET" {
		t.Errorf("HEAD: %d %v", resp.StatusCode, resp.Header)
	}
	// One at a time: each takes the database's size on disk.
	entered, release := make(chan struct{}), make(chan struct{})
	f.api.Backup = func() (io.ReadCloser, int64, error) {
		close(entered)
		<-release
		return io.NopCloser(strings.NewReader("whole")), 5, nil
	}
	first := make(chan int, 1)
	go func() {
		resp, err := http.Get(f.srv.URL + "/api/backup")
		if err != nil {
			first <- -1
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	<-entered
	if resp, b := get("GET"); resp.StatusCode != http.StatusConflict {
		t.Errorf("second backup at once: %d %q, want 409", resp.StatusCode, b)
	}
	close(release)
	if code := <-first; code != 200 {
		t.Errorf("first backup: %d", code)
	}
}
