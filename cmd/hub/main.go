// Command hub is the Sortie hub: gateways send it their mission events
// over MQTT (store-and-forward); it keeps them, shows them live on a
// dashboard and sends control requests back.
//
//	hub run      [-config FILE] [flags]   run the hub (default)
//	hub validate [-config FILE]           check the configuration
//	hub passwd   [-generate] GATEWAY      print a credential line for [gateways]
//	hub nats-user [-generate] [-hub|-system] NAME a NATS user for the cluster mode
//	hub bundle push|list|show             store and list configuration bundles
//	hub rollout start|status|pause|resume|abort   run a bundle out in stages
//	hub fleet | tag | group               configurations, tags, drift policies
//	hub version                           print the version
//	hub completion bash|zsh               a shell completion script
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/sortie-edge/sortie/internal/cli"
)

// Version is set at build time with -ldflags "-X main.Version=...".
var Version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		// A second signal gets the default action: exit at once. Every
		// batch is either committed or unacknowledged, so that is safe.
		stop()
	}()
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// usageError marks errors that print usage and exit 2.
type usageError = cli.UsageError

// program is the hub's command line: its usage, each command's -h, the
// dispatch and the shell completion are all read from this table.
var program = &cli.Program{
	Name:    "hub",
	Intro:   "Sortie hub - every gateway and mission in one place.",
	Outro:   `Run "hub COMMAND -h" for a command's arguments and flags.`,
	Default: "run",
	NoArgs:  "run",
	FlagValues: map[string]cli.Values{
		"config":     cli.Files,
		"data-dir":   cli.Dirs,
		"log-level":  cli.Words("debug", "info", "warn", "error"),
		"log-format": cli.Words("text", "json"),
	},
	Commands: []*cli.Command{
		{Name: "run", Args: "[-config FILE] [flags]", Summary: "run the hub (default)",
			Help: "Runs the hub: the config file first, then the flags over it.", Run: cmdRun},
		{Name: "validate", Args: "[-config FILE]", Summary: "check the configuration",
			Help: "Checks the configuration, its secrets and TLS files, opening nothing.", Run: cmdValidate},
		{Name: "passwd", Args: "[-generate] GATEWAY", Summary: "a gateway's line for [gateways]",
			Help: "Reads a password (or makes one up with -generate, shown once) and prints\n" +
				"the line to add under [gateways] for GATEWAY: its ID and the password's hash.", Run: cmdPasswd},
		{Name: "nats-user", Args: "[-generate] [-hub|-system] [-prefix P] NAME", Summary: "a NATS user for the cluster mode",
			Help: "Reads a password (or makes one up with -generate, shown once) and prints\n" +
				"the entry to add to the users of the cluster's NATS config (configs/nats.conf)\n" +
				"for gateway NAME, or with -hub for the hub replicas' user NAME: its\n" +
				"permissions and the password's bcrypt hash. With -system, the entry of a\n" +
				"user NAME of the system account: its name and the hash.", Run: cmdNATSUser},
		{Name: "version", Summary: "print the version", Run: cmdVersion},
	},
}

func init() { program.Commands = append(program.Commands, fleetCommands...) }

// run runs a command line and returns the exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return program.Main(ctx, args, cli.IO{Stdin: stdin, Stdout: stdout, Stderr: stderr})
}

// cmdVersion prints the version.
func cmdVersion(_ context.Context, e *cli.Env, args []string) error {
	if err := noArgs(e.FlagSet(), args, "version"); err != nil {
		return err
	}
	_, err := fmt.Fprintln(e.Stdout, "sortie hub", Version)
	return err
}
