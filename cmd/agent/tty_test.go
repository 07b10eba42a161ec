package main

import (
	"bytes"
	"io"
	"os"
	"testing"
)

// TestShowDrawsNoWaterfallIntoAPipe: a script's `missions show` (into a
// buffer, a pipe or /dev/null) stays plain text, without the waterfall
// or colours a terminal gets.
func TestShowDrawsNoWaterfallIntoAPipe(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Close(); _ = w.Close() }() // only their kind was asked
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = null.Close() }() // nothing was written
	for name, out := range map[string]io.Writer{"buffer": &bytes.Buffer{}, "pipe": w, "/dev/null": null} {
		if tty, colour := terminal(out); tty || colour {
			t.Errorf("%s: terminal = %v, colour = %v, want plain", name, tty, colour)
		}
	}
}
