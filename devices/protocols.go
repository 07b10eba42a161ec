package devices

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/sortie-edge/sortie/devices/adapter"
	"github.com/sortie-edge/sortie/devices/esphome"
	"github.com/sortie-edge/sortie/devices/homeassistant"
	"github.com/sortie-edge/sortie/devices/shelly"
	"github.com/sortie-edge/sortie/devices/tasmota"
	"github.com/sortie-edge/sortie/devices/zigbee2mqtt"
)

// ProtocolSortie is the native protocol (docs/protocol.md), a device's
// when it names none.
const ProtocolSortie = "sortie"

// protocol builds one ecosystem's adapter from its registry settings
// and its devices.
type protocol struct {
	build func(settings map[string]any, devs []adapter.Device) (adapter.Protocol, error)
	// link is the link a device of the ecosystem goes through when it
	// names none, declared with the registry's links if missing (a
	// Zigbee2MQTT bridge's coordinator takes a few commands at once).
	link     string
	linkSpec Link
	// blind ecosystems cannot read a device's state on demand (Probe is
	// nil): a device whose last report shows the wanted state is done
	// without a command, since it may not report again.
	blind bool
	// config says the ecosystem's devices each carry a config table.
	config bool
}

// protocols are the ecosystems a registry may name. They are compiled
// in: each is a small package that imports only devices/adapter.
var protocols = map[string]protocol{
	zigbee2mqtt.Name: {
		build: func(m map[string]any, devs []adapter.Device) (adapter.Protocol, error) {
			s, err := zigbee2mqtt.ParseSettings(m)
			if err != nil {
				return nil, err
			}
			return zigbee2mqtt.New(s, devs)
		},
		// Coordinators keep a handful of unicasts in flight (a CC2531
		// about 2, a CC2652 about 16, Z2M #3220): 4 with a short burst is
		// safe for any of them, and a registry that knows its stick
		// declares [links.zigbee2mqtt] to raise it.
		link:     zigbee2mqtt.Name,
		linkSpec: Link{Description: "the Zigbee2MQTT bridge's coordinator (default)", MaxInFlight: 4},
	},
	esphome.Name: {
		build: func(m map[string]any, devs []adapter.Device) (adapter.Protocol, error) {
			if err := esphome.ParseSettings(m); err != nil {
				return nil, err
			}
			return esphome.New(devs)
		},
		blind: true,
	},
	homeassistant.Name: {
		build: func(m map[string]any, devs []adapter.Device) (adapter.Protocol, error) {
			s, err := homeassistant.ParseSettings(m)
			if err != nil {
				return nil, err
			}
			return homeassistant.New(s, devs)
		},
		blind:  true,
		config: true,
	},
	shelly.Name: {
		build: func(m map[string]any, devs []adapter.Device) (adapter.Protocol, error) {
			s, err := shelly.ParseSettings(m)
			if err != nil {
				return nil, err
			}
			return shelly.New(s, devs)
		},
	},
	tasmota.Name: {
		build: func(m map[string]any, devs []adapter.Device) (adapter.Protocol, error) {
			s, err := tasmota.ParseSettings(m)
			if err != nil {
				return nil, err
			}
			return tasmota.New(s, devs)
		},
	},
}

// protocolNames lists the protocols a device may name, for messages.
func protocolNames() string {
	return ProtocolSortie + ", " + strings.Join(slices.Sorted(maps.Keys(protocols)), ", ")
}

// checkProtocol checks a device's protocol and address.
func (r *Registry) checkProtocol(d Device, where string) error {
	if d.Protocol == "" || d.Protocol == ProtocolSortie {
		if d.Address != "" || d.Config != nil {
			return fmt.Errorf("%s: address and config: only a device of another ecosystem has them (set protocol)", where)
		}
		return nil
	}
	p, ok := protocols[d.Protocol]
	if !ok {
		return fmt.Errorf("%s: protocol: unknown %q (want %s)", where, d.Protocol, protocolNames())
	}
	if d.Config != nil && !p.config {
		return fmt.Errorf("%s: config: a %s device has none (its address says where it is)", where, d.Protocol)
	}
	if d.Address == "" {
		return fmt.Errorf("%s: address: missing (the device's name in %s)", where, d.Protocol)
	}
	// These devices do not tell two commands in flight apart: one at a
	// time, and its outcome is the next state they report.
	if d.MaxInFlight > 1 || r.Types[d.Type].MaxInFlight > 1 && d.MaxInFlight == 0 {
		return fmt.Errorf("%s: max_in_flight: a %s device takes one command at a time", where, d.Protocol)
	}
	return nil
}

// checkProtocols builds each ecosystem's adapter once, so that what it
// refuses (a key it cannot translate, an address it cannot take) is an
// error when the registry loads, and declares each ecosystem's default
// link for its devices that name none.
func (r *Registry) checkProtocols() error {
	for name := range r.Protocols {
		if _, ok := protocols[name]; !ok {
			return fmt.Errorf("protocols.%s: unknown protocol (want one of %s)", name, protocolNames())
		}
	}
	if _, err := r.adapters(); err != nil {
		return err
	}
	for i := range r.Devices {
		d := &r.Devices[i]
		p, ok := protocols[d.Protocol]
		if !ok || d.Link != "" || p.link == "" {
			continue
		}
		if r.Links == nil {
			r.Links = make(map[string]*Link)
		}
		if r.Links[p.link] == nil {
			l := p.linkSpec
			r.Links[p.link] = &l
		}
		d.Link = p.link
	}
	return nil
}

// ecosystem is one protocol's adapter and the devices it speaks for.
type ecosystem struct {
	// mu makes Decode's calls one at a time: an in-process broker calls
	// handlers from each publisher's goroutine.
	mu      sync.Mutex
	name    string
	blind   bool
	proto   adapter.Protocol
	devices []string
}

// adapters builds a fresh adapter for each ecosystem the registry's
// devices speak: adapters keep what their messages said (a bridge's
// availability), so each Client has its own.
func (r *Registry) adapters() ([]*ecosystem, error) {
	byProto := make(map[string][]adapter.Device)
	for _, d := range r.Devices {
		if _, ok := protocols[d.Protocol]; !ok {
			continue
		}
		byProto[d.Protocol] = append(byProto[d.Protocol], adapter.Device{
			ID: d.ID, Address: d.Address, Keys: sortedKeys(r.Types[d.Type].Actions[SetAction].Params), Config: d.Config,
		})
	}
	var out []*ecosystem
	for _, name := range slices.Sorted(maps.Keys(byProto)) {
		devs := byProto[name]
		p, err := protocols[name].build(r.Protocols[name], devs)
		if err != nil {
			return nil, fmt.Errorf("protocol %s: %w", name, err)
		}
		e := &ecosystem{name: name, proto: p, blind: protocols[name].blind}
		for _, d := range devs {
			e.devices = append(e.devices, d.ID)
		}
		out = append(out, e)
	}
	return out, nil
}
