package main

import (
	"io"
	"os"
)

// terminal says whether w is a terminal, where `missions show` draws its
// waterfall, and whether to colour it: not when NO_COLOR is set
// (no-color.org) or TERM is dumb. Output to a file or a pipe stays plain
// text for scripts, as -json does.
func terminal(w io.Writer) (tty, colour bool) {
	f, ok := w.(*os.File)
	if !ok {
		return false, false
	}
	st, err := f.Stat()
	if err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return false, false
	}
	return true, os.Getenv("NO_COLOR") == "" && os.Getenv("TERM") != "dumb"
}
