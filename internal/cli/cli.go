// Package cli holds what the commands' mains share: a Program, the table
// of a command line's commands from which its usage, each command's -h,
// its dispatch and its shell completion are all made; the mapping of a
// command's error to its message and exit code; and the signals that
// stop a long-running command (a first one cleanly, a second one at once).
package cli

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// ExitUsage is the exit code of a bad command line, as flag uses.
const ExitUsage = 2

// UsageError is a bad command line: Program.Main prints it with Usage,
// or with the command's usage when Usage is empty, and exits ExitUsage.
type UsageError struct {
	Msg   string
	Usage string
}

func (e *UsageError) Error() string { return e.Msg }

// ExitError ends the program with Code (a script's answer, such as a
// mission that failed), after printing Err.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }

func (e *ExitError) Unwrap() error { return e.Err }

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
