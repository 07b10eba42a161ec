// Command sim runs a simulated home: virtual devices that speak the
// Sortie device protocol over MQTT, with reproducible fault injection;
// or, as "sim fleet", a fleet of light simulated gateways connected to a
// hub (docs/fleet.md, "A fleet to try it on").
//
//	sim -config configs/home.toml                       # embedded broker on 127.0.0.1:1883
//	sim -config configs/home.toml -broker tcp://host:1883
//	sim fleet -hub tcp://127.0.0.1:1884 -gateways 1000 -password 'pw-{id}' -offline 0.05
//
// Without -broker (and without a broker key in the config) it starts an
// embedded broker on -listen and prints its address. It logs one line per
// command received, applied, rejected or dropped, and runs until SIGINT
// or SIGTERM; a second signal kills it at once.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/sortie-edge/sortie/broker"
	"github.com/sortie-edge/sortie/simulator"
)

// Version is set at build time with -ldflags "-X main.Version=...".
var Version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Once the first signal has started the shutdown, restore the default
	// handling so that a second one kills a shutdown that hangs.
	context.AfterFunc(ctx, stop)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "sim:", err)
		os.Exit(1)
	}
}

// run is the whole program; it returns when ctx ends (a clean stop) or
// on the first error.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "fleet" {
		return runFleet(ctx, args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	config := fs.String("config", "configs/home.toml", "home config `file`")
	brokerURL := fs.String("broker", "", "broker `URL` (tcp://host:port); overrides the config; empty starts an embedded broker")
	listen := fs.String("listen", "127.0.0.1:1883", "embedded broker `address`")
	level := fs.String("log-level", "info", "log level: debug, info, warn or error")
	version := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *version {
		_, err := fmt.Fprintln(stdout, "sim", Version)
		return err
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*level)); err != nil {
		return fmt.Errorf("-log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lvl}))

	cfg, err := simulator.LoadHome(*config)
	if err != nil {
		return err
	}
	if *brokerURL != "" {
		cfg.Broker = *brokerURL
	}
	if cfg.Broker == "" {
		b, err := broker.Start(broker.Options{Addr: *listen, Logger: brokerLogger(log, lvl)})
		if err != nil {
			return err
		}
		// Deferred first, so it runs last: the devices say goodbye
		// through it.
		defer func() { _ = b.Close() }()
		cfg.Broker = b.URL()
		if _, err := fmt.Fprintf(stdout, "embedded broker listening on %s (%s)\n", b.Addr(), b.URL()); err != nil {
			return err
		}
	}
	cfg.Logger = log
	home, err := simulator.NewHome(cfg)
	if err != nil {
		return err
	}
	defer func() { _ = home.Close() }()
	if err := home.Start(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped before every device came online
		}
		return err
	}
	if _, err := fmt.Fprintf(stdout, "home online: %d devices on %s, prefix %q\n", len(home.Devices()), home.Broker(), home.Prefix()); err != nil {
		return err
	}
	<-ctx.Done()
	log.Info("stopping; signal again to kill")
	return home.Close()
}

// brokerLogger keeps the embedded broker quiet unless debugging: its
// connection chatter would drown the device lines.
func brokerLogger(log *slog.Logger, lvl slog.Level) *slog.Logger {
	if lvl > slog.LevelDebug {
		return nil
	}
	return log.With("component", "broker")
}
