package main

import (
	"fmt"
	"os"
	"syscall"
	"testing"
	"unsafe"
)

// ioctl on a pseudo-terminal's master, with the standard library only
// (x/sys/unix is not a direct dependency of the module).
func ioctl(f *os.File, req uintptr, arg *int32) error {
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), req, uintptr(unsafe.Pointer(arg))); errno != 0 {
		return errno
	}
	return nil
}

// TestShowDrawsWaterfallOnATerminal opens a pseudo-terminal, as a
// person's shell has: it counts as a terminal, coloured unless NO_COLOR
// is set or TERM is dumb.
func TestShowDrawsWaterfallOnATerminal(t *testing.T) {
	ptm, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	defer func() { _ = ptm.Close() }() // nothing is read from it
	var unlock, n int32
	if err := ioctl(ptm, syscall.TIOCSPTLCK, &unlock); err != nil {
		t.Fatal(err)
	}
	if err := ioctl(ptm, syscall.TIOCGPTN, &n); err != nil {
		t.Fatal(err)
	}
	pts, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pts.Close() }() // nothing was written
	for _, c := range []struct {
		noColor, term string
		colour        bool
	}{{"", "xterm-256color", true}, {"1", "xterm-256color", false}, {"", "dumb", false}} {
		t.Setenv("NO_COLOR", c.noColor)
		t.Setenv("TERM", c.term)
		if tty, colour := terminal(pts); !tty || colour != c.colour {
			t.Errorf("NO_COLOR=%q TERM=%q: terminal = %v, colour = %v, want a terminal, colour %v", c.noColor, c.term, tty, colour, c.colour)
		}
	}
}
