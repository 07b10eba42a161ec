package clustertest

import (
	"os"
	"path/filepath"
	"testing"
)

// TestTemplateIsUsedOnlyWhenItsOwnersAlone: the database cluster template
// sits in the shared temporary directory with its superuser's password;
// one another user owns, or others may write, is refused.
func TestTemplateIsUsedOnlyWhenItsOwnersAlone(t *testing.T) {
	root := filepath.Join(t.TempDir(), "template")
	if err := os.MkdirAll(filepath.Join(root, "data"), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"password": "pw", "data/PG_VERSION": "15"} {
		if err := os.WriteFile(filepath.Join(root, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	me := uint32(os.Geteuid())
	if tmpl, err := readTemplate(root, me); err != nil || tmpl.password != "pw" {
		t.Fatalf("own template: %+v, %v", tmpl, err)
	}
	if _, err := readTemplate(root, me+1); err == nil {
		t.Error("a template of another user was used")
	}
	if err := os.Chmod(root, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := readTemplate(root, me); err == nil {
		t.Error("a template others may write was used")
	}
}
