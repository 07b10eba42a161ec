package main

import (
	"context"
	"fmt"

	"github.com/sortie-edge/sortie/internal/cli"
)

// cmdValidate loads and checks the configuration, its secrets and TLS
// files, without opening anything.
func cmdValidate(_ context.Context, e *cli.Env, args []string) error {
	stdout := e.Stdout
	fs := e.FlagSet()
	path := fs.String("config", "configs/hub.toml", "configuration file")
	if err := noArgs(fs, args, "validate"); err != nil {
		return err
	}
	cfg, err := LoadConfig(*path)
	if err != nil {
		return err
	}
	if err := cfg.Validate(*path); err != nil {
		return err
	}
	if _, err := cfg.token(); err != nil {
		return err
	}
	if _, _, err := cfg.serverTLS(); err != nil {
		return err
	}
	if !cfg.Broker.Embedded {
		if _, err := cfg.secret(cfg.Identity.Password, cfg.Identity.PasswordFile); err != nil {
			return fmt.Errorf("identity.password_file: %w", err)
		}
	}
	if cfg.Cluster.Enabled {
		// What run reads before it connects: a file missing is a
		// mistake validate can name.
		if _, err := clusterOptions(cfg); err != nil {
			return err
		}
		if _, err := cfg.secret(cfg.Cluster.Postgres, cfg.Cluster.PostgresFile); err != nil {
			return fmt.Errorf("cluster.postgres_file: %w", err)
		}
		ignored := ""
		if len(cfg.Gateways) > 0 {
			ignored = "; [gateways] is not used"
		}
		_, err = fmt.Fprintf(stdout, "%s: ok (cluster mode: gateways log in to NATS%s)\n", *path, ignored)
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s: ok (%d gateways)\n", *path, len(cfg.Gateways))
	return err
}
