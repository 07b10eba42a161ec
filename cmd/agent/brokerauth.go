package main

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sortie-edge/sortie/broker"
	"github.com/sortie-edge/sortie/broker/passwd"
	"github.com/sortie-edge/sortie/devices"
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

// brokerAuth is the embedded broker's access control when users are
// configured: broker.Auth with the agent's roles as its rule.
type brokerAuth struct {
	hook  *broker.Auth
	roles map[string]string
	dev   devices.Topics
	agent agentTopics
	// refusals counts what the hook refused, by reason.
	refusals *prometheus.CounterVec
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

// newBrokerAuth returns the access control for the configured users
// (already validated) and the agent's internal password, made anew at
// every start.
func newBrokerAuth(b BrokerConfig, gateway string, log *slog.Logger) (*brokerAuth, string, error) {
	a := &brokerAuth{
		roles: map[string]string{},
		dev:   devices.Topics{Prefix: b.Prefix},
		agent: newAgentTopics(b.Prefix, gateway),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: namespace + "_broker_refusals_total",
			Help: "Clients and requests the embedded broker refused: bad_login, client_id (held by another user), will, publish, subscribe (a filter or a delivery outside the role).",
		}, []string{"reason"}),
	}
	book := passwd.NewBook()
	for i, u := range b.Users {
		c, err := passwd.Parse(u.PasswordHash)
		if err != nil {
			return nil, "", fmt.Errorf("broker.users[%d] (%s): %w (make one with \"agent passwd\")", i, u.Name, err)
		}
		book.Add(u.Name, c)
		a.roles[u.Name] = u.Role
	}
	secret := make([]byte, 24)
	if _, err := rand.Read(secret); err != nil {
		return nil, "", fmt.Errorf("broker: internal password: %w", err)
	}
	pass := base64.RawURLEncoding.EncodeToString(secret)
	hook, err := broker.NewAuth(broker.AuthOptions{
		Users:    book,
		Internal: internalUser, InternalPassword: pass,
		Allow:     a.may,
		AllowWill: a.mayWill,
		Logger:    log,
		Refused:   func(reason string) { a.refusals.WithLabelValues(reason).Inc() },
	})
	if err != nil {
		return nil, "", err
	}
	a.hook = hook
	return a, pass, nil
}

// may says whether user may publish to (write) or read topic.
func (a *brokerAuth) may(user, topic string, write bool) bool {
	if user == internalUser {
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
