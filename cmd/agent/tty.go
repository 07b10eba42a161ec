package main

import (
	"io"
	"os"

	"golang.org/x/term"
)

// terminal says whether w is a terminal, where `missions show` draws its
// waterfall, and whether to colour it: not when NO_COLOR is set
// (no-color.org) or TERM is dumb. Output to a file, a pipe or /dev/null
// stays plain text for scripts, as -json does.
func terminal(w io.Writer) (tty, colour bool) {
	f, ok := w.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return false, false
	}
	return true, os.Getenv("NO_COLOR") == "" && os.Getenv("TERM") != "dumb"
}
