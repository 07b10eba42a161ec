package main

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"

	"github.com/sortie-edge/sortie/internal/cli"
)

// cmdVersion prints the version, as text or (-json) as an object.
func cmdVersion(_ context.Context, e *cli.Env, args []string) error {
	stdout := e.Stdout
	fs := e.FlagSet()
	asJSON := fs.Bool("json", false, "print {\"version\", \"go\", \"os\", \"arch\"} as JSON")
	pos, err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return &usageError{Msg: fmt.Sprintf("version takes no arguments, got %q", pos)}
	}
	if !*asJSON {
		_, err := fmt.Fprintln(stdout, "sortie agent", Version)
		return err
	}
	b, err := json.Marshal(map[string]string{"version": Version, "go": runtime.Version(), "os": runtime.GOOS, "arch": runtime.GOARCH})
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s\n", b)
	return err
}
