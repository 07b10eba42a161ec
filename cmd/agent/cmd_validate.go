package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/sortie-edge/sortie/agent/agentconf"

	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/internal/cli"
	"github.com/sortie-edge/sortie/scenes"
)

// cmdValidate checks the config, the device registry, the scenes and the
// simulated home, printing every problem it finds, one per line.
func cmdValidate(_ context.Context, e *cli.Env, args []string) error {
	stdout, stderr := e.Stdout, e.Stderr
	fs := e.FlagSet()
	config := fs.String("config", "", "config file (TOML)")
	if pos, err := cli.Parse(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return &usageError{Msg: fmt.Sprintf("validate takes no arguments, got %q", pos)}
	}
	cfg, err := LoadConfig(*config)
	if err == nil {
		err = cfg.Validate(*config)
	}
	if err != nil {
		return err
	}
	if _, _, err := cfg.Broker.ServerTLS(cfg); err != nil {
		return err
	}
	if _, _, err := cfg.HTTP.ServerTLS(cfg); err != nil {
		return err
	}
	reg, err := devices.LoadRegistry(cfg.Path(cfg.Devices))
	if err != nil {
		if *config == "" && errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w (without -config the default paths are relative to this directory; try -config configs/agent.toml)", err)
		}
		return err
	}
	if err := agent.CheckDeviceUsers(agentconf.BrokerUsers(cfg.Broker), reg); err != nil {
		return fmt.Errorf("%s: %w", *config, err)
	}
	cat, err := scenes.Load(cfg.Path(cfg.Scenes), reg)
	if err != nil {
		var le *scenes.LoadError
		if errors.As(err, &le) {
			var b strings.Builder
			for _, fe := range le.Errors {
				b.WriteString(fe.Error() + "\n")
			}
			_, werr := io.WriteString(stderr, b.String())
			return errors.Join(fmt.Errorf("%d problem(s) in scenes", len(le.Errors)), werr)
		}
		return err
	}
	if err := agent.CheckLocation(cat, agentconf.LocationOptions(cfg)); err != nil {
		return fmt.Errorf("%s: %w", *config, err)
	}
	var b strings.Builder
	if cfg.Simulator.Home != "" {
		if _, err := agentconf.LoadHome(cfg.Path(cfg.Simulator.Home)); err != nil {
			if agent.SimulatorBuiltIn {
				return err
			}
			// A gateway's build checks a copied demo config too; `agent
			// run` refuses it.
			b.WriteString("warning: [simulator] home not checked: " + err.Error() + "\n")
		}
	}
	for _, w := range agentconf.ExposureWarnings(cfg) {
		b.WriteString("warning: " + w + "\n")
	}
	fmt.Fprintf(&b, "ok: config, %d devices, %d scenes (%v)\n", len(reg.Devices), len(cat.Names()), cat.Names())
	_, err = io.WriteString(stdout, b.String())
	return err
}
