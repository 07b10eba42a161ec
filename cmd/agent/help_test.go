package main

import (
	"context"
	"strings"
	"testing"
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
