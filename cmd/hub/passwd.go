package main

import (
	"context"
	"fmt"

	"github.com/sortie-edge/sortie/broker/passwd"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/hub"
	"github.com/sortie-edge/sortie/internal/cli"
)

// cmdPasswd prints a [gateways] line for a gateway. The password comes
// from the first line of stdin, or is generated with -generate and
// printed once, as a comment above the line, for the gateway's config.
// Only the hash goes into the hub's file.
func cmdPasswd(_ context.Context, e *cli.Env, args []string) error {
	stdin, stdout, stderr := e.Stdin, e.Stdout, e.Stderr
	fs := e.FlagSet()
	generate := fs.Bool("generate", false, "generate a random password and print it once")
	pos, err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return &usageError{Msg: "passwd needs exactly one gateway ID"}
	}
	id := pos[0]
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
