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
