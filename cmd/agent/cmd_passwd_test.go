package main

import (
	"context"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"

	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/broker/passwd"
	"github.com/sortie-edge/sortie/internal/cli"
)

// agent passwd prints an entry the config accepts, its flags may follow
// the name, and a bad command line shows passwd's own usage.
func TestPasswdCommand(t *testing.T) {
	runPasswd := func(password string, args ...string) (code int, stdout, stderr string) {
		var out, errb strings.Builder
		code = program.Main(context.Background(), append([]string{"passwd"}, args...), cli.IO{Stdin: strings.NewReader(password), Stdout: &out, Stderr: &errb})
		return code, out.String(), errb.String()
	}
	code, out, errb := runPasswd("a-long-password\n", "voice", "-role", "admin")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb)
	}
	if strings.Contains(out+errb, "a-long-password") {
		t.Fatal("passwd printed the password")
	}
	cfg := DefaultConfig()
	if _, err := toml.Decode(out, &cfg); err != nil {
		t.Fatalf("entry %q: %v", out, err)
	}
	if len(cfg.Broker.Users) != 1 || cfg.Broker.Users[0].Name != "voice" || cfg.Broker.Users[0].Role != agent.RoleAdmin {
		t.Fatalf("entry decodes to %+v", cfg.Broker.Users)
	}
	c, err := passwd.Parse(cfg.Broker.Users[0].PasswordHash)
	if err != nil || !c.Verify([]byte("a-long-password")) {
		t.Fatalf("the hash does not verify the password (%v)", err)
	}
	if err := cfg.Validate("agent.toml"); err != nil {
		t.Fatalf("config with the entry: %v", err)
	}

	for _, args := range [][]string{{}, {"a", "b"}, {"-role", "guest", "voice"}, {"-role", "device", "a/b"}, {"-nope", "x"}} {
		code, _, errb := runPasswd("a-long-password\n", args...)
		if code != cli.ExitUsage || !strings.Contains(errb, "usage: agent passwd [-role R] [-scope S] [-generate] NAME") {
			t.Errorf("passwd %q: exit %d, want %d and passwd's usage; stderr:\n%s", args, code, cli.ExitUsage, errb)
		}
	}
	if code, _, _ := runPasswd("short\n", "voice"); code != 1 {
		t.Error("a 5-character password was taken")
	}
}
