package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"

	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/broker/passwd"
)

// agent passwd prints an entry the config accepts, its flags may follow
// the name, and a bad command line shows passwd's own usage.
func TestPasswdCommand(t *testing.T) {
	var out, errb strings.Builder
	if err := cmdPasswd([]string{"voice", "-role", "admin"}, strings.NewReader("a-long-password\n"), &out, &errb); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String()+errb.String(), "a-long-password") {
		t.Fatal("passwd printed the password")
	}
	cfg := DefaultConfig()
	if _, err := toml.Decode(out.String(), &cfg); err != nil {
		t.Fatalf("entry %q: %v", out.String(), err)
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
		err := cmdPasswd(args, strings.NewReader("a-long-password\n"), &out, &errb)
		var ue *usageError
		if !errors.As(err, &ue) || ue.Usage != passwdUsage {
			t.Errorf("passwd %q: %v, want a usage error with passwd's usage", args, err)
		}
	}
	if err := cmdPasswd([]string{"voice"}, strings.NewReader("short\n"), &out, &errb); err == nil {
		t.Error("a 5-character password was taken")
	}
}
