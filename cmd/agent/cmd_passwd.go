package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/broker/passwd"
	"github.com/sortie-edge/sortie/devices/wire"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/cli"
)

// passwdHelp is passwd's -h.
const passwdHelp = `Prints a [[broker.users]] entry for the embedded broker's config. The
password is typed twice at a terminal (or read from the first line of
stdin), or made up with -generate and shown once. A device's NAME is its
device ID. R is app (default), device, admin, or an ecosystem's role
(zigbee2mqtt, tasmota, shelly, esphome, homeassistant) with S its topic or topic
prefix. See the README, "Who may use the embedded broker".`

// cmdPasswd prints a [[broker.users]] entry for the embedded broker. The
// password comes from the first line of stdin, or is generated with
// -generate and printed once, as a comment, for the client's own
// settings. Only the hash goes into the agent's config.
func cmdPasswd(_ context.Context, e *cli.Env, args []string) error {
	fs := e.FlagSet()
	role := fs.String("role", agent.RoleApp, "the user's role: "+strings.Join(agent.Roles, ", "))
	generate := fs.Bool("generate", false, "generate a random password and print it once")
	scope := fs.String("scope", "", "an ecosystem device's topic or topic prefix (roles zigbee2mqtt, tasmota, shelly, esphome, homeassistant)")
	bad := func(msg string) error { return &usageError{Msg: msg} }
	pos, err := cli.Parse(fs, args)
	switch {
	case err != nil:
		return err
	case len(pos) != 1:
		return bad("passwd needs exactly one user name (a device's is its ID)")
	}
	name := pos[0]
	if errs := agent.CheckUsers([]agent.BrokerUser{{Name: name, Role: *role, Scope: *scope, PasswordHash: "-"}}); len(errs) > 0 && errs[0].Field == "scope" {
		return bad("-scope: " + errs[0].Msg)
	}
	switch {
	case !slices.Contains(agent.Roles, *role):
		return bad(fmt.Sprintf("-role %q must be one of %s", *role, strings.Join(agent.Roles, ", ")))
	case *role == agent.RoleDevice:
		if err := wire.ValidateDeviceID(name); err != nil {
			return bad(err.Error())
		}
	default:
		if err := driver.CheckID("user name", name); err != nil {
			return bad(err.Error())
		}
	}
	password, err := passwd.Read(e.Stdin, e.Stderr, name, *generate)
	if err != nil {
		return err
	}
	h, err := passwd.Hash(password)
	if err != nil {
		return err
	}
	var b strings.Builder
	if *generate {
		fmt.Fprintf(&b, "# password for %s (give it to the client; it is not shown again): %s\n", name, password)
	}
	fmt.Fprintf(&b, "[[broker.users]]\nname = %q\nrole = %q\n", name, *role)
	if *scope != "" {
		fmt.Fprintf(&b, "scope = %q\n", *scope)
	}
	fmt.Fprintf(&b, "password_hash = %q\n", h)
	_, err = io.WriteString(e.Stdout, b.String())
	return err
}
