package hub

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/sortie-edge/sortie/broker"
	"github.com/sortie-edge/sortie/broker/passwd"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/uplink"
)

// HashIterations is the PBKDF2 cost of HashPassword.
const HashIterations = passwd.Iterations

// HashPassword returns a salted PBKDF2-SHA256 hash of password for the
// hub's gateway credentials, so the config file holds no passwords.
func HashPassword(password string) (string, error) {
	h, err := passwd.Hash(password)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return h, nil
}

// ParseHash checks a hash made by HashPassword.
func ParseHash(h string) error {
	if _, err := passwd.Parse(h); err != nil {
		return fmt.Errorf("%w: %w (see \"hub passwd\")", ErrInvalid, err)
	}
	return nil
}

// AuthOptions configures NewAuth.
type AuthOptions struct {
	// Prefix is the topic prefix (default uplink.DefaultPrefix).
	Prefix string
	// HubUser and HubPassword are the hub's own identity: it alone may
	// publish acks and control requests and read every topic.
	HubUser, HubPassword string
	// HubClientID is the hub's MQTT client ID. No other client may use
	// it: mochi would hand the hub's session to the newcomer.
	HubClientID string
	// Gateways maps gateway ID (the MQTT username) to a password hash
	// from HashPassword.
	Gateways map[string]string
	// Logger receives the broker's refusals; nil discards them.
	Logger *slog.Logger
}

// NewAuth returns the access control of the hub's embedded broker (pass
// it as broker.Options.Auth). It refuses anonymous clients and wrong
// passwords, and confines each gateway G to publishing on its own
// status, heartbeat, events, traces, control/result and bundle/status topics (and a last will
// on its status topic) and subscribing to its own ack and control
// topics; the hub identity may do anything. The hub's client ID and a
// gateway's default one are reserved to them.
func NewAuth(opts AuthOptions) (*broker.Auth, error) {
	if opts.HubUser == "" || opts.HubPassword == "" {
		return nil, fmt.Errorf("%w: hub identity needs a user and a password", ErrInvalid)
	}
	creds := passwd.NewBook()
	for gw, h := range opts.Gateways {
		if err := driver.ValidateID("gateway", gw); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		if gw == opts.HubUser {
			return nil, fmt.Errorf("%w: gateway %q has the hub's user name", ErrInvalid, gw)
		}
		c, err := passwd.Parse(h)
		if err != nil {
			return nil, fmt.Errorf("gateway %q: %w: %w (see \"hub passwd\")", gw, ErrInvalid, err)
		}
		creds.Add(gw, c)
	}
	t := uplink.Topics{Prefix: opts.Prefix}
	return broker.NewAuth(broker.AuthOptions{
		Users:    creds,
		Internal: opts.HubUser, InternalPassword: opts.HubPassword,
		Allow: func(gw, topic string, write bool) bool {
			if write {
				return topic == t.Status(gw) || topic == t.Heartbeat(gw) || topic == t.Events(gw) || topic == t.ControlResult(gw) || topic == t.Traces(gw) || topic == t.BundleStatus(gw)
			}
			return topic == t.Ack(gw) || topic == t.Control(gw)
		},
		AllowWill: func(gw, topic string) bool { return topic == t.Status(gw) },
		Reserved: func(id string) string {
			if opts.HubClientID != "" && id == opts.HubClientID {
				return opts.HubUser
			}
			if gw, ok := strings.CutPrefix(id, uplink.DefaultClientID("")); ok && creds.Has(gw) {
				return gw
			}
			return ""
		},
		Logger: opts.Logger,
	})
}

// gatewayOf returns the gateway ID of a hub topic and its kind
// ("status", "events", "control/result", ...).
func gatewayOf(t uplink.Topics, topic string) (gw, kind string, ok bool) {
	rest, found := strings.CutPrefix(topic, strings.TrimSuffix(t.Status(""), "/status"))
	if !found {
		return "", "", false
	}
	gw, kind, ok = strings.Cut(rest, "/")
	if !ok || driver.ValidateID("gateway", gw) != nil {
		return "", "", false
	}
	return gw, kind, true
}
