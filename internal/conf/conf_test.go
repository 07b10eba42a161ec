package conf

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDecode(t *testing.T) {
	type cfg struct {
		Name string `toml:"name"`
		Sub  struct {
			N int `toml:"n"`
		} `toml:"sub"`
		Users []struct {
			Name string `toml:"name"`
		} `toml:"users"`
	}
	dir := t.TempDir()
	write := func(body string) string {
		p := filepath.Join(dir, "c.toml")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct {
		name, body, field, msg string
	}{
		{"ok", "name = \"x\"\n[sub]\nn = 2\n", "", ""},
		{"unknown key", "name = \"x\"\n[sub]\nm = 2\n", "sub.m", "unknown key"},
		{"syntax", "name = \n", "", "line 1"},
		{"wrong type", "name = 3\n", "", "name"},
		{"list with single brackets", "name = \"x\"\n[users]\nname = \"a\"\n", "users", "line 2: a list: write [[users]] (double brackets) before each entry, not [users]"},
		{"table with double brackets", "name = \"x\"\n[[sub]]\nn = 2\n", "sub", "line 2: a single table: write [sub] (single brackets), once, not [[sub]]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := cfg{Name: "default"}
			err := Decode(write(c.body), &v)
			if c.msg == "" {
				if err != nil || v.Name != "x" || v.Sub.N != 2 {
					t.Fatalf("Decode = %v, %+v", err, v)
				}
				return
			}
			var ce *Error
			if !errors.As(err, &ce) || ce.Field != c.field || !strings.Contains(err.Error(), c.msg) || !strings.Contains(err.Error(), "c.toml") {
				t.Fatalf("Decode error %v (field %q); want field %q and %q", err, ce.Field, c.field, c.msg)
			}
		})
	}
	if err := Decode(filepath.Join(dir, "missing.toml"), &cfg{}); err == nil {
		t.Fatal("missing file: no error")
	}
}

func TestResolve(t *testing.T) {
	for _, c := range [][3]string{{"/etc", "a.toml", "/etc/a.toml"}, {"/etc", "/abs", "/abs"}, {"/etc", "", ""}} {
		if got := Resolve(c[0], c[1]); got != c[2] {
			t.Errorf("Resolve(%q, %q) = %q, want %q", c[0], c[1], got, c[2])
		}
	}
}
