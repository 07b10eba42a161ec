package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/sortie-edge/sortie/agent/agentconf"

	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/agent/view"
	"github.com/sortie-edge/sortie/internal/cli"
)

// runFlags are the command-line overrides of run; set flags win over the
// config file.
type runFlags struct {
	config   string
	trigger  string
	progress bool
	set      map[string]func(*Config, string) error
	values   map[string]string
}

func newRunFlagSet(fs *flag.FlagSet) *runFlags {
	rf := &runFlags{values: map[string]string{}}
	fs.StringVar(&rf.config, "config", "", "config file (TOML); default: built-in defaults")
	fs.StringVar(&rf.trigger, "trigger", "", "trigger this scene once the agent is up (demo)")
	fs.BoolVar(&rf.progress, "progress", false, "print mission progress to stdout, one line per step, instead of the missions' log lines")
	rf.set = map[string]func(*Config, string) error{
		"gateway":       func(c *Config, v string) error { c.GatewayID = v; return nil },
		"data":          func(c *Config, v string) error { c.DataDir = v; return nil },
		"devices":       func(c *Config, v string) error { c.Devices = v; return nil },
		"scenes":        func(c *Config, v string) error { c.Scenes = v; return nil },
		"broker-listen": func(c *Config, v string) error { c.Broker.Embedded, c.Broker.Listen = true, v; return nil },
		"broker-url":    func(c *Config, v string) error { c.Broker.Embedded, c.Broker.URL = false, v; return nil },
		"http":          func(c *Config, v string) error { c.HTTP.Listen = v; return nil },
		"log-level":     func(c *Config, v string) error { c.Log.Level = v; return nil },
		"log-format":    func(c *Config, v string) error { c.Log.Format = v; return nil },
		"sim":           func(c *Config, v string) error { c.Simulator.Home = v; return nil },
		"hub":           func(c *Config, v string) error { c.Hub.URL = v; return nil },
	}
	help := map[string]string{
		"gateway":       "gateway ID (gateway_id)",
		"data":          "data directory (data_dir)",
		"devices":       "device registry file (devices)",
		"scenes":        "scene directory (scenes)",
		"broker-listen": "run the embedded broker on this address (broker.listen)",
		"broker-url":    "use this external broker instead of the embedded one (broker.url)",
		"http":          "management HTTP address, \"\" to disable (http.listen)",
		"log-level":     "debug, info, warn or error (log.level)",
		"log-format":    "text or json (log.format)",
		"sim":           "run a simulated home from this file (simulator.home)",
		"hub":           "hub broker URL for status sync (hub.url)",
	}
	for name := range rf.set {
		fs.Func(name, help[name], func(v string) error { rf.values[name] = v; return nil })
	}
	return rf
}

// loadRunConfig reads the file, applies flags and validates. Paths given
// as flags are relative to the working directory, not the config file.
func (rf *runFlags) load() (Config, error) {
	cfg, err := LoadConfig(rf.config)
	if err != nil {
		return cfg, err
	}
	for name, v := range rf.values {
		if err := rf.set[name](&cfg, v); err != nil {
			return cfg, err
		}
		switch name {
		case "data", "devices", "scenes", "sim":
			if abs, err := filepath.Abs(v); err == nil && v != "" {
				_ = rf.set[name](&cfg, abs)
			}
		}
	}
	file := rf.config
	if file == "" {
		file = "(defaults)"
	}
	return cfg, cfg.Validate(file)
}

func newLogger(c agentconf.LogConfig, w io.Writer) *slog.Logger {
	lvl, _ := agentconf.ParseLevel(c.Level)
	opts := &slog.HandlerOptions{Level: lvl}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// gcPercent is the agent's GOGC unless the environment sets one. Its
// live heap is a few MiB, so at Go's default of 100 it collects after
// every few MiB allocated: under load every ~30 ms, each collection
// taking one of a gateway's few cores for ~3 ms, which shows up as
// latency in whatever command is in flight. At 400 it collects a
// quarter as often for a heap goal of ~20 MiB.
const gcPercent = 400

// memLimit is the agent's GOMEMLIMIT unless the environment sets one: a
// soft ceiling on the Go heap, so that gcPercent's room to grow never
// turns a burst of missions into a burst of memory. The garbage
// collector runs more often as the heap nears it, and never lets a live
// heap above it fail (it gives up on the limit rather than spin).
const memLimit = 40 << 20

func tuneGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(memLimit)
	}
}

func cmdRun(ctx context.Context, e *cli.Env, args []string) error {
	stdout, stderr := e.Stdout, e.Stderr
	fs := e.FlagSet()
	rf := newRunFlagSet(fs)
	if pos, err := cli.Parse(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return &usageError{Msg: fmt.Sprintf("run takes no arguments, got %q", pos)}
	}
	cfg, err := rf.load()
	if err != nil {
		return err
	}
	log := newLogger(cfg.Log, stderr)
	tuneGC()
	opts, err := agentOptions(cfg, log)
	if err != nil {
		return err
	}
	opts.DemoTrigger = rf.trigger
	if rf.progress {
		// The progress lines say what the mission log lines would, in the
		// same terminal: one of the two is enough.
		opts.Observers, opts.QuietMissions = append(opts.Observers, view.NewProgress(stdout)), true
	}
	for _, w := range agentconf.ExposureWarnings(cfg) {
		log.Warn(w)
	}
	a, err := agent.New(opts)
	if err != nil {
		return err
	}
	defer a.Close()
	if err := a.Start(ctx); err != nil {
		if ctx.Err() != nil {
			// Stopped by a signal while waiting for the broker: a clean
			// stop, not a failure for the supervisor to report.
			log.Info("agent stopped while starting", "err", err)
			return nil
		}
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("%w\n(another program has that port: -broker-listen and -http choose others, as [broker] listen and [http] listen do in the config)", err)
		}
		return err
	}
	// Start-up's garbage (the config, the catalog, opening the store)
	// back to the system now, rather than as the scavenger gets to it:
	// what an idle gateway holds is what it holds for hours.
	debug.FreeOSMemory()
	ad := a.Addrs()
	if rf.trigger != "" && !slices.Contains(ad.Scenes, rf.trigger) {
		return &usageError{Msg: fmt.Sprintf("-trigger %s: no such scene (have %s)", rf.trigger, strings.Join(ad.Scenes, ", "))}
	}
	if rf.progress {
		b := view.Banner{
			Gateway: cfg.GatewayID, BrokerURL: ad.BrokerURL, BrokerListen: ad.BrokerListen, API: ad.API,
			Scenes: ad.Scenes, TriggerTopic: ad.TriggerTopic, BrokerLogin: ad.BrokerUsers,
			BrokerTLS: cfg.Broker.Embedded && cfg.Broker.ServerCertFile != "",
		}
		if _, err := io.WriteString(stdout, b.String(time.Now())); err != nil {
			return err
		}
	}
	err = a.Run(ctx)
	if !rf.progress {
		return err
	}
	bye := "Stopped."
	if n, uerr := a.Unfinished(context.Background()); uerr == nil && n > 0 {
		bye = fmt.Sprintf("Stopped. %d unfinished mission(s) go on at the next start.", n)
	}
	// Said once everything is closed: "Stopped." must be true by then.
	a.Close()
	if _, werr := fmt.Fprintln(stdout, bye); werr != nil {
		err = errors.Join(err, werr)
	}
	return err
}
