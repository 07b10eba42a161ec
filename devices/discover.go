package devices

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sortie-edge/sortie/devices/adapter"
	"github.com/sortie-edge/sortie/devices/shelly"
)

// Discovery is what Discover heard: the devices the ecosystems announced,
// and what could not be read.
type Discovery struct {
	Found []adapter.Found `json:"found"`
	// Problems are messages that announced something unreadable, one
	// line each ("tasmota/discovery/…/config: …").
	Problems []string `json:"problems,omitempty"`
}

// maxFound bounds what one discovery keeps, whatever is published.
const maxFound = 4096

// discoverSrc is the src of discovery's Shelly probes.
const discoverSrc = "sortie-discover"

// DiscoverOptions tunes Discover.
type DiscoverOptions struct {
	// Window is how long it listens.
	Window time.Duration
	// OnListening, when set, is called once every subscription is made.
	OnListening func()
}

// Discover listens on the client's connection for a while to what the
// ecosystems announce: Zigbee2MQTT's bridge/devices, Tasmota's
// discovery, Home Assistant discovery configs (ESPHome nodes' and any
// other device's), and Shelly devices (those the registry names, and
// those heard coming online or notifying meanwhile), which are asked for
// their components. Retained announcements come at once (the client
// follows them while it runs: see Announced); the window catches the
// others.
func (c *Client) Discover(ctx context.Context, o DiscoverOptions) (Discovery, error) {
	if err := c.startAnnouncements(); err != nil {
		return Discovery{}, fmt.Errorf("discover: %w", err)
	}
	var mu sync.Mutex
	found := make(map[string]adapter.Found)
	var problems []string
	shellys := make(map[string]bool)
	// Probes wait until every subscription is made: a publish in flight
	// while a SUBSCRIBE goes out has made mochi refuse the SUBSCRIBE as
	// "packet identifier in use" (0x91).
	listening := false
	var held []string
	send := func(prefix string) {
		_ = c.publish(prefix+"/rpc", shelly.StatusRequest(discoverSrc, prefix+"|discover")) // an unanswered probe finds nothing
	}
	probe := func(prefix string) {
		mu.Lock()
		seen := shellys[prefix] || len(shellys) >= maxFound
		shellys[prefix] = true
		hold := !listening
		if !seen && hold {
			held = append(held, prefix)
		}
		mu.Unlock()
		if !seen && !hold {
			send(prefix)
		}
	}
	handlers := map[string]func(topic string, payload []byte){
		discoverSrc + "/rpc": func(topic string, payload []byte) {
			prefix, _, _ := strings.Cut(frameID(payload), "|")
			if prefix == "" {
				return
			}
			fs, err := shelly.DecodeComponents(prefix, payload)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: %v", topic, err))
				return
			}
			for _, f := range fs {
				if len(found) < maxFound {
					found[f.Protocol+" "+f.Address] = f
				}
			}
		},
		"+/online": func(topic string, payload []byte) {
			if string(payload) == "true" {
				probe(strings.TrimSuffix(topic, "/online"))
			}
		},
		"+/events/rpc": func(topic string, _ []byte) { probe(strings.TrimSuffix(topic, "/events/rpc")) },
	}
	var cancels []func()
	defer func() {
		for _, cancel := range cancels {
			cancel()
		}
	}()
	for _, filter := range slices.Sorted(maps.Keys(handlers)) {
		cancel, err := c.subscribeAll(filter, handlers[filter])
		if err != nil {
			return Discovery{}, fmt.Errorf("discover: subscribe %s: %w", filter, err)
		}
		cancels = append(cancels, cancel)
	}
	// Shelly devices that said nothing during the window are asked too,
	// when the registry names them already: they are not new then, but
	// their components are.
	set := c.eco.Load()
	for _, e := range set.ecos {
		if e.name == shelly.Name {
			for _, d := range e.devices {
				if dev, ok := set.reg.Device(d); ok {
					probe(strings.Split(dev.Address, ":")[0])
				}
			}
		}
	}
	mu.Lock()
	listening = true
	queued := held
	mu.Unlock()
	for _, prefix := range queued {
		send(prefix)
	}
	if o.OnListening != nil {
		o.OnListening()
	}
	t := time.NewTimer(o.Window)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return Discovery{}, ctx.Err()
	}
	announced, unreadable := c.ann.current()
	mu.Lock()
	defer mu.Unlock()
	for _, f := range announced {
		if len(found) < maxFound {
			found[f.Protocol+" "+f.Address] = f
		}
	}
	out := Discovery{Problems: append(unreadable, problems...)}
	if len(out.Problems) > 100 {
		out.Problems = out.Problems[:100]
	}
	for _, k := range slices.Sorted(maps.Keys(found)) {
		out.Found = append(out.Found, found[k])
	}
	return out, nil
}

// subscribeAll subscribes handle to filter on the client's connection,
// retained messages included. Over a connection it subscribes at QoS 0:
// announcements are repeated or retained, so a lost one costs nothing,
// and a burst of retained configs at QoS 1 would only hold the broker's
// packet identifiers (mochi v2.7.9 refused a SUBSCRIBE numbered like one
// of them, 0x91, until broker/packetid.go; another broker may do the
// same).
func (c *Client) subscribeAll(filter string, handle func(topic string, payload []byte)) (func(), error) {
	return c.subscribeAllOpt(filter, false, handle)
}

// subscribeAllOpt is subscribeAll; an optional subscription that the
// broker refuses (an ACL) is logged and does not hold the connection
// back (mqttc.Client.SubscribeOptional).
func (c *Client) subscribeAllOpt(filter string, optional bool, handle func(topic string, payload []byte)) (func(), error) {
	if c.mc != nil {
		if optional {
			return c.mc.SubscribeOptional(filter, 0, handle)
		}
		return c.mc.SubscribeQoS(filter, 0, handle)
	}
	return c.local.Subscribe(filter, func(topic string, payload []byte) {
		c.gate.RLock()
		defer c.gate.RUnlock()
		if !c.stopped {
			handle(topic, payload)
		}
	})
}

// frameID reads the string id of a JSON-RPC frame, "" when it has none.
func frameID(payload []byte) string {
	var f struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(payload, &f) // a frame without a string id is not discovery's
	return f.ID
}

// kindTypes are the registry types a discovery proposes, by kind, in the
// common vocabulary (docs/devices.md).
var kindTypes = map[string]string{
	"relay": `[types.relay]
description = "On/off relay or plug (discovered)"
[types.relay.actions.turn_on]
expect = { power = "on" }
[types.relay.actions.turn_off]
expect = { power = "off" }
[types.relay.actions.set]
params.power = { type = "enum", values = ["on", "off"] }
`,
	"light": `[types.light]
description = "Dimmable light (discovered)"
[types.light.actions.turn_on]
expect = { power = "on" }
params.brightness = { type = "int", min = 1, max = 100 }
[types.light.actions.turn_off]
expect = { power = "off" }
[types.light.actions.set]
params.power = { type = "enum", values = ["on", "off"] }
params.brightness = { type = "int", min = 0, max = 100 }
`,
	"light_ct": `[types.light_ct]
description = "White-spectrum light (discovered)"
[types.light_ct.actions.turn_on]
expect = { power = "on" }
params.brightness = { type = "int", min = 1, max = 100 }
params.color_temp = { type = "int", min = 2200, max = 6500 }
[types.light_ct.actions.turn_off]
expect = { power = "off" }
[types.light_ct.actions.set]
params.power = { type = "enum", values = ["on", "off"] }
params.brightness = { type = "int", min = 0, max = 100 }
params.color_temp = { type = "int", min = 2200, max = 6500 }
`,
	"lock": `[types.lock]
description = "Door lock (discovered)"
[types.lock.actions.lock]
expect = { locked = true }
[types.lock.actions.unlock]
expect = { locked = false }
[types.lock.actions.set]
params.locked = { type = "bool" }
`,
	"curtain": `[types.curtain]
description = "Cover, curtain or shutter (discovered); give its steps an ack_timeout above its travel time"
[types.curtain.actions.open]
expect = { position = 100 }
[types.curtain.actions.close]
expect = { position = 0 }
[types.curtain.actions.set]
params.position = { type = "int", min = 0, max = 100 }
`,
	"thermostat": `[types.thermostat]
description = "Thermostat (discovered)"
[types.thermostat.actions.set]
params.mode = { type = "enum", values = ["off", "heat", "auto", "cool"] }
params.target = { type = "number", min = 5, max = 35 }
`,
}

// typeOf is the registry type a discovery proposes for f.
func typeOf(f adapter.Found) string {
	if f.Kind == "light" && slices.Contains(f.Keys, "color_temp") {
		return "light_ct"
	}
	if f.Kind == "light" && !slices.Contains(f.Keys, "brightness") {
		return "relay"
	}
	return f.Kind
}

// RegistryTOML renders what a discovery found as registry TOML a person
// can review and keep: the types it needs, and one [[devices]] entry per
// device that reg (when not nil) does not name already. IDs are made
// from the devices' names, unique within the file and the registry.
func RegistryTOML(d Discovery, reg *Registry) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Devices discovered %s. Review the ids, names and rooms, then add\n# what you keep to the registry (docs/devices.md).\n", time.Now().UTC().Format(time.RFC3339))
	known := make(map[string]string)
	used := make(map[string]bool)
	if reg != nil {
		for _, dev := range reg.Devices {
			known[dev.Protocol+" "+dev.Address] = dev.ID
			used[dev.ID] = true
		}
	}
	var fresh []adapter.Found
	for _, f := range d.Found {
		if id, ok := known[f.Protocol+" "+f.Address]; ok {
			fmt.Fprintf(&b, "# already in the registry: %s (%s %q)\n", id, f.Protocol, f.Address)
			continue
		}
		fresh = append(fresh, f)
	}
	for _, p := range d.Problems {
		fmt.Fprintf(&b, "# could not read: %s\n", p)
	}
	if len(fresh) == 0 {
		b.WriteString("# nothing new\n")
		return b.String()
	}
	kinds := make(map[string]bool)
	for _, f := range fresh {
		kinds[typeOf(f)] = true
	}
	b.WriteString("\n")
	for _, k := range slices.Sorted(maps.Keys(kinds)) {
		if reg != nil && reg.Types[k] != nil {
			fmt.Fprintf(&b, "# type %q: the registry's own\n", k)
			continue
		}
		b.WriteString(kindTypes[k])
		b.WriteString("\n")
	}
	for _, f := range fresh {
		id := uniqueID(slug(f), used)
		used[id] = true
		fmt.Fprintf(&b, "[[devices]]\nid = %q\ntype = %q\n", id, typeOf(f))
		if f.Name != "" {
			fmt.Fprintf(&b, "name = %q\n", f.Name)
		}
		fmt.Fprintf(&b, "protocol = %q\naddress = %q\n", f.Protocol, f.Address)
		if f.Config != nil {
			fmt.Fprintf(&b, "config = %s\n", tomlInline(f.Config))
		}
		if f.Model != "" {
			fmt.Fprintf(&b, "# %s\n", f.Model)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// slug makes a device ID from a name: lower case letters, digits and
// '-', at most 48 bytes.
func slug(f adapter.Found) string {
	name := f.Name
	if name == "" {
		name = f.Address
	}
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(name) {
		switch {
		case r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
			dash = false
		case !dash && b.Len() > 0:
			b.WriteByte('-')
			dash = true
		}
		if b.Len() >= 48 {
			break
		}
	}
	s := strings.TrimRight(b.String(), "-")
	if s == "" {
		s = f.Kind
	}
	return s
}

func uniqueID(base string, used map[string]bool) string {
	if !used[base] {
		return base
	}
	for i := 2; ; i++ {
		if id := fmt.Sprintf("%s-%d", base, i); !used[id] {
			return id
		}
	}
}

// tomlInline renders a value decoded from JSON (text, numbers, bools,
// lists and tables) as a TOML inline value, keys sorted. JSON's string
// escapes are TOML's basic string escapes.
func tomlInline(v any) string {
	switch x := v.(type) {
	case map[string]any:
		parts := make([]string, 0, len(x))
		for _, k := range slices.Sorted(maps.Keys(x)) {
			key := k
			if k == "" || strings.IndexFunc(k, func(r rune) bool {
				return r != '_' && r != '-' && (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (r < '0' || r > '9')
			}) >= 0 { // not a bare key
				key = tomlInline(k)
			}
			parts = append(parts, key+" = "+tomlInline(x[k]))
		}
		return "{ " + strings.Join(parts, ", ") + " }"
	case []any:
		parts := make([]string, 0, len(x))
		for _, it := range x {
			parts = append(parts, tomlInline(it))
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<53 {
			return strconv.FormatInt(int64(x), 10)
		}
		return strconv.FormatFloat(x, 'g', -1, 64)
	case nil:
		return `""`
	}
	if t, ok := v.(string); ok {
		return tomlString(t)
	}
	b, _ := json.Marshal(v) // bools
	return string(b)
}

// tomlString is s as a TOML basic string: quotes, backslashes and every
// control character (DEL included, which JSON leaves as it is) escaped.
func tomlString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, "\\u%04X", r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}
