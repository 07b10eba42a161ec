package main

import (
	"context"
	"strings"
	"testing"
	"time"
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
	if code, out := cli("trigger", "many", "-wait"); code != 0 || !strings.Contains(out, "SUCCEEDED") || !strings.Contains(out, "step_ok") {
		t.Errorf("trigger -wait of a mission that succeeds: exit %d\n%s", code, out)
	}
	if code, out := cli("trigger", "nope", "-wait"); code != 2 || !strings.Contains(out, "unknown_scene") {
		t.Errorf("trigger -wait of an unknown scene: exit %d\n%s", code, out)
	}
	f.gate.hold.Store(true)
	type result struct {
		code int
		out  string
	}
	done := make(chan result, 1)
	go func() {
		code, out := cli("trigger", "solo", "-wait", "-request-id", "held")
		done <- result{code, out}
	}()
	id := <-f.gate.entered
	watched := make(chan result, 1)
	go func() {
		code, out := cli("missions", "watch", id)
		watched <- result{code, out}
	}()
	if code, out := cli("missions", "cancel", id); code != 0 {
		t.Fatalf("cancel: exit %d\n%s", code, out)
	}
	f.gate.release <- struct{}{}
	for _, ch := range []chan result{done, watched} {
		select {
		case r := <-ch:
			if r.code != 1 || !strings.Contains(r.out, "CANCELLED") {
				t.Errorf("a cancelled mission followed: exit %d\n%s", r.code, r.out)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("no end to the wait for a cancelled mission")
		}
	}
}
