package main

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/sortie-edge/sortie/devices"
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
	// srv is the broker, for the clients already connected (see bind).
	srv *mqtt.Server
}

// bind is simulator.BrokerOptions.Bind.
func (a *brokerAuth) bind(srv *mqtt.Server) { a.srv = srv }

// takesOver reports whether a client logging in as user would take the
// live session of another user: mochi hands a client ID's session to the
// newest connection, which would let an app knock a device (or the
// simulated home) off and receive its commands.
func (a *brokerAuth) takesOver(user, clientID string) bool {
	if a.srv == nil {
		return false
	}
	old, ok := a.srv.Clients.Get(clientID)
	return ok && !old.Closed() && string(old.Properties.Username) != user
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
			errs = append(errs, fmt.Errorf("broker.users[%d]: device %q is not in the device registry", i, u.Name))
		}
	}
	return errors.Join(errs...)
}

// newBrokerAuth returns the hook for the configured users (already
// validated) and the agent's internal password.
func newBrokerAuth(b BrokerConfig, gateway string) (*brokerAuth, string, error) {
	a := &brokerAuth{
		book:         passwd.NewBook(),
		roles:        map[string]string{},
		dev:          devices.Topics{Prefix: b.Prefix},
		agent:        newAgentTopics(b.Prefix, gateway),
		internalUser: internalUser,
	}
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
	return b == mqtt.OnConnectAuthenticate || b == mqtt.OnACLCheck
}

// OnConnectAuthenticate admits users with the right password whose last
// will, if any, their role may publish.
func (a *brokerAuth) OnConnectAuthenticate(cl *mqtt.Client, pk packets.Packet) bool {
	user, pass := string(pk.Connect.Username), pk.Connect.Password
	if user == "" || len(pass) == 0 {
		return false
	}
	if a.takesOver(user, pk.Connect.ClientIdentifier) {
		return false
	}
	if user == a.internalUser {
		return subtle.ConstantTimeCompare(pass, a.internalPass) == 1
	}
	if pk.Connect.WillFlag && !a.may(user, pk.Connect.WillTopic, true) {
		// Wills are not ACL-checked when sent, so check them here.
		return false
	}
	return a.book.Check(user, pass)
}

// OnACLCheck applies the user's role; write is true for a publish, false
// for a subscription filter or a delivery.
func (a *brokerAuth) OnACLCheck(cl *mqtt.Client, topic string, write bool) bool {
	return a.may(string(cl.Properties.Username), topic, write)
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
