package homeassistant

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/sortie-edge/sortie/devices/adapter"
)

// DiscoveryFilters are where discovery configs are published under
// prefix: one entity's (<component>/[<node id>/]<object id>/config) and
// a device's with its components (device/<object id>/config).
func DiscoveryFilters(prefix string) []string {
	return []string{prefix + "/+/+/config", prefix + "/+/+/+/config"}
}

// kept are the keys a registry entry's config keeps from an
// announcement: those Sortie reads (names, device blocks and the like
// are left out, for a registry a person can review).
var kept = func() map[string]bool {
	m := map[string]bool{"schema": true, "brightness": true, "color_temp": true, "modes": true}
	for _, long := range abbreviations {
		m[long] = true
	}
	for _, k := range []string{"unique_id", "device", "origin", "platform", "components"} {
		delete(m, k)
	}
	return m
}()

// DecodeDiscovery reads a discovery config published on topic under
// prefix and reports the entities Sortie can drive (a device config
// reports one per usable component). An entity of another component
// (a sensor) is no error and no report; one whose config Sortie cannot
// honour (an optimistic switch, a template beyond the subset) is an
// error that says why. An empty payload (a removed entity) reports
// nothing.
func DecodeDiscovery(prefix, topic string, payload []byte) ([]adapter.Found, error) {
	rest, ok := strings.CutPrefix(topic, prefix+"/")
	if !ok {
		return nil, nil
	}
	rest, ok = strings.CutSuffix(rest, "/config")
	if !ok || len(payload) == 0 {
		return nil, nil
	}
	if len(payload) > MaxPayload {
		return nil, fmt.Errorf("%d bytes (max %d)", len(payload), MaxPayload)
	}
	var raw map[string]any
	if err := json.Unmarshal(payload, &raw); err != nil {
		return nil, err
	}
	levels := strings.Split(rest, "/")
	if levels[0] == "device" && len(levels) == 2 {
		return decodeDevice(levels[1], raw)
	}
	if !slices.Contains(Components, levels[0]) {
		return nil, nil
	}
	if _, err := checkAddress(rest); err != nil {
		return nil, err
	}
	f, err := found(rest, raw)
	if err != nil {
		return nil, err
	}
	return []adapter.Found{f}, nil
}

// decodeDevice reads a device-based config: components under "cmps",
// sharing the device's topics and availability.
func decodeDevice(object string, raw map[string]any) ([]adapter.Found, error) {
	cmps, _ := raw["cmps"].(map[string]any)
	if cmps == nil {
		cmps, _ = raw["components"].(map[string]any)
	}
	var out []adapter.Found
	var errs []string
	for _, id := range slices.Sorted(maps.Keys(cmps)) {
		c, ok := cmps[id].(map[string]any)
		if !ok {
			continue
		}
		comp, _ := c["p"].(string)
		if comp == "" {
			comp, _ = c["platform"].(string)
		}
		if !slices.Contains(Components, comp) {
			continue
		}
		// Each is read on its own (its abbreviations, its "~"), then
		// takes the device's shared options it does not set itself.
		merged := Normalize(withBase(c, raw))
		root := Normalize(raw)
		for _, k := range append(sharedOptions, "device") { // its name and model, for people
			if v, ok := root[k]; ok {
				if _, own := merged[k]; !own {
					merged[k] = v
				}
			}
		}
		addr := comp + "/" + object + "/" + id
		if _, err := checkAddress(addr); err != nil {
			errs = append(errs, err.Error())
			continue
		}
		f, err := found(addr, merged)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", id, err))
			continue
		}
		out = append(out, f)
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return out, nil
}

// sharedOptions are the options a device-based config's components
// take from the device when they do not set them.
var sharedOptions = []string{"availability", "availability_topic", "availability_mode", "availability_template",
	"payload_available", "payload_not_available", "state_topic", "command_topic", "qos", "encoding"}

// withBase gives a component the device's "~" when it has none.
func withBase(c, device map[string]any) map[string]any {
	if _, own := c["~"]; own {
		return c
	}
	base, ok := device["~"]
	if !ok {
		return c
	}
	out := maps.Clone(c)
	out["~"] = base
	return out
}

// found makes the discovery of the entity at addr from its raw config.
func found(addr string, raw map[string]any) (adapter.Found, error) {
	comp := strings.Split(addr, "/")[0]
	cfg := Normalize(raw)
	e, err := parseEntity(addr, comp, cfg)
	if err != nil {
		return adapter.Found{}, err
	}
	f := adapter.Found{Protocol: Name, Address: addr, Keys: e.keys, Config: make(map[string]any)}
	for k, v := range cfg {
		if kept[k] {
			f.Config[k] = v
		}
	}
	name, _ := raw["name"].(string)
	dev, _ := cfg["device"].(map[string]any)
	if dev != nil {
		if n, _ := dev["name"].(string); n != "" {
			if name == "" {
				name = n
			} else if !strings.HasPrefix(name, n) {
				name = n + " " + name
			}
		}
		mf, _ := dev["mf"].(string)
		if mf == "" {
			mf, _ = dev["manufacturer"].(string)
		}
		mdl, _ := dev["mdl"].(string)
		if mdl == "" {
			mdl, _ = dev["model"].(string)
		}
		f.Model = strings.TrimSpace(mf + " " + mdl)
	}
	f.Name = name
	switch comp {
	case "switch":
		f.Kind = "relay"
	case "cover":
		f.Kind = "curtain"
	case "climate":
		f.Kind = "thermostat"
	default:
		f.Kind = comp
	}
	return f, nil
}

// CommandTopics are the topics an entity's config commands it on, for
// telling apart an announcement of a device another adapter speaks for
// (Zigbee2MQTT and ESPHome announce theirs too).
func CommandTopics(cfg map[string]any) []string {
	c := Normalize(cfg)
	var out []string
	for k, v := range c {
		if s, ok := v.(string); ok && s != "" && strings.HasSuffix(k, "command_topic") || k == "set_position_topic" {
			if s, ok := v.(string); ok {
				out = append(out, s)
			}
		}
	}
	slices.Sort(out)
	return out
}
