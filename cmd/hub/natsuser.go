package main

import (
	"context"
	"fmt"
	"strings"

	"golang.org/x/crypto/bcrypt"

	"github.com/sortie-edge/sortie/broker/passwd"
	"github.com/sortie-edge/sortie/hub"
	"github.com/sortie-edge/sortie/internal/cli"
	"github.com/sortie-edge/sortie/uplink"
)

// natsCost is the bcrypt cost of the hashes nats-user prints: NATS
// checks a login against it once per connection.
const natsCost = 11

// cmdNATSUser prints a NATS user for a gateway (or, with -hub, for the
// hub replicas) for the users list of the cluster's NATS config, with
// the permissions it needs and a bcrypt hash of its password.
func cmdNATSUser(_ context.Context, e *cli.Env, args []string) error {
	fs := e.FlagSet()
	generate := fs.Bool("generate", false, "generate a random password and print it once")
	prefix := fs.String("prefix", uplink.DefaultPrefix, "the topic prefix (the hub config's prefix)")
	forHub := fs.Bool("hub", false, "the hub replicas' user (NAME is its nats_user) rather than a gateway's")
	system := fs.Bool("system", false, "a user of the system account (NAME, with no permissions): the entry nats.conf's system_account takes, its password hashed")
	name, err := idArg(fs, args, "nats-user needs exactly one name: a gateway ID, or the hub's user with -hub")
	if err != nil {
		return err
	}
	if *forHub && *system {
		return &usageError{Msg: "-hub and -system are different users: give one"}
	}
	if *system {
		return printSystemUser(e, name, *generate)
	}
	if *prefix == "" || strings.ContainsAny(*prefix, "+#") || strings.HasPrefix(*prefix, "/") || strings.HasSuffix(*prefix, "/") {
		return &usageError{Msg: fmt.Sprintf("prefix %q must be non-empty, without wildcards or a leading/trailing '/'", *prefix)}
	}
	perms, err := hub.GatewayNATSPermissions(*prefix, name)
	types, who := "MQTT", "gateway "+name
	if *forHub {
		perms, err = hub.HubNATSPermissions(*prefix)
		types, who = "STANDARD", "the hub's NATS user "+name
	}
	if err != nil {
		return &usageError{Msg: err.Error()}
	}
	password, err := passwd.Read(e.Stdin, e.Stderr, who, *generate)
	if err != nil {
		return err
	}
	h, err := bcrypt.GenerateFromPassword([]byte(password), natsCost)
	if err != nil {
		return fmt.Errorf("hash password: %w", err)
	}
	if *generate {
		where := "the gateway's [hub] password_file"
		if *forHub {
			where = "the hub's [cluster] nats_password_file"
		}
		if _, err := fmt.Fprintf(e.Stdout, "# password for %s (put it in %s; it is not shown again): %s\n", who, where, password); err != nil {
			return err
		}
	}
	_, err = fmt.Fprintf(e.Stdout, "{user: %s, password: %s,\n permissions: {publish: {allow: %s},\n               subscribe: {allow: %s}},\n allowed_connection_types: [%s]}\n",
		natsString(name), natsString(string(h)), natsList(perms.Publish), natsList(perms.Subscribe), natsString(types))
	return err
}

// printSystemUser prints a user entry for the system account: its
// name and a bcrypt hash of its password, which nats-server takes in
// place of the plaintext it warns about ($2a$, $2b$, $2x$ or $2y$ and a
// two-digit cost, as x/crypto/bcrypt writes).
func printSystemUser(e *cli.Env, name string, generate bool) error {
	password, err := passwd.Read(e.Stdin, e.Stderr, "the NATS system user "+name, generate)
	if err != nil {
		return err
	}
	h, err := bcrypt.GenerateFromPassword([]byte(password), natsCost)
	if err != nil {
		return fmt.Errorf("hash password: %w", err)
	}
	if generate {
		if _, err := fmt.Fprintf(e.Stdout, "# password for the NATS system user %s (for tools that read the servers' state; it is not shown again): %s\n", name, password); err != nil {
			return err
		}
	}
	_, err = fmt.Fprintf(e.Stdout, "{user: %s, password: %s}\n", natsString(name), natsString(string(h)))
	return err
}

// natsString is s as a double-quoted string of nats-server's config,
// which knows only the escapes \" \\ \t \n \r and \x: Go's %q
// would write others (\u…) that it refuses.
func natsString(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\t", `\t`, "\n", `\n`, "\r", `\r`).Replace(s) + `"`
}

// natsList is a list of strings in nats-server's config syntax.
func natsList(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = natsString(s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}
