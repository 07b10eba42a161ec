package main

import (
	"context"
	"strings"
	"testing"
)

// TestHelpPrintsTheUsageAndExitsZero: "hub --help" is the list of
// commands, not the flags of run under "Usage of run".
func TestHelpPrintsTheUsageAndExitsZero(t *testing.T) {
	var out, errb strings.Builder
	if code := run(context.Background(), []string{"--help"}, nil, &out, &errb); code != 0 || !strings.Contains(out.String(), "hub run") || strings.Contains(errb.String(), "Usage of") {
		t.Errorf("hub --help: exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
}

// TestEveryCommandsHelpIsItsOwnUsage: -h and --help on every command
// print its usage line, what it does and its flags on stdout, and exit 0.
func TestEveryCommandsHelpIsItsOwnUsage(t *testing.T) {
	for _, c := range []struct{ cmd, usage, flag string }{
		{"run", "usage: hub run [-config FILE] [flags]", "-broker-url"},
		{"validate", "usage: hub validate [-config FILE]", "-config"},
		{"passwd", "usage: hub passwd [-generate] GATEWAY", "-generate"},
		{"nats-user", "usage: hub nats-user [-generate] [-hub|-system] [-prefix P] NAME", "-system"},
		{"version", "usage: hub version", ""},
		{"completion", "usage: hub completion bash|zsh", ""},
		{"help", "usage: hub help [COMMAND]", ""},
		{"bundle push", "usage: hub bundle push [-group G] [-min-agent V] DIR", "-min-agent"},
		{"rollout start", "usage: hub rollout start [-group G] [-version N] [-gateways A,B | -tag T] [flags]", "-abort-percent"},
		{"rollout resume", "usage: hub rollout resume [-skip] ID", "-skip"},
		{"fleet", "usage: hub fleet [-drifted]", "-drifted"},
		{"tag", "usage: hub tag GATEWAY [TAG ...]", "-hub"},
		{"group", "usage: hub group -drift alert|adopt|revert GROUP", "-drift"},
	} {
		for _, help := range []string{"-h", "--help"} {
			var out, errb strings.Builder
			code := run(context.Background(), append(strings.Fields(c.cmd), help), nil, &out, &errb)
			if code != 0 || !strings.HasPrefix(out.String(), c.usage+"\n") || (c.flag != "" && !strings.Contains(out.String(), "\n  "+c.flag)) || errb.Len() > 0 {
				t.Errorf("hub %s %s: exit %d, want 0 and %q with %s\nstdout:\n%s\nstderr:\n%s", c.cmd, help, code, c.usage, c.flag, out.String(), errb.String())
			}
		}
	}
	if n := len(program.Commands) + 2; n != 12 {
		t.Errorf("the hub has %d commands, the test 12: add the new ones", n)
	}
}
