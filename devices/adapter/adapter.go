// Package adapter is the contract between package devices and the
// packages that speak one device ecosystem's MQTT dialect (Zigbee2MQTT,
// Tasmota, ...), the way database/sql/driver is the contract between
// database/sql and a database's driver. It imports nothing of ours, so
// an ecosystem package (and the simulator that imports it for its wire
// format) links neither the devices client nor the driver.
//
// # The common vocabulary
//
// A scene says the same thing whatever a device speaks. An adapter
// translates between these state keys, in these units, and its
// ecosystem's own:
//
//	power       "on" | "off"            a light, a plug, a relay, a climate unit
//	brightness  0..100 (percent)        a dimmable light
//	color_temp  kelvin                  a white-spectrum light
//	locked      true | false            a lock
//	position    0 (closed)..100 (open)  a cover, a curtain, a shutter
//	moving      true | false            reported only: a cover still travelling
//	mode        "heat" | "cool" | ...   a climate unit's mode
//	target      degrees Celsius         a climate unit's setpoint
//
// Commands are always absolute ("power": "on", never a toggle), so that
// sending one twice has the effect of sending it once: these devices do
// not recognise a repeated command ID.
package adapter

import (
	"encoding/json"
	"errors"
	"math"
	"time"
)

// Message is one MQTT message, sent or received.
type Message struct {
	Topic   string
	Payload []byte
	// Retained, on a received message, says that the broker replayed it
	// from its store when the subscription was made: it reports the past,
	// and never confirms a command sent since. Adapters never send
	// retained messages (a retained command replays on the device's next
	// connection: Tasmota's "ghost switching").
	Retained bool
}

// Device is a device of the registry as its adapter knows it.
type Device struct {
	// ID is Sortie's ID for the device (topic-safe, no '/').
	ID string
	// Address is the device's name in its ecosystem: a Zigbee2MQTT
	// friendly name, a Tasmota topic, a Shelly topic prefix, ... It may
	// contain '/'.
	Address string
	// Keys are the state keys (of the common vocabulary) the device's
	// type sets: its registry type's "set" parameters.
	Keys []string
	// Config is the device's own description in its ecosystem's terms,
	// for ecosystems where each device is described apart (a Home
	// Assistant MQTT discovery config), or nil.
	Config map[string]any
}

// Availability is what a report says of a device's connection.
type Availability int8

// Availabilities.
const (
	Unknown Availability = iota // the message says nothing of it
	Online
	Offline
)

// Report is what one received message says about one device.
type Report struct {
	// Device is the device's Sortie ID.
	Device string
	// State holds the keys the message reports, in the common
	// vocabulary, or nil. A report may hold only some of the device's
	// keys: it updates those.
	State map[string]any
	// Availability is Unknown unless the message says.
	Availability Availability
	// Failure is the ecosystem's own signal that the device's last
	// command failed (a Zigbee2MQTT "Publish 'set' … failed" log, a
	// Tasmota {"Command":"Unknown"}), or nil.
	Failure *Failure
	// Reply is the answer to a request that carried an ID (Shelly's
	// JSON-RPC), or nil.
	Reply *Reply
}

// Failure is a device's or its ecosystem's refusal of a command.
type Failure struct {
	// Code is machine-readable: a devices/wire error code, so that the
	// driver classifies it as it does a native device's.
	Code string
	// Message is the ecosystem's own words, for people.
	Message string
}

// Reply is the answer to a request that carried an ID.
type Reply struct {
	// ID is the request's ID as the adapter put it in the request.
	ID string
	// Failure is nil when the request succeeded.
	Failure *Failure
	// Prior is the state before the request, when the reply says (a
	// Shelly's "was_on").
	Prior map[string]any
}

// Protocol speaks one ecosystem's dialect for the devices given when it
// was made. Package devices calls its methods one at a time, and Decode
// for each message in the order the broker delivered them.
type Protocol interface {
	// Filters lists the topic filters whose messages Decode reads.
	Filters() []string
	// Decode reads one message. A message the adapter does not
	// understand returns an error; one that concerns none of its devices
	// returns no report. A message understood in part returns the
	// reports it could read with an error for the rest: they are
	// applied, and the error logged.
	Decode(m Message) ([]Report, error)
	// Command returns the messages that bring device to want, a set of
	// the device's keys in the common vocabulary. id identifies this
	// sending, for ecosystems whose requests carry one (the Reply then
	// names it); others ignore it.
	Command(device string, want map[string]any, id string) ([]Message, error)
	// Probe returns the messages that make the device report its
	// current state (a Zigbee2MQTT /get, a Tasmota empty-payload query,
	// a Shelly GetStatus), or nil if the ecosystem has none. id is as
	// for Command.
	Probe(device string, id string) []Message
}

// Prober is implemented by a Protocol whose devices must be asked, when
// the agent connects, whether they are there: their will is not
// retained (a Shelly's), so the broker cannot say. Package devices then
// sends each device its Probe, and a device that has said nothing
// within ProbeOnConnect counts as offline until it speaks.
type Prober interface {
	ProbeOnConnect() time.Duration
}

// ErrUnsupported is wrapped by errors about keys or values an ecosystem
// has no way to express.
var ErrUnsupported = errors.New("not supported by the device's protocol")

// Tolerance is how far a reported value of key may be from the wanted
// one and still match, for the keys whose units an ecosystem converts:
// color_temp travels in mireds (2700 K is 370 mireds, reported back as
// 2703 K), brightness in 0..254 or 0..255 steps, target in tenths or
// halves of a degree. Other keys match exactly.
func Tolerance(key string, want float64) float64 {
	switch key {
	case "color_temp":
		// One mired either side: d(1e6/m) = K²/1e6 per mired.
		return want*want/1e6 + 1
	case "brightness":
		return 1
	case "target":
		return 0.25
	case "position":
		// Covers stop within a step of their target.
		return 1
	}
	return 0
}

// Number reads a numeric value of the common vocabulary as a float64:
// the kinds package devices hands over (int, int64, float64 and
// json.Number from decoded step params); ok is false for anything else,
// NaN and the infinities included.
func Number(v any) (f float64, ok bool) {
	switch n := v.(type) {
	case int:
		return float64(n), true
	case int64:
		return float64(n), true
	case float64:
		f, ok = n, true
	case json.Number:
		var err error
		f, err = n.Float64()
		ok = err == nil
	}
	return f, ok && !math.IsNaN(f) && !math.IsInf(f, 0)
}

// Found is a device an ecosystem announced (Zigbee2MQTT's bridge/devices,
// Tasmota's discovery, an ESPHome node's Home Assistant discovery, a
// Shelly answering a probe), as discovery reports it.
type Found struct {
	// Protocol and Address are what a registry entry for it names.
	Protocol string `json:"protocol"`
	Address  string `json:"address"`
	// Name is the device's own name, when it has one; Model its make.
	Name  string `json:"name,omitempty"`
	Model string `json:"model,omitempty"`
	// Kind is relay, light, lock, curtain or thermostat: the registry
	// type a discovery proposes for it.
	Kind string `json:"kind"`
	// Keys are the keys of the common vocabulary it can set.
	Keys []string `json:"keys"`
	// Config is what a registry entry's config table holds for it, for
	// ecosystems whose devices carry one (see Device.Config).
	Config map[string]any `json:"config,omitempty"`
}
