package agent

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/sortie-edge/sortie/broker"
	"github.com/sortie-edge/sortie/broker/passwd"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/devices/wire"
	"github.com/sortie-edge/sortie/driver"

	"github.com/prometheus/client_golang/prometheus"
)

// Roles of the embedded broker's users (BrokerUser.Role).
const (
	// RoleDevice is one device: the user name is its ID, and it may only
	// read its own commands and publish its own acks, state and
	// availability (and a last will on its availability).
	RoleDevice = "device"
	// RoleApp is a voice assistant, phone app or dashboard: it may
	// publish triggers to this gateway and read replies, mission events
	// and the devices' state and availability.
	RoleApp = "app"
	// RoleAdmin may do anything, like a client of an open broker.
	RoleAdmin = "admin"
	// RoleZigbee2MQTT is a Zigbee2MQTT bridge: it may publish and
	// subscribe under its base topic (BrokerUser.Scope, default
	// "zigbee2mqtt"), and publish Home Assistant discovery configs and
	// read Home Assistant's status, as its Home Assistant integration does.
	RoleZigbee2MQTT = "zigbee2mqtt"
	// RoleTasmota is one Tasmota device with the default FullTopic: its
	// %topic% is Scope. It may publish its stat/ and tele/ topics, its own
	// cmnd/<topic>/POWER (which it sends itself at connect) and its
	// tasmota/discovery config, and read its cmnd/ topics and the group
	// topic cmnd/tasmotas/.
	RoleTasmota = "tasmota"
	// RoleShelly is one Shelly Gen2+ device whose topic prefix is Scope:
	// it may publish and subscribe under it, read shellies/command, and
	// publish on the agent's reply topic, <src>/rpc, only.
	RoleShelly = "shelly"
	// RoleESPHome is one ESPHome node whose topic prefix is Scope: it may
	// publish and subscribe under it, publish its Home Assistant discovery
	// configs (node id Scope) and read Home Assistant's status.
	RoleESPHome = "esphome"
	// RoleHomeAssistant is a device known to Home Assistant through MQTT
	// discovery (protocol "homeassistant") whose topics are under Scope:
	// the same confinement as an ESPHome node's, its discovery configs
	// with node id Scope.
	RoleHomeAssistant = "homeassistant"
)

// Roles lists the roles a BrokerUser may have.
var Roles = []string{RoleDevice, RoleApp, RoleAdmin, RoleZigbee2MQTT, RoleTasmota, RoleShelly, RoleESPHome, RoleHomeAssistant}

// BrokerUser is a client of the embedded broker.
type BrokerUser struct {
	// Name is the MQTT user name; a device's is its ID.
	Name string
	// Role is one of Roles.
	Role string
	// PasswordHash is made by broker/passwd (the "agent passwd" command).
	PasswordHash string
	// Scope is where an ecosystem device's topics are: a Zigbee2MQTT
	// bridge's base topic, a Tasmota's topic, a Shelly's or an ESPHome
	// node's topic prefix. Only the ecosystem roles have one.
	Scope string
}

// ecosystemRoles are the roles confined to a Scope.
var ecosystemRoles = []string{RoleZigbee2MQTT, RoleTasmota, RoleShelly, RoleESPHome, RoleHomeAssistant}

// brokerAuth is the embedded broker's access control when users are
// configured: broker.Auth with the agent's roles as its rule.
type brokerAuth struct {
	hook  *broker.Auth
	roles map[string]string
	// scopes are the ecosystem users' scopes; shellySrc is the agent's
	// reply topic prefix for Shelly RPC.
	scopes    map[string]string
	shellySrc string
	dev       wire.Topics
	agent     agentTopics
	// refusals counts what the hook refused, by reason.
	refusals *prometheus.CounterVec
}

// InternalUser names the agent's own identity on its embedded broker,
// for the clients it runs over TCP; no BrokerUser may take it.
const InternalUser = "sortie-internal"

// UserError is a problem with Users[Index] of BrokerOptions, in Field
// (name, role or password_hash).
type UserError struct {
	Index int
	Field string
	Msg   string
}

func (e *UserError) Error() string {
	return fmt.Sprintf("broker user %d: %s: %s", e.Index, e.Field, e.Msg)
}

// CheckUsers checks the embedded broker's users: each name once, not
// the agent's own, a device's name a valid device ID; a known role; a
// password hash made by broker/passwd. It returns every problem.
func CheckUsers(users []BrokerUser) []*UserError {
	var errs []*UserError
	bad := func(i int, field, format string, args ...any) {
		errs = appendUserError(errs, i, field, format, args...)
	}
	names := map[string]bool{}
	for i, u := range users {
		switch {
		case u.Name == InternalUser:
			bad(i, "name", "%q is the agent's own", u.Name)
		case names[u.Name]:
			bad(i, "name", "%q appears twice", u.Name)
		case u.Role == RoleDevice:
			if err := wire.ValidateDeviceID(u.Name); err != nil {
				bad(i, "name", "a device's user name is its ID: %v", err)
			}
		default:
			if err := driver.CheckID("user name", u.Name); err != nil {
				bad(i, "name", "%v", err)
			}
		}
		names[u.Name] = true
		if !slices.Contains(Roles, u.Role) {
			bad(i, "role", "%q must be one of %s", u.Role, strings.Join(Roles, ", "))
		}
		switch eco := slices.Contains(ecosystemRoles, u.Role); {
		case !eco && u.Scope != "":
			bad(i, "scope", "only the roles %s have one", strings.Join(ecosystemRoles, ", "))
		case eco && u.Scope == "" && u.Role != RoleZigbee2MQTT:
			bad(i, "scope", "a %s user needs its topic (prefix) here", u.Role)
		case eco && (strings.ContainsAny(u.Scope, "+#\x00") || strings.HasPrefix(u.Scope, "/") || strings.HasSuffix(u.Scope, "/")):
			bad(i, "scope", "%q is not a topic prefix (no wildcards, no leading or trailing '/')", u.Scope)
		case u.Role == RoleTasmota && strings.Contains(u.Scope, "/"):
			bad(i, "scope", "%q: a Tasmota topic has no '/'", u.Scope)
		case eco && (u.Scope == "homeassistant" || u.Scope == "sortie" || strings.HasPrefix(u.Scope, "sortie/") || strings.HasPrefix(u.Scope, "homeassistant/")):
			bad(i, "scope", "%q would reach Sortie's or Home Assistant's own topics", u.Scope)
		}
		if u.PasswordHash == "" {
			bad(i, "password_hash", "must be set (make one with \"agent passwd\"; the config holds no passwords)")
		} else if _, err := passwd.Parse(u.PasswordHash); err != nil {
			bad(i, "password_hash", "%v (make one with \"agent passwd\")", err)
		}
	}
	return errs
}

// CheckDeviceUsers reports device users that are not in the registry:
// the ACL would confine them to the topics of a device that does not
// exist.
func CheckDeviceUsers(users []BrokerUser, reg *devices.Registry) error {
	var errs []error
	for i, u := range users {
		if _, ok := reg.Device(u.Name); u.Role == RoleDevice && !ok {
			errs = append(errs, fmt.Errorf("broker.users[%d].name: device %q is not in the device registry", i, u.Name))
		}
	}
	return errors.Join(errs...)
}

// newBrokerAuth returns the access control for the configured users
// (already validated) and the agent's internal password, made anew at
// every start.
func newBrokerAuth(b BrokerOptions, gateway, shellySrc string, log *slog.Logger) (*brokerAuth, string, error) {
	a := &brokerAuth{
		roles: map[string]string{}, scopes: map[string]string{}, shellySrc: shellySrc,
		dev:   wire.Topics{Prefix: b.Prefix},
		agent: newAgentTopics(b.Prefix, gateway),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: namespace + "_broker_refusals_total",
			Help: "Clients and requests the embedded broker refused: bad_login, client_id (held by another user), will, publish, subscribe (a filter or a delivery outside the role)."},
			[]string{"reason"}),
	}
	book := passwd.NewBook()
	for i, u := range b.Users {
		c, err := passwd.Parse(u.PasswordHash)
		if err != nil {
			return nil, "", fmt.Errorf("broker.users[%d] (%s): %w (make one with \"agent passwd\")", i, u.Name, err)
		}
		book.Add(u.Name, c)
		a.roles[u.Name] = u.Role
		a.scopes[u.Name] = u.Scope
		if u.Role == RoleZigbee2MQTT && u.Scope == "" {
			a.scopes[u.Name] = "zigbee2mqtt"
		}
	}
	secret := make([]byte, 24)
	if _, err := rand.Read(secret); err != nil {
		return nil, "", fmt.Errorf("broker: internal password: %w", err)
	}
	pass := base64.RawURLEncoding.EncodeToString(secret)
	hook, err := broker.NewAuth(broker.AuthOptions{
		Users:    book,
		Internal: InternalUser, InternalPassword: pass,
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
	if user == InternalUser {
		return true
	}
	switch a.roles[user] {
	case RoleAdmin:
		return true
	case RoleDevice:
		if write {
			return topic == a.dev.Ack(user) || topic == a.dev.State(user) || topic == a.dev.Availability(user)
		}
		return topic == a.dev.Command(user)
	case RoleApp:
		if write {
			return topic == a.agent.Trigger()
		}
		return a.appReads(topic)
	case RoleZigbee2MQTT, RoleTasmota, RoleShelly, RoleESPHome, RoleHomeAssistant:
		return a.ecosystemMay(a.roles[user], a.scopes[user], topic, write)
	}
	return false
}

// under says whether filter (a topic, or a subscription's filter) has
// all its matches at prefix or below it: a wildcard may come only after
// the prefix's levels.
func under(filter, prefix string) bool {
	return filter == prefix || strings.HasPrefix(filter, prefix+"/")
}

// ecosystemMay is may for the ecosystem roles, confined to scope.
func (a *brokerAuth) ecosystemMay(role, scope, topic string, write bool) bool {
	switch role {
	case RoleZigbee2MQTT:
		if write && strings.HasPrefix(topic, "homeassistant/") {
			// Its Home Assistant integration's configs, not Home
			// Assistant's own status nor the agent's entities.
			levels := strings.Split(topic, "/")
			return len(levels) >= 4 && !strings.HasPrefix(levels[2], "sortie_") && !strings.ContainsAny(topic, "+#")
		}
		return under(topic, scope) || !write && topic == "homeassistant/status"
	case RoleTasmota:
		if write {
			return under(topic, "stat/"+scope) || under(topic, "tele/"+scope) || strings.EqualFold(topic, "cmnd/"+scope+"/POWER") ||
				strings.HasPrefix(topic, "tasmota/discovery/") && !strings.ContainsAny(topic, "+#")
		}
		return under(topic, "cmnd/"+scope) || under(topic, "cmnd/tasmotas")
	case RoleShelly:
		if write {
			return under(topic, scope) || topic == a.shellySrc+"/rpc"
		}
		return under(topic, scope) || topic == "shellies/command"
	case RoleESPHome, RoleHomeAssistant:
		if write && strings.HasPrefix(topic, "homeassistant/") {
			levels := strings.Split(topic, "/")
			return len(levels) >= 4 && levels[2] == scope && !strings.ContainsAny(topic, "+#")
		}
		return under(topic, scope) || !write && topic == "homeassistant/status"
	}
	return false
}

// mayWill says whether user may leave a last will on topic: what it may
// publish, but a device only on its availability, the one topic where a
// message the broker sends for it means something.
func (a *brokerAuth) mayWill(user, topic string) bool {
	if a.roles[user] == RoleDevice {
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

// appendUserError is kept out of line: inlined at each of CheckUsers'
// checks it costs the gateway's binary kilobytes.
//
//go:noinline
func appendUserError(errs []*UserError, i int, field, format string, args ...any) []*UserError {
	return append(errs, &UserError{Index: i, Field: field, Msg: fmt.Sprintf(format, args...)})
}
