package agent

import (
	"path/filepath"
	"runtime"
	"testing"
)

// repoPath resolves a path from the repository root.
func repoPath(t testing.TB, p string) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", p)
}
