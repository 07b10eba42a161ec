package devices

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sortie-edge/sortie/devices/adapter"
	"github.com/sortie-edge/sortie/devices/esphome"
	"github.com/sortie-edge/sortie/devices/homeassistant"
	"github.com/sortie-edge/sortie/devices/tasmota"
	"github.com/sortie-edge/sortie/devices/zigbee2mqtt"
)

// Announcement is a difference between what the ecosystems announce and
// what the registry names, seen while the agent runs: a device announced
// that the registry does not name (just paired, just flashed), or a
// device of the registry its ecosystem stopped announcing (it left the
// Zigbee network, its discovery config was removed). Nothing is added to
// or removed from the registry: a person decides (`agent devices
// discover` writes the entries).
type Announcement struct {
	Found adapter.Found `json:"found"`
	// Device is the registry's ID for it when the registry names it.
	Device string `json:"device,omitempty"`
	// Gone is true when its ecosystem no longer announces it.
	Gone bool `json:"gone,omitempty"`
	// Since is when it was first seen so.
	Since time.Time `json:"since"`
}

// announcers are the retained announcements the running client follows,
// by topic filter: each decodes one message into the devices it
// announces (all of them for a topic that lists them all, as
// Zigbee2MQTT's bridge/devices does; an empty payload removes what the
// topic announced). Shelly devices are not followed: they announce
// nothing retained, and discovery asks them.
func announcers(reg *Registry) (map[string]func(topic string, payload []byte) ([]adapter.Found, error), error) {
	if reg == nil {
		reg = &Registry{}
	}
	z, err := zigbee2mqtt.ParseSettings(reg.Protocols[zigbee2mqtt.Name])
	if err != nil {
		return nil, fmt.Errorf("protocols.%s: %w", zigbee2mqtt.Name, err)
	}
	ha, err := homeassistant.ParseSettings(reg.Protocols[homeassistant.Name])
	if err != nil {
		return nil, fmt.Errorf("protocols.%s: %w", homeassistant.Name, err)
	}
	out := map[string]func(string, []byte) ([]adapter.Found, error){
		z.DevicesTopic(): func(_ string, payload []byte) ([]adapter.Found, error) {
			if len(payload) == 0 {
				return nil, nil
			}
			return zigbee2mqtt.DecodeDevices(payload)
		},
		tasmota.DiscoveryFilter: func(_ string, payload []byte) ([]adapter.Found, error) {
			if len(payload) == 0 {
				return nil, nil
			}
			return tasmota.DecodeDiscovery(payload)
		},
	}
	filters := homeassistant.DiscoveryFilters(ha.Prefix)
	if ha.Prefix != homeassistant.DefaultPrefix {
		filters = append(filters, esphome.DiscoveryFilters...)
	}
	for _, f := range filters {
		out[f] = func(topic string, payload []byte) ([]adapter.Found, error) {
			// An ESPHome node's configs are ESPHome's; a Zigbee2MQTT
			// bridge's are left to its bridge/devices.
			fd, ok, err := esphome.DecodeDiscovery(topic, payload)
			switch {
			case ok:
				return []adapter.Found{fd}, nil
			case err != nil:
				return nil, err
			}
			var raw map[string]any
			if json.Unmarshal(payload, &raw) == nil && slices.ContainsFunc(homeassistant.CommandTopics(raw), func(t string) bool {
				return strings.HasPrefix(t, z.Base+"/")
			}) {
				return nil, nil // a Zigbee2MQTT bridge's: its bridge/devices says it
			}
			return homeassistant.DecodeDiscovery(ha.Prefix, topic, payload)
		}
	}
	return out, nil
}

// announced follows the announcements (see Announcement).
type announced struct {
	mu sync.Mutex
	// byTopic is what each topic announces now; count how many topics
	// announce each device (protocol and address).
	byTopic    map[string][]adapter.Found
	count      map[string]int
	registered map[string]string // protocol and address -> device ID
	changes    map[string]Announcement
	problems   map[string]string // what each topic's last unreadable announcement said
	now        func() time.Time
	notify     func(Announcement)
}

func newAnnounced(reg *Registry, notify func(Announcement)) *announced {
	a := &announced{byTopic: make(map[string][]adapter.Found), count: make(map[string]int),
		registered: make(map[string]string), changes: make(map[string]Announcement),
		problems: make(map[string]string), now: time.Now, notify: notify}
	if reg == nil {
		return a
	}
	for _, d := range reg.Devices {
		if d.Protocol != "" && d.Protocol != ProtocolSortie {
			a.registered[d.Protocol+" "+d.Address] = d.ID
		}
	}
	return a
}

// update records what topic announces now, and reports the differences
// with the registry it makes.
func (a *announced) update(topic string, fs []adapter.Found) {
	a.mu.Lock()
	var out []Announcement
	before := a.byTopic[topic]
	if len(fs) == 0 {
		delete(a.byTopic, topic)
	} else if len(a.byTopic) < maxFound || before != nil {
		a.byTopic[topic] = fs
	}
	now := make(map[string]adapter.Found, len(fs))
	for _, f := range a.byTopic[topic] {
		now[f.Protocol+" "+f.Address] = f
	}
	old := make(map[string]adapter.Found, len(before))
	for _, f := range before {
		old[f.Protocol+" "+f.Address] = f
	}
	for _, k := range slices.Sorted(maps.Keys(old)) {
		if _, still := now[k]; still {
			continue
		}
		if a.count[k]--; a.count[k] > 0 {
			continue
		}
		delete(a.count, k)
		if id, ok := a.registered[k]; ok {
			c := Announcement{Found: old[k], Device: id, Gone: true, Since: a.now()}
			a.changes[k] = c
			out = append(out, c)
		} else {
			delete(a.changes, k) // announced, not registered, gone again: nothing left to say
		}
	}
	for _, k := range slices.Sorted(maps.Keys(now)) {
		if _, was := old[k]; was {
			continue
		}
		if a.count[k]++; a.count[k] > 1 {
			continue
		}
		if id, ok := a.registered[k]; ok {
			if prev, ok := a.changes[k]; ok && prev.Gone {
				delete(a.changes, k)
				out = append(out, Announcement{Found: now[k], Device: id, Since: a.now()})
			}
			continue
		}
		if len(a.changes) < maxFound {
			c := Announcement{Found: now[k], Since: a.now()}
			a.changes[k] = c
			out = append(out, c)
		}
	}
	a.mu.Unlock()
	for _, c := range out {
		a.notify(c)
	}
}

// list is what differs now, devices not in the registry first.
func (a *announced) list() []Announcement {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Announcement, 0, len(a.changes))
	for _, c := range a.changes {
		out = append(out, c)
	}
	// sort.Slice, not slices.SortFunc: a generic sort made for this
	// struct is 11 KB of the agent's arm64 code, which is at its budget.
	sort.Slice(out, func(i, j int) bool {
		x, y := out[i], out[j]
		switch {
		case x.Gone != y.Gone:
			return y.Gone
		case x.Found.Protocol != y.Found.Protocol:
			return x.Found.Protocol < y.Found.Protocol
		}
		return x.Found.Address < y.Found.Address
	})
	return out
}

// problem records that topic's announcement could not be read, and
// says whether that is new (logged once per topic).
func (a *announced) problem(topic string, err error) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, seen := a.problems[topic]
	if !seen && len(a.problems) >= maxFound {
		return false
	}
	a.problems[topic] = fmt.Sprintf("%s: %v", topic, err)
	return !seen
}

// current is every device announced now, and what could not be read.
func (a *announced) current() ([]adapter.Found, []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var fs []adapter.Found
	for _, topic := range slices.Sorted(maps.Keys(a.byTopic)) {
		fs = append(fs, a.byTopic[topic]...)
	}
	var problems []string
	for _, topic := range slices.Sorted(maps.Keys(a.problems)) {
		problems = append(problems, a.problems[topic])
	}
	return fs, problems
}

// followAnnouncements follows the ecosystems' announcements from the
// first connection when the registry names a device of another
// ecosystem (otherwise from the first Discover).
func (c *Client) followAnnouncements() error {
	if len(c.eco.Load().ecos) == 0 {
		return nil
	}
	return c.startAnnouncements()
}

// startAnnouncements subscribes, once, to the retained announcements of
// every ecosystem, for Announced and Discover.
func (c *Client) startAnnouncements() error {
	c.annMu.Lock()
	defer c.annMu.Unlock()
	if c.ann != nil {
		return nil
	}
	ann, subs, err := c.watchAnnouncements(c.eco.Load().reg)
	if err != nil {
		return err
	}
	c.ann, c.annSubs = ann, subs
	return nil
}

// rewatchAnnouncements compares what is announced with reg, which now
// runs: a new watch, whose subscriptions replay what is announced, and
// the old one ended once it is in place. (What it finds not in reg is
// logged again.) Caller holds swapMu.
func (c *Client) rewatchAnnouncements(reg *Registry) error {
	c.annMu.Lock()
	defer c.annMu.Unlock()
	if c.ann == nil && len(c.eco.Load().ecos) == 0 {
		return nil
	}
	ann, subs, err := c.watchAnnouncements(reg)
	if err != nil {
		return err
	}
	old := c.annSubs
	c.ann, c.annSubs = ann, subs
	for _, cancel := range old {
		cancel()
	}
	return nil
}

// watchAnnouncements subscribes a new watch of the announcements,
// compared with reg.
func (c *Client) watchAnnouncements(reg *Registry) (*announced, []func(), error) {
	decoders, err := announcers(reg)
	if err != nil {
		return nil, nil, err
	}
	ann := newAnnounced(reg, func(an Announcement) {
		switch {
		case an.Gone:
			c.log.Warn("a device of the registry is no longer announced by its ecosystem", "device", an.Device,
				"protocol", an.Found.Protocol, "address", an.Found.Address)
		case an.Device != "":
			c.log.Info("a device of the registry is announced again", "device", an.Device, "protocol", an.Found.Protocol, "address", an.Found.Address)
		default:
			c.log.Info("a device is announced that the registry does not name; agent devices discover writes its entry",
				"protocol", an.Found.Protocol, "address", an.Found.Address, "kind", an.Found.Kind, "name", an.Found.Name)
		}
		if c.opts.OnAnnouncement != nil {
			c.opts.OnAnnouncement(an)
		}
	})
	var subs []func()
	for _, filter := range slices.Sorted(maps.Keys(decoders)) {
		decode := decoders[filter]
		// Optional: an agent whose broker does not let it read the
		// announcements still drives its devices.
		cancel, err := c.subscribeAllOpt(filter, true, func(topic string, payload []byte) {
			fs, err := decode(topic, payload)
			if err != nil {
				if ann.problem(topic, err) {
					c.log.Debug("an announcement could not be read", "topic", topic, "err", err)
				}
				if len(fs) == 0 {
					return // an unreadable list is not an empty one
				}
			} else {
				ann.clearProblem(topic)
			}
			ann.update(topic, fs)
		})
		if err != nil {
			for _, cancel := range subs {
				cancel()
			}
			return nil, nil, fmt.Errorf("subscribe %s: %w", filter, err)
		}
		subs = append(subs, cancel)
	}
	return ann, subs, nil
}

// Announced lists the differences between what the ecosystems announce
// and the registry (see Announcement); nil when the registry names no
// device of another ecosystem.
func (c *Client) Announced() []Announcement {
	c.annMu.Lock()
	ann := c.ann
	c.annMu.Unlock()
	if ann == nil {
		return nil
	}
	return ann.list()
}

// clearProblem forgets that topic's announcement was unreadable.
func (a *announced) clearProblem(topic string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.problems, topic)
}
