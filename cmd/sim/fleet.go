package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/sortie-edge/sortie/broker/passwd"
	"github.com/sortie-edge/sortie/bundle"
	"github.com/sortie-edge/sortie/internal/fleetsim"
)

// fleetUsage is the first line of "sim fleet -h".
const fleetUsage = "usage: sim fleet -hub URL [-gateways N] [-password PATTERN] [fault flags]   (or -hub-config to print the hub's [gateways] lines)"

// runFleet is "sim fleet": light simulated gateways connected to a hub
// until ctx ends (docs/fleet.md, "A fleet to try it on").
func runFleet(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sim fleet", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		_, _ = fmt.Fprintln(stderr, fleetUsage) // help text: nowhere else to report a failure
		fs.PrintDefaults()
	}
	var o fleetsim.Options
	hubURL := fs.String("hub", "", "the hub broker's `URL` (tcp://127.0.0.1:1884)")
	fs.IntVar(&o.Gateways, "gateways", 100, "how many gateways (`N`)")
	fs.StringVar(&o.IDPrefix, "id-prefix", fleetsim.DefaultIDPrefix, "gateway IDs are this `prefix` and a five-digit number")
	password := fs.String("password", "", "each gateway's password on the hub broker: a `pattern` in which {id} is the gateway's ID (empty: no password)")
	hubConfig := fs.Bool("hub-config", false, "print the hub's [gateways] lines for these gateways and passwords, and exit")
	iterations := fs.Int("hash-iterations", passwd.Iterations, "PBKDF2 `iterations` of the hashes -hub-config prints (the hub pays them at each gateway's first login)")
	fs.StringVar(&o.Prefix, "prefix", "", "the hub's topic `prefix` (default sortie)")
	fs.BoolVar(&o.NoRetain, "no-retain", false, "publish presence not retained (a hub in the cluster mode)")
	files := fs.String("files", "", "`dir` of the configuration every gateway starts on (devices.toml, scenes/); default a built-in one of three lights")
	silent := fs.String("silent-devices", "", "comma-separated device `IDs` that never answer on any gateway")
	fs.StringVar(&o.Version, "version", fleetsim.DefaultVersion, "agent `version` the gateways claim (checked against a bundle's min_agent)")
	fs.DurationVar(&o.Heartbeat, "heartbeat", fleetsim.DefaultHeartbeat, "heartbeat `interval`")
	fs.DurationVar(&o.Soak, "soak", fleetsim.DefaultSoak, "a bundle's trial (`duration`) unless the hub's offer says")
	fs.DurationVar(&o.Confirm, "confirm", fleetsim.DefaultConfirm, "how long after the soak a bundle waits for the hub connection (`duration`)")
	fs.Float64Var(&o.Faults.Offline, "offline", 0, "`fraction` of gateways that never connect")
	fs.Float64Var(&o.Faults.Registry, "registry", 0, "`fraction` of gateways with another devices.toml (a bundle carrying the fleet's is rejected there)")
	fs.Float64Var(&o.Faults.DevicesSilent, "devices-silent", 0, "`fraction` of gateways whose devices never answer (a bundle changing a scene reverts after its soak)")
	fs.Float64Var(&o.Faults.UplinkCut, "uplink-cut", 0, "`fraction` of gateways whose hub connection drops during a trial (the bundle reverts, uplink_down)")
	fs.Float64Var(&o.Faults.Drift, "drift", 0, "`fraction` of gateways whose config files were edited by hand")
	fs.Float64Var(&o.Faults.Slow, "slow", 0, "`fraction` of gateways that answer each control 50 to 500 ms late")
	fs.Float64Var(&o.Faults.Lossy, "lossy", 0, "`fraction` of gateways that lose control requests and results")
	fs.Float64Var(&o.Faults.LossRate, "loss-rate", 0.3, "the `probability` a lossy gateway loses each one")
	fs.Uint64Var(&o.Seed, "seed", 0, "`seed` choosing the faulty gateways (0: a random one, printed)")
	level := fs.String("log-level", "warn", "log level: debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	pattern := *password
	if pattern != "" {
		o.Password = func(id string) string { return strings.ReplaceAll(pattern, "{id}", id) }
	}
	if *hubConfig {
		return printGateways(stdout, o, *iterations)
	}
	if *hubURL == "" {
		return errors.New("sim fleet: -hub is required (the hub broker's URL)")
	}
	o.Broker = *hubURL
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*level)); err != nil {
		return fmt.Errorf("-log-level: %w", err)
	}
	o.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	if *silent != "" {
		o.SilentDevices = strings.Split(*silent, ",")
	}
	if *files != "" {
		b, err := bundle.FromDir(*files, "")
		if err != nil {
			return fmt.Errorf("-files: %w", err)
		}
		o.Files = b
	}
	f, err := fleetsim.New(o)
	if err != nil {
		return err
	}
	defer f.Close()
	n := len(f.Gateways())
	if _, err := fmt.Fprintf(stdout, "fleet of %d gateways (seed %d), files %s, connecting to %s\n", n, f.Seed(), bundle.Short(f.Files()), o.Broker); err != nil {
		return err
	}
	for fault := fleetsim.FaultOffline; fault <= fleetsim.FaultLossy; fault <<= 1 {
		if gws := f.With(fault); len(gws) > 0 {
			if _, err := fmt.Fprintf(stdout, "  %s: %d (%s)\n", fault, len(gws), sample(gws)); err != nil {
				return err
			}
		}
	}
	start := time.Now()
	if err := f.Start(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped while connecting
		}
		return err
	}
	if _, err := fmt.Fprintf(stdout, "%d connected in %s; Ctrl-C stops\n", f.Connected(), time.Since(start).Round(time.Millisecond)); err != nil {
		return err
	}
	tick := time.NewTicker(30 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			st := f.Stats()
			if _, err := fmt.Fprintf(stdout, "connected %d, heartbeats %d, controls %d (%d repeats), bundle statuses %d, lost %d\n",
				st.Connected, st.Heartbeats, st.Controls, st.Repeats, st.Statuses, st.Lost); err != nil {
				return err
			}
		}
	}
}

// sample names the first few gateways of gws.
func sample(gws []*fleetsim.Gateway) string {
	var ids []string
	for i, g := range gws {
		if i == 5 {
			ids = append(ids, "...")
			break
		}
		ids = append(ids, g.ID())
	}
	return strings.Join(ids, ", ")
}

// printGateways prints the hub.toml [gateways] lines for the fleet.
func printGateways(w io.Writer, o fleetsim.Options, iterations int) error {
	if o.Password == nil {
		return errors.New("sim fleet: -hub-config needs -password")
	}
	o.Broker = "tcp://unused"
	f, err := fleetsim.New(o)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := fmt.Fprintln(w, "[gateways]"); err != nil {
		return err
	}
	for _, g := range f.Gateways() {
		h, err := passwd.HashCost(o.Password(g.ID()), iterations)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "%q = %q\n", g.ID(), h); err != nil {
			return err
		}
	}
	return nil
}
