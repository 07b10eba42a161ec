package broker

import (
	"crypto/subtle"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/sortie-edge/sortie/broker/passwd"
)

// Reasons a client or a request is refused, passed to
// AuthOptions.Refused and logged.
const (
	RefusedLogin     = "bad_login" // unknown user or wrong password
	RefusedThrottled = "throttled" // a login from a host that failed too often just before, not checked
	RefusedWill      = "will"      // a last will outside what the user may publish
	RefusedClientID  = "client_id" // a client ID held by or reserved to another user
	RefusedPublish   = "publish"   // a publish outside the user's topics
	RefusedSubscribe = "subscribe" // a filter or a delivery outside the user's topics
)

// AuthOptions configures an Auth hook: who may log in, and what each
// user may do once in.
type AuthOptions struct {
	// Users are the accounts and their password hashes.
	Users *passwd.Book
	// Internal and InternalPassword are the process's own identity, for
	// the clients it runs itself over TCP (the agent's simulated home,
	// the hub's own connection): it may do anything. Empty means none.
	Internal, InternalPassword string
	// Allow says whether user, one of Users, may publish to topic
	// (write) or subscribe to the filter or receive a delivery on the
	// topic (!write). Required.
	Allow func(user, topic string, write bool) bool
	// AllowWill says whether user may leave a last will on topic; nil
	// allows what Allow lets it publish. Wills are not checked when
	// the broker sends them, so this is checked at login.
	AllowWill func(user, topic string) bool
	// Reserved names the user a client ID belongs to beyond the users'
	// own names ("" for none); may be nil. A client ID equal to a user's
	// name, or to the name, a dot and anything, is always that user's.
	Reserved func(clientID string) string
	// Logger receives refusals, at most one line a second so that a
	// flood of bad logins does not flood the log; nil discards them.
	Logger *slog.Logger
	// Refused, when set, is called with each refusal's reason (the
	// Refused* constants), for a metric.
	Refused func(reason string)
}

// Auth is the embedded broker's access control when it has users: it
// refuses anonymous clients and wrong passwords, keeps each client ID to
// one user, and confines each user to what AuthOptions.Allow permits.
// Anything not allowed is denied; mochi's own auth ledger allows what no
// rule matches, so it is not used. Safe for concurrent use.
type Auth struct {
	mqtt.HookBase
	opts         AuthOptions
	internalPass []byte
	ids          *owners
	throttle     *throttle
	lastLog      atomic.Int64 // unix ns of the last refusal logged
	quiet        atomic.Int64 // refusals not logged since
}

// NewAuth returns the hook for Options.Auth.
func NewAuth(opts AuthOptions) (*Auth, error) {
	switch {
	case opts.Users == nil:
		return nil, errors.New("broker auth: no users")
	case opts.Allow == nil:
		return nil, errors.New("broker auth: no Allow rule")
	case opts.Internal != "" && opts.InternalPassword == "":
		return nil, errors.New("broker auth: the internal identity has no password")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	a := &Auth{opts: opts, internalPass: []byte(opts.InternalPassword), throttle: newThrottle()}
	named := namedOwner(func(name string) bool {
		return name == opts.Internal && name != "" || opts.Users.Has(name)
	})
	a.ids = newOwners(func(id string) string {
		if opts.Reserved != nil {
			if u := opts.Reserved(id); u != "" {
				return u
			}
		}
		return named(id)
	})
	return a, nil
}

// ID names the hook in mochi's logs.
func (a *Auth) ID() string { return "sortie-auth" }

// Provides says which hook methods Auth implements.
func (a *Auth) Provides(b byte) bool {
	switch b {
	case mqtt.OnConnectAuthenticate, mqtt.OnACLCheck, mqtt.OnDisconnect, mqtt.OnClientExpired:
		return true
	}
	return false
}

// OnConnectAuthenticate admits users with the right password whose last
// will, if any, they may leave, and whose client ID no other user holds.
func (a *Auth) OnConnectAuthenticate(cl *mqtt.Client, pk packets.Packet) bool {
	user, pass, id := string(pk.Connect.Username), pk.Connect.Password, pk.Connect.ClientIdentifier
	internal := a.opts.Internal != "" && user == a.opts.Internal
	var ok bool
	if internal {
		// A constant-time compare, not a key derivation: not throttled,
		// so that a guesser on the gateway's own host cannot lock the
		// agent's own clients out.
		ok = subtle.ConstantTimeCompare(pass, a.internalPass) == 1
	} else {
		if a.throttle.wait(cl.Net.Remote) > 0 {
			a.refuse(RefusedThrottled, user, id, cl.Net.Remote)
			return false
		}
		ok = user != "" && len(pass) > 0 && a.opts.Users.Check(user, pass)
		if ok {
			a.throttle.succeeded(cl.Net.Remote)
		} else {
			a.throttle.failed(cl.Net.Remote)
		}
	}
	switch {
	case !ok:
		a.refuse(RefusedLogin, user, id, cl.Net.Remote)
		return false
	case pk.Connect.WillFlag && !internal && !a.mayWill(user, pk.Connect.WillTopic):
		a.refuse(RefusedWill, user, id, cl.Net.Remote)
		return false
	case !a.ids.claim(user, id):
		a.refuse(RefusedClientID, user, id, cl.Net.Remote)
		return false
	}
	return true
}

func (a *Auth) mayWill(user, topic string) bool {
	if a.opts.AllowWill != nil {
		return a.opts.AllowWill(user, topic)
	}
	return a.opts.Allow(user, topic, true)
}

// OnACLCheck applies Allow; write is true for a publish, false for a
// subscription filter or a delivery.
func (a *Auth) OnACLCheck(cl *mqtt.Client, topic string, write bool) bool {
	user := string(cl.Properties.Username)
	if user == "" {
		return false
	}
	if a.opts.Internal != "" && user == a.opts.Internal {
		return true
	}
	if a.opts.Users.Has(user) && a.opts.Allow(user, topic, write) {
		return true
	}
	reason := RefusedSubscribe
	if write {
		reason = RefusedPublish
	}
	a.refuse(reason, user, cl.ID, cl.Net.Remote)
	return false
}

// OnDisconnect releases the client ID when the session goes with the
// connection (a clean session).
func (a *Auth) OnDisconnect(cl *mqtt.Client, _ error, expire bool) {
	if expire {
		a.ids.release(cl)
	}
}

// OnClientExpired releases the client ID of a kept session that expired.
func (a *Auth) OnClientExpired(cl *mqtt.Client) { a.ids.release(cl) }

// refuse counts a refusal and logs it, at most one line a second.
func (a *Auth) refuse(reason, user, clientID, remote string) {
	if a.opts.Refused != nil {
		a.opts.Refused(reason)
	}
	now := time.Now().UnixNano()
	last := a.lastLog.Load()
	if now-last < int64(time.Second) || !a.lastLog.CompareAndSwap(last, now) {
		a.quiet.Add(1)
		return
	}
	a.opts.Logger.Warn("broker refused a client", "reason", reason, "user", user, "client_id", clientID, "remote", remote, "not_logged_since", a.quiet.Swap(0))
}
