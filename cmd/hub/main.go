// Command hub is the Sortie hub: gateways send it their mission events
// over MQTT (store-and-forward); it keeps them, shows them live on a
// dashboard and sends control requests back.
//
//	hub run      [-config FILE] [flags]   run the hub (default)
//	hub validate [-config FILE]           check the configuration
//	hub passwd   [-generate] GATEWAY      print a credential line for [gateways]
//	hub version                           print the version
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

const usage = `Sortie hub - every gateway and mission in one place.

Usage:
  hub run      [-config FILE] [flags]  run the hub (default)
  hub validate [-config FILE]          check the configuration
  hub passwd   [-generate] GATEWAY     read a password (or make one) and print
                                       the line to add under [gateways]
  hub version                          print the version

Run "hub run -h" for the flags of run.
`

// run dispatches a subcommand and maps its error to an exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	cmd := "run"
	switch {
	case len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help"):
		cmd = "help"
	case len(args) > 0 && args[0] != "" && args[0][0] != '-':
		cmd, args = args[0], args[1:]
	}
	var err error
	switch cmd {
	case "run":
		err = cmdRun(ctx, args, stderr)
	case "validate":
		err = cmdValidate(args, stdout, stderr)
	case "passwd":
		err = cmdPasswd(args, stdin, stdout, stderr)
	case "version":
		_, err = fmt.Fprintln(stdout, "sortie hub", Version)
	case "help", "-h", "--help":
		_, err = fmt.Fprint(stdout, usage)
	default:
		err = &usageError{Msg: fmt.Sprintf("unknown command %q", cmd)}
	}
	return cli.Exit(stderr, "hub", err, usage)
}
