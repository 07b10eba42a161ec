package cli

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"
)

func TestExitMapsErrorsToCodesAndMessages(t *testing.T) {
	for _, c := range []struct {
		name   string
		err    error
		code   int
		stderr string
	}{
		{"success", nil, 0, ""},
		{"help", flag.ErrHelp, 0, ""},
		{"usage, program's", &UsageError{Msg: "unknown command \"x\""}, ExitUsage, "prog: unknown command \"x\"\n\nUSAGE"},
		{"usage, command's own", fmt.Errorf("wrapped: %w", &UsageError{Msg: "bad", Usage: "OWN"}), ExitUsage, "prog: wrapped: bad\n\nOWN"},
		{"failure", errors.New("disk on fire"), 1, "prog: disk on fire\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var b strings.Builder
			if got := Exit(&b, "prog", c.err, "USAGE"); got != c.code || b.String() != c.stderr {
				t.Errorf("Exit = %d %q, want %d %q", got, b.String(), c.code, c.stderr)
			}
		})
	}
}
