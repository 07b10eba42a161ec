package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/sortie-edge/sortie/broker/passwd"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/hub"
	"github.com/sortie-edge/sortie/internal/cli"
)

// idArg parses args with fs and returns their one argument, an ID;
// otherwise a usage error, need saying what is missing.
func idArg(fs *flag.FlagSet, args []string, need string) (string, error) {
	pos, err := cli.Parse(fs, args)
	if err != nil {
		return "", err
	}
	if len(pos) != 1 {
		return "", &usageError{Msg: need}
	}
	if err := driver.CheckID("gateway", pos[0]); err != nil {
		return "", &usageError{Msg: err.Error()}
	}
	return pos[0], nil
}

// cmdPasswd prints a [gateways] line for a gateway. The password comes
// from the first line of stdin, or is generated with -generate and
// printed once, as a comment above the line, for the gateway's config.
// Only the hash goes into the hub's file.
func cmdPasswd(_ context.Context, e *cli.Env, args []string) error {
	stdin, stdout, stderr := e.Stdin, e.Stdout, e.Stderr
	fs := e.FlagSet()
	generate := fs.Bool("generate", false, "generate a random password and print it once")
	id, err := idArg(fs, args, "passwd needs exactly one gateway ID")
	if err != nil {
		return err
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
