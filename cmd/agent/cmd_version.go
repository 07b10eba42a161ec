package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"runtime"
)

// cmdVersion prints the version, as text or (-json) as an object.
func cmdVersion(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print {\"version\", \"go\", \"os\", \"arch\"} as JSON")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return &usageError{Msg: fmt.Sprintf("version takes no arguments, got %q", pos), Usage: "usage: agent version [-json]\n"}
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
