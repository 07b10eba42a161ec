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
//	agent completion bash|zsh               a shell completion script
//
// "agent help" lists every command; missions, trigger, devices, scenes,
// schedules, why and backup talk to a running agent's management API
// (docs/api.md).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/cli"
)

// Version and Revision are set at build time with -ldflags
// "-X main.Version=... -X main.Revision=..." (the Makefile does).
var (
	Version  = "dev"
	Revision = ""
)

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
// gives one, else the command's usage line.
type usageError = cli.UsageError

// program is the agent's command line: its usage, each command's -h,
// the dispatch and the shell completion are all read from this table.
var program = &cli.Program{
	Name:    "agent",
	Intro:   "Sortie agent - mission-driven automations for your gateway.",
	Outro:   `Run "agent COMMAND -h" for a command's arguments and flags.`,
	Default: "run",
	Pass:    []string{"addr", "token", "config"},
	FlagValues: map[string]cli.Values{
		"config":     cli.Files,
		"data":       cli.Dirs,
		"devices":    cli.Files,
		"scenes":     cli.Dirs,
		"sim":        cli.Files,
		"log-level":  cli.Words("debug", "info", "warn", "error"),
		"log-format": cli.Words("text", "json"),
		"role":       cli.Words(agent.Roles...),
		"scene":      cli.Dynamic("scenes"),
		"state":      cli.Words(stateNames()...),
	},
	Commands: []*cli.Command{
		{Name: "run", Args: "[-config FILE] [flags]", Summary: "run the agent (also: agent -config FILE ...)",
			Help: "Runs the agent: the config file first, then the flags over it.", Run: cmdRun},
		{Name: "validate", Args: "[-config FILE]", Summary: "check the config, device registry and scenes", Run: cmdValidate},
		{Name: "compact", Args: "[-config FILE] [-data DIR]", Summary: "shrink the mission database (agent stopped)", Run: cmdCompact},
		{Name: "restore", Args: "[-config FILE] [-data DIR] BACKUP", Summary: "put a backup in place (agent stopped)",
			Help:      "Puts BACKUP (a file \"agent backup\" wrote) in place of the stopped agent's\nmission database, keeping the database it replaces beside it.",
			ArgValues: []cli.Values{cli.Files}, Run: cmdRestore},
		{Name: "passwd", Args: "[-role R] [-scope S] [-generate] NAME", Summary: "a [[broker.users]] entry for the embedded broker",
			Help: passwdHelp, Run: cmdPasswd},
		{Name: "version", Args: "[-json]", Summary: "print the version", Run: cmdVersion},

		{Name: "missions", Summary: "list, show and control missions", Group: clientGroup,
			Help: `Run "agent missions ACTION -h" for an action's flags.`,
			Subs: []*cli.Command{
				{Name: "list", Args: "[-state S[,S]] [-scene X] [-since T] [-limit N] [-cursor C] [-json]",
					Summary: "the latest missions, newest first", Run: missionsAction("list")},
				{Name: "show", Args: "ID [-v] [-json]", Summary: "a mission and its timeline",
					ArgValues: missionArg, Run: missionsAction("show")},
				missionControl("pause", "pause a mission before its next step"),
				missionControl("resume", "resume a paused mission"),
				missionControl("cancel", "cancel a mission (what it did is undone)"),
				missionControl("retry", "run a failed mission again"),
				{Name: "priority", Args: "ID N [-json]", Summary: "set a mission's priority",
					ArgValues: missionArg, Run: missionsAction("priority")},
				{Name: "watch", Args: "[ID]", Summary: "follow a mission until it ends (exit 0: SUCCEEDED)",
					Help:      "Follows a mission (default: the newest) until it ends:\nexit 0 if it succeeded, 1 otherwise.",
					ArgValues: missionArg, Run: cmdWatch},
			}},
		{Name: "trigger", Args: "SCENE [key=value ...] [-request-id R] [-wait]", Summary: "run a scene",
			Help: "Runs SCENE with its parameters, as an MQTT trigger would. Values that look\n" +
				"like numbers or true/false are sent as such; quote them, key='\"42\"', to\nsend a string.",
			ArgValues: []cli.Values{cli.Dynamic("scenes")}, Run: cmdTrigger},
		{Name: "devices", Args: "[discover [-for D]] [-json]", Summary: "devices, availability, last state; discover new ones",
			Help: "Lists the registry's devices: whether each is online, and its last\nreported state, then the devices announced that the registry does not\nname and those of the registry no longer announced. \"devices discover\"\nlistens for D (default 5s) to what Zigbee2MQTT, Tasmota, Shelly, ESPHome\nand other Home Assistant MQTT devices announce and prints a registry\nTOML of the devices the registry does not name yet.", Run: cmdDevices},
		{Name: "scenes", Args: "[-json]", Summary: "scenes and their parameters",
			Help: "Lists the scenes the agent can run: mode, priority, deadline, steps and\nparameters.", Run: cmdScenes},
		{Name: "schedules", Args: "[-next N] [-json]", Summary: "scenes' schedules and their next firings", Run: cmdSchedules},
		{Name: "why", Args: "[REQUEST_ID] [-v] [-ok] [-limit N] [-json]", Summary: "what became of a trigger",
			Help:      "With REQUEST_ID: what became of that trigger. Without: the latest\ntriggers that failed (-ok: the others).",
			ArgValues: []cli.Values{cli.Dynamic("requests")}, Run: cmdWhy},
		{Name: "apply", Args: "DIR [-min-agent V] [-json]", Summary: "run a configuration bundle, on trial, without a restart",
			Help:      "Sends DIR's devices.toml, scenes/*.toml and settings.toml to the running\nagent as one bundle: it validates it, runs it for new triggers, and keeps\nit once healthy, or reverts by itself (docs/fleet.md). Exit 1: rejected.",
			ArgValues: []cli.Values{cli.Files}, Run: cmdApply},
		{Name: "config", Args: "[-json]", Summary: "the configuration that runs: from where, its hash, since when", Run: cmdConfig},
		{Name: "backup", Args: "FILE", Summary: "copy the mission database, agent running",
			Help:      "Copies the running agent's mission database into FILE (replacing it).\nRestore it with \"agent restore\", agent stopped.",
			ArgValues: []cli.Values{cli.Files}, Run: cmdBackup},
		{Name: cli.CompleteCommand, Hidden: true, Run: cmdComplete},
	},
}

// clientGroup heads the commands that talk to a running agent.
const clientGroup = `Talking to a running agent (its HTTP API, see docs/api.md). Each takes
-addr HOST:PORT, -token T (or $SORTIE_TOKEN) and -config FILE (to take
both from the agent's config); flags may follow arguments.`

// missionControl is "missions ACTION ID", which controls a mission.
func missionControl(action, summary string) *cli.Command {
	return &cli.Command{Name: action, Args: "ID [-json]", Summary: summary, ArgValues: missionArg, Run: missionsAction(action)}
}

// missionArg completes a mission ID.
var missionArg = []cli.Values{cli.Dynamic("missions")}

// stateNames are the mission states, for -state.
func stateNames() []string {
	s := make([]string, len(driver.States))
	for i, st := range driver.States {
		s[i] = string(st)
	}
	return s
}

// run runs a command line and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return program.Main(ctx, args, cli.IO{Stdin: os.Stdin, Stdout: stdout, Stderr: stderr})
}
