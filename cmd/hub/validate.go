package main

import (
	"flag"
	"fmt"
	"io"
)

// cmdValidate loads and checks the configuration, its secrets and TLS
// files, without opening anything.
func cmdValidate(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("validate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "configs/hub.toml", "configuration file")
	if err := fs.Parse(args); err != nil {
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
	_, err = fmt.Fprintf(stdout, "%s: ok (%d gateways)\n", *path, len(cfg.Gateways))
	return err
}
