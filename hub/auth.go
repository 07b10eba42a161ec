package hub

import (
	"crypto/subtle"
	"fmt"
	"strings"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/clientid"
	"github.com/sortie-edge/sortie/internal/passwd"
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

// AuthOptions configures an Auth hook.
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
}

// Auth is a mochi hook for the hub's embedded broker. It refuses
// anonymous clients and wrong passwords, and confines each gateway G to
// publishing on its own status, heartbeat, events and control/result
// topics (and a last will on its status topic) and subscribing to its
// own ack and control topics. Everything else is denied: mochi's own
// auth ledger allows what no rule matches, so it is not used.
type Auth struct {
	mqtt.HookBase
	topics  uplink.Topics
	hubUser string
	hubPass []byte
	hubCID  string
	creds   *passwd.Book
	// ids keeps each client ID to one user: the hub's own ID and a
	// gateway's default one, its name and its name and a dot are
	// reserved to them; any other ID is its first user's until its
	// session ends.
	ids *clientid.Owners
}

// NewAuth checks the options and returns the hook; pass it to the
// broker with a nil config.
func NewAuth(opts AuthOptions) (*Auth, error) {
	if opts.HubUser == "" || opts.HubPassword == "" {
		return nil, fmt.Errorf("%w: hub identity needs a user and a password", ErrInvalid)
	}
	a := &Auth{
		topics:  uplink.Topics{Prefix: opts.Prefix},
		hubUser: opts.HubUser,
		hubPass: []byte(opts.HubPassword),
		hubCID:  opts.HubClientID,
		creds:   passwd.NewBook(),
	}
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
		a.creds.Add(gw, c)
	}
	named := clientid.Named(func(name string) bool { return name == a.hubUser || a.creds.Has(name) })
	a.ids = clientid.New(func(id string) string {
		if a.hubCID != "" && id == a.hubCID {
			return a.hubUser
		}
		if gw, ok := strings.CutPrefix(id, uplink.DefaultClientID("")); ok && a.creds.Has(gw) {
			return gw
		}
		return named(id)
	})
	return a, nil
}

// Bind is simulator.BrokerOptions.Bind: the hook sees the connected
// clients when it releases a client ID.
func (a *Auth) Bind(srv *mqtt.Server) { a.ids.Bind(srv) }

// OnDisconnect releases the client ID when the session goes with the
// connection (a clean session).
func (a *Auth) OnDisconnect(cl *mqtt.Client, _ error, expire bool) {
	if expire {
		a.ids.Release(cl)
	}
}

// OnClientExpired releases the client ID of a kept session that expired.
func (a *Auth) OnClientExpired(cl *mqtt.Client) { a.ids.Release(cl) }

// ID names the hook in mochi's logs.
func (a *Auth) ID() string { return "sortie-hub-auth" }

// Provides says which hook methods Auth implements.
func (a *Auth) Provides(b byte) bool {
	switch b {
	case mqtt.OnConnectAuthenticate, mqtt.OnACLCheck, mqtt.OnDisconnect, mqtt.OnClientExpired:
		return true
	}
	return false
}

// OnConnectAuthenticate admits the hub identity and gateways with the
// right password whose last will, if any, is their own status topic, and
// whose client ID no other user holds.
func (a *Auth) OnConnectAuthenticate(cl *mqtt.Client, pk packets.Packet) bool {
	user, pass := string(pk.Connect.Username), pk.Connect.Password
	if user == "" || len(pass) == 0 {
		return false
	}
	var ok bool
	if user == a.hubUser {
		ok = subtle.ConstantTimeCompare(pass, a.hubPass) == 1
	} else {
		if pk.Connect.WillFlag && pk.Connect.WillTopic != a.topics.Status(user) {
			// Wills are not ACL-checked when sent, so check them here.
			return false
		}
		ok = a.creds.Check(user, pass)
	}
	return ok && a.ids.Claim(user, pk.Connect.ClientIdentifier)
}

// OnACLCheck allows the hub everything and a gateway only its own
// topics; write is true for a publish, false for a subscription filter
// or a delivery.
func (a *Auth) OnACLCheck(cl *mqtt.Client, topic string, write bool) bool {
	user := string(cl.Properties.Username)
	if user == "" {
		return false
	}
	if user == a.hubUser {
		return true
	}
	if !a.creds.Has(user) {
		return false
	}
	t := a.topics
	if write {
		return topic == t.Status(user) || topic == t.Heartbeat(user) || topic == t.Events(user) || topic == t.ControlResult(user)
	}
	return topic == t.Ack(user) || topic == t.Control(user)
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
