package main

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/internal/clientid"
	"github.com/sortie-edge/sortie/internal/passwd"
)

// Roles of the embedded broker's users ([[broker.users]]).
const (
	// roleDevice is one device: the user name is its ID, and it may only
	// read its own commands and publish its own acks, state and
	// availability (and a last will on its availability).
	roleDevice = "device"
	// roleApp is a voice assistant, phone app or dashboard: it may
	// publish triggers to this gateway and read replies, mission events
	// and the devices' state and availability.
	roleApp = "app"
	// roleAdmin may do anything, like a client of an open broker.
	roleAdmin = "admin"
)

var roles = []string{roleDevice, roleApp, roleAdmin}

// brokerAuth is the embedded broker's mochi hook when users are
// configured: it refuses anonymous clients and wrong passwords, and
// confines each user to its role's topics. Anything no rule allows is
// denied (mochi's own ledger allows what no rule matches, so it is not
// used).
type brokerAuth struct {
	mqtt.HookBase
	book  *passwd.Book
	roles map[string]string
	dev   devices.Topics
	agent agentTopics
	// internal is the agent's own identity for the clients it runs
	// itself over TCP (the simulated home; the agent's own link when it
	// is told to use TCP): an admin with a password made at start.
	internalUser string
	internalPass []byte
	// ids keeps each client ID to one user: a user's name, or the name
	// and a dot, is that user's alone (so a device using its ID cannot be
	// squatted); any other ID is its first user's until its session ends.
	ids *clientid.Owners

	log      *slog.Logger
	refusals *prometheus.CounterVec
	lastLog  atomic.Int64 // unix ns of the last refusal logged
	quiet    atomic.Int64 // refusals not logged since
}

// bind is simulator.BrokerOptions.Bind.
func (a *brokerAuth) bind(srv *mqtt.Server) { a.ids.Bind(srv) }

// OnDisconnect releases the client ID when the session goes with the
// connection (a clean session).
func (a *brokerAuth) OnDisconnect(cl *mqtt.Client, _ error, expire bool) {
	if expire {
		a.ids.Release(cl)
	}
}

// OnClientExpired releases the client ID of a kept session that expired.
func (a *brokerAuth) OnClientExpired(cl *mqtt.Client) { a.ids.Release(cl) }

// refuse counts a refusal and logs it, at most one line a second: a
// flood of bad logins must not flood the log.
func (a *brokerAuth) refuse(reason, user, clientID, remote string) {
	a.refusals.WithLabelValues(reason).Inc()
	now := time.Now().UnixNano()
	last := a.lastLog.Load()
	if now-last < int64(time.Second) || !a.lastLog.CompareAndSwap(last, now) {
		a.quiet.Add(1)
		return
	}
	a.log.Warn("broker refused a client", "reason", reason, "user", user, "client_id", clientID, "remote", remote, "not_logged_since", a.quiet.Swap(0))
}

// exposureWarnings are what the embedded broker's and the API's settings
// leave open beyond loopback, for run's log and validate's output.
func exposureWarnings(c Config) []string {
	var out []string
	b := c.Broker
	if b.Embedded && !onLoopback(b.Listen) {
		switch {
		case len(b.Users) == 0:
			out = append(out, fmt.Sprintf("the embedded broker listens on %s with no [[broker.users]]: anyone who reaches it can send triggers and device commands (README: Who may use the embedded broker)", b.Listen))
		case b.ServerCertFile == "":
			out = append(out, fmt.Sprintf("the embedded broker listens on %s without TLS: its users' passwords cross the network in the clear (set server_cert_file and server_key_file)", b.Listen))
		}
	}
	h := c.HTTP
	if h.Listen != "" && !onLoopback(h.Listen) {
		switch {
		case h.Token == "" && h.TokenFile == "":
			out = append(out, fmt.Sprintf("the API listens on %s with no token: anyone who reaches it can run scenes and control missions (set http.token_file)", h.Listen))
		case h.CertFile == "":
			out = append(out, fmt.Sprintf("the API listens on %s without TLS: its token crosses the network in the clear (set http.cert_file and http.key_file)", h.Listen))
		}
	}
	return out
}

// onLoopback says whether a listen address is only reachable from this
// host.
func onLoopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return true // not an address: Validate says so
	}
	ip := net.ParseIP(host)
	return host == "localhost" || ip != nil && ip.IsLoopback()
}

// internalUser names the agent's own identity on its broker.
const internalUser = "sortie-internal"

// checkDeviceUsers reports device users that are not in the registry:
// the ACL would confine them to the topics of a device that does not
// exist.
func checkDeviceUsers(b BrokerConfig, reg *devices.Registry) error {
	var errs []error
	for i, u := range b.Users {
		if _, ok := reg.Device(u.Name); u.Role == roleDevice && !ok {
			errs = append(errs, fmt.Errorf("broker.users[%d].name: device %q is not in the device registry", i, u.Name))
		}
	}
	return errors.Join(errs...)
}

// newBrokerAuth returns the hook for the configured users (already
// validated) and the agent's internal password.
func newBrokerAuth(b BrokerConfig, gateway string, log *slog.Logger) (*brokerAuth, string, error) {
	a := &brokerAuth{
		book:         passwd.NewBook(),
		roles:        map[string]string{},
		dev:          devices.Topics{Prefix: b.Prefix},
		agent:        newAgentTopics(b.Prefix, gateway),
		internalUser: internalUser,
		log:          log,
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: namespace + "_broker_refusals_total",
			Help: "Clients and requests the embedded broker refused: bad_login, client_id (held by another user), will, publish, subscribe (a filter or a delivery outside the role).",
		}, []string{"reason"}),
	}
	a.ids = clientid.New(clientid.Named(func(name string) bool {
		_, ok := a.roles[name]
		return ok || name == a.internalUser
	}))
	for i, u := range b.Users {
		c, err := passwd.Parse(u.PasswordHash)
		if err != nil {
			return nil, "", fmt.Errorf("broker.users[%d] (%s): %w (make one with \"agent passwd\")", i, u.Name, err)
		}
		a.book.Add(u.Name, c)
		a.roles[u.Name] = u.Role
	}
	secret := make([]byte, 24)
	if _, err := rand.Read(secret); err != nil {
		return nil, "", fmt.Errorf("broker: internal password: %w", err)
	}
	pass := base64.RawURLEncoding.EncodeToString(secret)
	a.internalPass = []byte(pass)
	return a, pass, nil
}

// ID names the hook in mochi's logs.
func (a *brokerAuth) ID() string { return "sortie-agent-auth" }

// Provides says which hook methods brokerAuth implements.
func (a *brokerAuth) Provides(b byte) bool {
	switch b {
	case mqtt.OnConnectAuthenticate, mqtt.OnACLCheck, mqtt.OnDisconnect, mqtt.OnClientExpired:
		return true
	}
	return false
}

// OnConnectAuthenticate admits users with the right password whose last
// will, if any, their role may publish, and whose client ID is free for
// them (see claim).
func (a *brokerAuth) OnConnectAuthenticate(cl *mqtt.Client, pk packets.Packet) bool {
	user, pass, id := string(pk.Connect.Username), pk.Connect.Password, pk.Connect.ClientIdentifier
	remote := cl.Net.Remote
	var ok bool
	if user == a.internalUser {
		ok = subtle.ConstantTimeCompare(pass, a.internalPass) == 1
	} else {
		ok = user != "" && a.book.Check(user, pass)
	}
	switch {
	case !ok:
		a.refuse("bad_login", user, id, remote)
		return false
	case pk.Connect.WillFlag && !a.mayWill(user, pk.Connect.WillTopic):
		// Wills are not ACL-checked when sent, so check them here.
		a.refuse("will", user, id, remote)
		return false
	case !a.ids.Claim(user, id):
		a.refuse("client_id", user, id, remote)
		return false
	}
	return true
}

// OnACLCheck applies the user's role; write is true for a publish, false
// for a subscription filter or a delivery.
func (a *brokerAuth) OnACLCheck(cl *mqtt.Client, topic string, write bool) bool {
	user := string(cl.Properties.Username)
	if a.may(user, topic, write) {
		return true
	}
	reason := "subscribe"
	if write {
		reason = "publish"
	}
	a.refuse(reason, user, cl.ID, cl.Net.Remote)
	return false
}

func (a *brokerAuth) may(user, topic string, write bool) bool {
	if user == a.internalUser {
		return true
	}
	switch a.roles[user] {
	case roleAdmin:
		return true
	case roleDevice:
		if write {
			return topic == a.dev.Ack(user) || topic == a.dev.State(user) || topic == a.dev.Availability(user)
		}
		return topic == a.dev.Command(user)
	case roleApp:
		if write {
			return topic == a.agent.Trigger()
		}
		return a.appReads(topic)
	}
	return false
}

// mayWill says whether user may leave a last will on topic: what it may
// publish, but a device only on its availability, the one topic where a
// message the broker sends for it means something.
func (a *brokerAuth) mayWill(user, topic string) bool {
	if a.roles[user] == roleDevice {
		return topic == a.dev.Availability(user)
	}
	return a.may(user, topic, true)
}

// appReads says whether an app may read a topic, or subscribe to a
// filter: one whose every match is a reply, a mission event, or a
// device's state or availability.
func (a *brokerAuth) appReads(filter string) bool {
	if rest, ok := strings.CutPrefix(filter, a.agent.base+"/"); ok {
		kind, _, _ := strings.Cut(rest, "/")
		return (kind == "replies" || kind == "missions") && strings.Contains(rest, "/")
	}
	id, kind, ok := a.dev.DeviceOf(filter) // id may be "+"
	return ok && id != "#" && (kind == "state" || kind == "availability")
}
