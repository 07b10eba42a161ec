package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/sortie-edge/sortie/broker/passwd"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/hub"
)

// cmdPasswd prints a [gateways] line for a gateway. The password comes
// from the first line of stdin, or is generated with -generate and
// printed once, as a comment above the line, for the gateway's config.
// Only the hash goes into the hub's file.
func cmdPasswd(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("passwd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	generate := fs.Bool("generate", false, "generate a random password and print it once")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return &usageError{Msg: "passwd needs exactly one gateway ID"}
	}
	id := fs.Arg(0)
	if err := driver.CheckID("gateway", id); err != nil {
		return &usageError{Msg: err.Error()}
	}
	password, err := passwd.Read(stdin, stderr, "gateway "+id, *generate)
	if err != nil {
		return err
	}
	h, err := hub.HashPassword(password)
	if err != nil {
		return err
	}
	if *generate {
		if _, err := fmt.Fprintf(stdout, "# password for gateway %s (put it in the gateway's config; it is not shown again): %s\n", id, password); err != nil {
			return err
		}
	}
	_, err = fmt.Fprintf(stdout, "%s = %q\n", id, h)
	return err
}
