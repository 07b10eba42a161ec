package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/passwd"
)

// cmdPasswd prints a [[broker.users]] entry for the embedded broker. The
// password comes from the first line of stdin, or is generated with
// -generate and printed once, as a comment, for the client's own
// settings. Only the hash goes into the agent's config.
func cmdPasswd(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("passwd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	role := fs.String("role", roleApp, "the user's role: "+strings.Join(roles, ", "))
	generate := fs.Bool("generate", false, "generate a random password and print it once")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &usageError{err.Error()}
	}
	if fs.NArg() != 1 {
		return &usageError{"passwd needs exactly one user name (a device's is its ID)"}
	}
	name := fs.Arg(0)
	switch {
	case !slices.Contains(roles, *role):
		return &usageError{fmt.Sprintf("-role %q must be one of %s", *role, strings.Join(roles, ", "))}
	case *role == roleDevice:
		if err := devices.ValidateDeviceID(name); err != nil {
			return &usageError{err.Error()}
		}
	default:
		if err := driver.CheckID("user name", name); err != nil {
			return &usageError{err.Error()}
		}
	}
	password, err := passwd.Read(stdin, stderr, name, *generate)
	if err != nil {
		return err
	}
	h, err := passwd.Hash(password)
	if err != nil {
		return err
	}
	if *generate {
		fmt.Fprintf(stdout, "# password for %s (give it to the client; it is not shown again): %s\n", name, password)
	}
	fmt.Fprintf(stdout, "[[broker.users]]\nname = %q\nrole = %q\npassword_hash = %q\n", name, *role, h)
	return nil
}
