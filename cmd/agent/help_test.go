package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/internal/cli"
	"github.com/sortie-edge/sortie/internal/testkit"
)

// TestHelpIsUsageAndExitsZero: asking a command for help prints its own
// usage and exits 0; a mistake prints the command's usage, not the whole
// list, and exits 2.
func TestHelpIsUsageAndExitsZero(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		out  string // in stdout or stderr
		not  string
	}{
		{[]string{"missions", "--help"}, 0, "agent missions show ID", ""},
		{[]string{"missions", "-h"}, 0, "agent missions list", ""},
		{[]string{"trigger", "-h"}, 0, "SCENE [key=value ...]", ""},
		{[]string{"missions", "bogus"}, 2, "agent missions show ID", "Talking to a running agent"},
		{[]string{"trigger"}, 2, "SCENE [key=value ...]", "Talking to a running agent"},
		{[]string{"version", "-json"}, 0, `"version":`, ""},
		{[]string{"why", "-h"}, 0, "usage: agent why", "Usage of"},
		{[]string{"schedules", "--help"}, 0, "usage: agent schedules", "Usage of"},
		{[]string{"devices", "-h"}, 0, "usage: agent devices", "Usage of"},
		{[]string{"why", "-limit", "0"}, 2, "-limit 0", ""},
	} {
		var out, errb strings.Builder
		code := run(context.Background(), c.args, &out, &errb)
		all := out.String() + errb.String()
		if code != c.code || !strings.Contains(all, c.out) || c.not != "" && strings.Contains(all, c.not) {
			t.Errorf("agent %s: exit %d, want %d; output:\n%s", strings.Join(c.args, " "), code, c.code, all)
		}
	}
}

// TestEveryCommandsHelpIsItsOwnUsage: -h and --help on every command
// and subcommand print that command's usage line (its arguments), what
// it does and its flags on stdout, and exit 0.
func TestEveryCommandsHelpIsItsOwnUsage(t *testing.T) {
	usages := map[string]string{ // command: its usage line, or a line of it
		"run":               "usage: agent run [-config FILE] [flags]",
		"validate":          "usage: agent validate [-config FILE]",
		"compact":           "usage: agent compact [-config FILE] [-data DIR]",
		"restore":           "usage: agent restore [-config FILE] [-data DIR] BACKUP",
		"passwd":            "usage: agent passwd [-role R] [-scope S] [-generate] NAME",
		"version":           "usage: agent version [-json]",
		"missions":          "agent missions priority ID N [-json]",
		"missions list":     "usage: agent missions list [-state S[,S]] [-scene X] [-since T] [-limit N] [-cursor C] [-json]",
		"missions show":     "usage: agent missions show ID [-v] [-json]",
		"missions pause":    "usage: agent missions pause ID [-json]",
		"missions resume":   "usage: agent missions resume ID [-json]",
		"missions cancel":   "usage: agent missions cancel ID [-json]",
		"missions retry":    "usage: agent missions retry ID [-json]",
		"missions priority": "usage: agent missions priority ID N [-json]",
		"missions watch":    "usage: agent missions watch [ID]",
		"trigger":           "usage: agent trigger SCENE [key=value ...] [-request-id R] [-wait]",
		"devices":           "usage: agent devices [discover [-for D]] [-json]",
		"scenes":            "usage: agent scenes [-json]",
		"schedules":         "usage: agent schedules [-next N] [-json]",
		"why":               "usage: agent why [REQUEST_ID] [-v] [-ok] [-limit N] [-json]",
		"backup":            "usage: agent backup FILE",
		"apply":             "usage: agent apply DIR [-min-agent V] [-json]",
		"config":            "usage: agent config [-json]",
		"completion":        "usage: agent completion bash|zsh",
		"help":              "usage: agent help [COMMAND]",
	}
	for _, c := range program.Commands {
		for _, path := range append([]string{c.Name}, subPaths(c)...) {
			if _, ok := usages[path]; !ok && !c.Hidden {
				t.Errorf("agent %s: no case here; add its usage line", path)
			}
		}
	}
	for path, want := range usages {
		for _, help := range []string{"-h", "--help"} {
			t.Run(path+" "+help, func(t *testing.T) {
				code, out, errb := runCLI(append(strings.Fields(path), help)...)
				lines := strings.Split(out, "\n")
				if code != 0 || errb != "" || !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(strings.TrimSpace(l), want) }) {
					t.Errorf("exit %d, want 0 and %q on stdout\nstdout:\n%s\nstderr:\n%s", code, want, out, errb)
				}
				// The client commands' flags say how to reach the agent.
				client := strings.HasPrefix(path, "missions ") || slices.Contains([]string{"trigger", "devices", "scenes", "schedules", "why", "backup"}, path)
				if client && !strings.Contains(out, "\n  -addr string\n") {
					t.Errorf("no -addr among the flags:\n%s", out)
				}
			})
		}
	}
}

// subPaths are the paths of c's subcommands ("missions list").
func subPaths(c *cli.Command) []string {
	var paths []string
	for _, s := range c.Subs {
		paths = append(paths, c.Name+" "+s.Name)
	}
	return paths
}

// TestTriggerWaitExitsByHowTheMissionEnds: -wait follows the mission and
// exits 0 when it succeeds, 1 when it is cancelled, 2 when the trigger
// is rejected; missions watch does the same for a mission already going.
func TestTriggerWaitExitsByHowTheMissionEnds(t *testing.T) {
	f := newCLIFixture(t, "")
	cli := func(args ...string) (int, string) {
		var out, errb strings.Builder
		code := run(context.Background(), append(args, "-addr", f.url), &out, &errb)
		return code, out.String() + errb.String()
	}
	if code, out := cli("trigger", "many", "-wait"); code != 0 || !strings.Contains(out, "SUCCEEDED in ") || !strings.Contains(out, "step 1/") || strings.Contains(out, "step_ok") {
		t.Errorf("trigger -wait of a mission that succeeds: exit %d, want progress lines\n%s", code, out)
	}
	if code, out := cli("trigger", "many", "-wait", "-events"); code != 0 || !strings.Contains(out, "SUCCEEDED") || !strings.Contains(out, "step_ok") {
		t.Errorf("trigger -wait -events: exit %d, want the state machine's events\n%s", code, out)
	}
	if code, out := cli("trigger", "nope", "-wait"); code != 2 || !strings.Contains(out, "unknown_scene") {
		t.Errorf("trigger -wait of an unknown scene: exit %d\n%s", code, out)
	}
	f.gate.Hold.Store(true)
	type result struct {
		code int
		out  string
	}
	done := make(chan result, 1)
	go func() {
		code, out := cli("trigger", "solo", "-wait", "-request-id", "held")
		done <- result{code, out}
	}()
	id := <-f.gate.Entered
	watched := make(chan result, 1)
	go func() {
		code, out := cli("missions", "watch", id)
		watched <- result{code, out}
	}()
	if code, out := cli("missions", "cancel", id); code != 0 {
		t.Fatalf("cancel: exit %d\n%s", code, out)
	}
	f.gate.Release <- struct{}{}
	for _, ch := range []chan result{done, watched} {
		r := testkit.Receive(t, ch, 30*time.Second, "no end to the wait for a cancelled mission")
		if r.code != 1 || !strings.Contains(r.out, "CANCELLED") {
			t.Errorf("a cancelled mission followed: exit %d\n%s", r.code, r.out)
		}
	}
}
