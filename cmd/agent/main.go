// Command agent is the Sortie gateway agent: it turns scene triggers
// received over MQTT into durable missions and drives them to the end.
//
//	agent run      [-config FILE] [flags]   run the agent
//	agent validate [-config FILE]           check config, devices and scenes
//	agent compact  [-config FILE]           shrink the database (agent stopped)
//	agent passwd   [-role R] [-generate] NAME  a user of the embedded broker
//	agent version [-json]                    print the version
//	agent missions list|show|pause|resume|cancel|retry|priority ...
//	agent trigger  SCENE [key=value ...]    run a scene
//	agent devices | agent scenes            list devices or scenes
//
// The last four talk to a running agent's management API (docs/api.md).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/sortie-edge/sortie/internal/cli"
)

// Version is set at build time with -ldflags "-X main.Version=...".
var Version = "dev"

func main() {
	serving := len(os.Args) < 2 || os.Args[1] == "run" || strings.HasPrefix(os.Args[1], "-")
	ctx := cli.SignalContext(func() {
		if serving {
			_, _ = fmt.Fprintln(os.Stderr, "shutting down: finishing in-flight steps (signal again to exit now)") // a notice; the shutdown goes on regardless
		}
	}, func() {
		// Leases and write-ahead state make an abrupt exit safe: the next
		// start re-executes whatever step was in flight, with the same key.
		_, _ = fmt.Fprintln(os.Stderr, "exiting now") // as above: the exit follows
	})
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// usageError is a bad command line: the command's own usage when it
// gives one, else the whole list.
type usageError = cli.UsageError

const usage = `Sortie agent - mission-driven automations for your gateway.

Usage:
  agent run      [-config FILE] [flags]  run the agent (also: agent -config FILE ...)
  agent validate [-config FILE]          check the config, device registry and scenes
  agent compact  [-config FILE]          shrink the mission database (agent stopped)
  agent restore  [-config FILE] [-data DIR] BACKUP  put a backup in place (agent stopped)
  agent passwd   [-role app|device|admin] [-generate] NAME
                                         a [[broker.users]] entry for the embedded broker
  agent version [-json]                  print the version

Talking to a running agent (its HTTP API, see docs/api.md):
  agent missions list [-state S] [-scene X] [-since T] [-limit N] [-json]
  agent missions show ID [-v] [-json]    a mission and its timeline
  agent missions pause|resume|cancel|retry ID
  agent missions priority ID N
  agent missions watch [ID]              follow a mission until it ends (exit 0: SUCCEEDED)
  agent trigger SCENE [key=value ...] [-request-id R] [-wait]
  agent devices [-json]                  devices, availability, last state
  agent scenes [-json]                   scenes and their parameters
  agent schedules [-next N] [-json]      scenes' schedules and their next firings
  agent why REQUEST_ID [-v] [-json]      what became of a trigger
  agent why [-ok] [-limit N] [-json]     the latest triggers that failed (-ok: the others)
  agent backup FILE                      copy the mission database, agent running
  Each takes -addr HOST:PORT, -token T (or $SORTIE_TOKEN) and -config FILE
  (to take both from the agent's config); flags may follow arguments.

Run "agent run -h" for the flags of run.
`

// run dispatches a subcommand and maps its error to an exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := "run"
	switch {
	case len(args) == 0:
		_, _ = fmt.Fprint(stderr, usage) // the exit code says it already; nowhere else to report it
		return cli.ExitUsage
	case args[0] == "-h" || args[0] == "-help" || args[0] == "--help":
		cmd = "help"
	case len(args[0]) > 0 && args[0][0] != '-':
		cmd, args = args[0], args[1:]
	}
	var err error
	switch cmd {
	case "run":
		err = cmdRun(ctx, args, stdout, stderr)
	case "validate":
		err = cmdValidate(args, stdout, stderr)
	case "missions":
		err = cmdMissions(ctx, args, newCLIOut(stdout, stderr))
	case "trigger":
		err = cmdTrigger(ctx, args, newCLIOut(stdout, stderr))
	case "devices":
		err = cmdDevices(ctx, args, newCLIOut(stdout, stderr))
	case "scenes":
		err = cmdScenes(ctx, args, newCLIOut(stdout, stderr))
	case "why":
		err = cmdWhy(ctx, args, newCLIOut(stdout, stderr))
	case "schedules":
		err = cmdSchedules(ctx, args, newCLIOut(stdout, stderr))
	case "compact":
		err = cmdCompact(args, stdout, stderr)
	case "backup":
		err = cmdBackup(ctx, args, newCLIOut(stdout, stderr))
	case "restore":
		err = cmdRestore(args, stdout, stderr)
	case "passwd":
		err = cmdPasswd(args, os.Stdin, stdout, stderr)
	case "version":
		err = cmdVersion(args, stdout, stderr)
	case "help", "-h", "--help":
		_, err = fmt.Fprint(stdout, usage)
	default:
		err = &usageError{Msg: fmt.Sprintf("unknown command %q", cmd)}
	}
	return cli.Exit(stderr, "agent", err, usage)
}
