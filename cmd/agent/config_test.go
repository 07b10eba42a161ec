package main

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sortie-edge/sortie/internal/testkit"
)

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name, toml, field string
	}{
		{"defaults", "", ""},
		{"shipped", "", ""},
		{"unknown key", "gateway_idd = \"x\"\n", "gateway_idd"},
		{"gateway with slash", "gateway_id = \"a/b\"\n", "gateway_id"},
		{"gateway with wildcard", "gateway_id = \"a+\"\n", "gateway_id"},
		{"bad listen", "[broker]\nlisten = \"nope\"\n", "broker.listen"},
		{"external without url", "[broker]\nembedded = false\n", "broker.url"},
		{"bad scheme", "[broker]\nembedded = false\nurl = \"http://x:1\"\n", "broker.url"},
		{"wildcard prefix", "[broker]\nprefix = \"a/#\"\n", "broker.prefix"},
		{"cert without key", "[broker]\ncert_file = \"c.pem\"\n", "broker.cert_file"},
		{"zero ack timeout", "[broker]\nack_timeout = \"0s\"\n", "broker.ack_timeout"},
		{"bad duration", "[broker]\nack_timeout = \"soon\"\n", ""},
		{"token and file", "[http]\ntoken = \"a\"\ntoken_file = \"t\"\n", "http.token_file"},
		{"missing token file", "[http]\ntoken_file = \"nope\"\n", "http.token_file"},
		{"log level", "[log]\nlevel = \"loud\"\n", "log.level"},
		{"log format", "[log]\nformat = \"xml\"\n", "log.format"},
		{"workers", "[driver]\nworkers = 0\n", "driver.workers"},
		{"hub url", "[hub]\nurl = \"::\"\n", "hub.url"},
		{"hub urls", "[hub]\nurls = [\"tcp://n1:1883\", \"::\"]\n", "hub.urls[1]"},
		{"retention", "[retention]\nmax_count = -1\n", "retention.max_count"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := ""
			switch c.name {
			case "defaults":
			case "shipped":
				path = testkit.RepoPath("configs/agent.toml")
			default:
				path = filepath.Join(t.TempDir(), "agent.toml")
				writeFile(t, path, c.toml)
			}
			cfg, err := LoadConfig(path)
			if err == nil {
				err = cfg.Validate(path)
			}
			if c.field == "" && c.name != "bad duration" {
				if err != nil {
					t.Fatalf("valid config rejected: %v", err)
				}
				return
			}
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("error %v, want a ConfigError", err)
			}
			if c.field != "" && ce.Field != c.field {
				t.Errorf("field %q, want %q (%v)", ce.Field, c.field, err)
			}
			if path != "" && !strings.Contains(err.Error(), path) {
				t.Errorf("error %q does not name the file", err)
			}
			if strings.Contains(err.Error(), "mission") {
				t.Errorf("error %q speaks of a mission about a config field", err)
			}
		})
	}
}

// Validate names every bad field, not only the first.
func TestConfigValidateReportsAll(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.toml")
	writeFile(t, path, "gateway_id = \"a/b\"\n[broker]\nembedded = false\nurl = \"::\"\n[log]\nformat = \"xml\"\n[driver]\nworkers = 0\n")
	cfg, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	err = cfg.Validate(path)
	for _, field := range []string{"gateway_id", "broker.url", "log.format", "driver.workers"} {
		if err == nil || !strings.Contains(err.Error(), path+": "+field+": ") {
			t.Errorf("%s not reported in %v", field, err)
		}
	}
	if n := strings.Count(err.Error(), "\n") + 1; n != 4 {
		t.Errorf("%d lines, want 4:\n%v", n, err)
	}
}
