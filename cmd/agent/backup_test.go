package main

import (
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sortie-edge/sortie/agent/api"
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
	var d api.MissionDetail
	if code := e.get("/api/missions/"+id, &d); code != http.StatusOK || d.Mission == nil || d.Mission.State != driver.StateSucceeded {
		t.Errorf("restored mission %s: HTTP %d, %+v", id, code, d.Mission)
	}
	if code := e.get("/api/missions/"+later, nil); code != http.StatusNotFound {
		t.Errorf("mission made after the backup: HTTP %d, want 404", code)
	}
}
