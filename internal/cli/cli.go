// Package cli holds what the commands' mains share: the signals that stop
// a long-running command (a first one cleanly, a second one at once) and
// the mapping of a command's error to its message and exit code.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// ExitUsage is the exit code of a bad command line, as flag uses.
const ExitUsage = 2

// UsageError is a bad command line: Exit prints it with Usage, or with
// the program's usage when Usage is empty, and exits ExitUsage.
type UsageError struct {
	Msg   string
	Usage string
}

func (e *UsageError) Error() string { return e.Msg }

// Synopsis makes fs's -h print usage (its "usage: ..." lines), then the
// flags, instead of Go's "Usage of NAME".
func Synopsis(fs *flag.FlagSet, usage string) {
	fs.Usage = func() {
		_, _ = fmt.Fprintf(fs.Output(), "%s\n\nflags:\n", usage) // usage text to the terminal; nothing to do if it fails
		fs.PrintDefaults()
	}
}

// ExitError ends the program with Code (a script's answer, such as a
// mission that failed), after printing Err.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }

func (e *ExitError) Unwrap() error { return e.Err }

// Exit prints err for prog and returns the exit code: 0 for nil and for
// a help request, ExitUsage for a *UsageError (followed by the usage),
// 1 for anything else.
func Exit(stderr io.Writer, prog string, err error, usage string) int {
	var ue *UsageError
	var xe *ExitError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &xe):
		_, _ = fmt.Fprintf(stderr, "%s: %v\n", prog, err) // as below
		return xe.Code
	case errors.As(err, &ue):
		if ue.Usage != "" {
			usage = ue.Usage
		}
		_, _ = fmt.Fprintf(stderr, "%s: %v\n\n%s", prog, err, usage) // stderr is where errors go; nowhere else to report it
		return ExitUsage
	default:
		_, _ = fmt.Fprintf(stderr, "%s: %v\n", prog, err) // as above
		return 1
	}
}

// SignalContext returns a context that ends at the first SIGINT or
// SIGTERM, after calling first (when not nil); a second signal calls
// second and exits with 130 at once, for a shutdown that takes too long.
// The command's durable state must make that safe.
func SignalContext(first, second func()) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sigs
		if first != nil {
			first()
		}
		cancel()
		<-sigs
		if second != nil {
			second()
		}
		os.Exit(130)
	}()
	return ctx
}
