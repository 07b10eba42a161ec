package simulator

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/sortie-edge/sortie/internal/mqttc"
)

// HAConfig is a simulated device of the kind people build or flash for
// Home Assistant (an ESP with hand-written firmware, a gateway like
// OpenMQTTGateway): it speaks its own topics and announces them through
// Home Assistant's MQTT discovery. Its wire behaviour follows the
// contract Home Assistant's MQTT integration documents for each
// platform, in the forms such devices commonly use:
//
//   - Availability on <name>/availability: "online", retained, at
//     connect; the will is "offline", retained.
//   - One discovery config per entity, retained, on
//     <prefix>/<type>/<name>/<object id>/config, with abbreviated keys
//     and a "~" base topic of <name>/<object id>.
//   - A switch takes ON or OFF on ~/set and reports {"POWER":"ON"} on
//     ~/state (value_template {{ value_json.POWER }}).
//   - A light (default schema) takes ON or OFF on ~/set and a brightness
//     0..255 on ~/brightness/set, and reports
//     {"state":"ON","brightness":128,"color_temp":370} on ~/state, read
//     by three templates.
//   - A lock takes LOCK or UNLOCK on ~/set and reports LOCKED, UNLOCKED,
//     or JAMMED when it cannot move, on ~/state.
//   - A cover takes {"position": N} on ~/position/set
//     (set_position_template), reports its position 0..100 on
//     ~/position while it travels and opening, closing or stopped on
//     ~/state.
//   - A climate unit takes a mode on ~/mode/set and a target on
//     ~/target/set, and reports them on ~/mode and ~/target.
//
// States are published retained at connect and after every command,
// changed or not (as most such firmware does); an unknown payload is
// ignored.
type HAConfig struct {
	Conn
	// Name is the device's name, its topic prefix.
	Name string `toml:"name"`
	// DiscoveryPrefix is where it announces itself ("homeassistant").
	DiscoveryPrefix string     `toml:"discovery_prefix"`
	Entities        []HAEntity `toml:"entity"`
	WiFiFaults
	Seed   uint64       `toml:"-"`
	Logger *slog.Logger `toml:"-"`
}

// HAEntity is one entity of a device, described as an ESPHome node's.
type HAEntity = ESPHomeEntity

// HADevice is a running HAConfig; safe for concurrent use.
type HADevice struct {
	wifiDevice
	cfg HAConfig

	// Under wifiDevice.mu: each entity's state by its object id.
	state   map[string]map[string]any
	applied []string
}

func (c HAConfig) check() error {
	if c.Name == "" || strings.ContainsAny(c.Name, "/+# ") {
		return fmt.Errorf("name: %q is not a topic level", c.Name)
	}
	if err := checkEntities(c.Entities); err != nil {
		return err
	}
	return c.WiFiFaults.check()
}

// StartHA connects the device.
func StartHA(ctx context.Context, cfg HAConfig) (*HADevice, error) {
	if err := cfg.check(); err != nil {
		return nil, fmt.Errorf("homeassistant %s: %w", cfg.Name, err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.DiscoveryPrefix == "" {
		cfg.DiscoveryPrefix = "homeassistant"
	}
	d := &HADevice{cfg: cfg, state: make(map[string]map[string]any)}
	d.faults, d.rng = cfg.WiFiFaults, rand.New(rand.NewPCG(cfg.Seed, 0x4a))
	for _, e := range cfg.Entities {
		d.state[e.ObjectID] = initialState(e.Type)
	}
	d.serve, d.retainStates = d.command, true
	err := d.start(ctx, mqttc.Options{
		Broker: cfg.Broker, ClientID: "ha-" + cfg.Name, Username: cfg.Username, Password: cfg.Password,
		Will:      &mqttc.Will{Topic: cfg.Name + "/availability", Payload: []byte("offline"), QoS: 1, Retained: true},
		KeepAlive: 15 * time.Second, Ordered: true, Abortable: true,
		OnConnect: d.announce, Logger: cfg.Logger.With("homeassistant", cfg.Name),
	}, cfg.Name+"/+/set", cfg.Name+"/+/+/set")
	if err != nil {
		return nil, err
	}
	return d, nil
}

func (d *HADevice) base(e HAEntity) string { return d.cfg.Name + "/" + e.ObjectID }

// announce publishes the availability, the discovery configs and every
// entity's state, retained.
func (d *HADevice) announce() {
	d.client.PublishAsync(d.cfg.Name+"/availability", []byte("online"), true, 1)
	for _, e := range d.cfg.Entities {
		d.client.PublishAsync(d.cfg.DiscoveryPrefix+"/"+e.Type+"/"+d.cfg.Name+"/"+e.ObjectID+"/config", d.discoveryJSON(e), true, 1)
	}
	for _, e := range d.cfg.Entities {
		d.mu.Lock()
		msgs := d.stateMessages(e)
		d.mu.Unlock()
		for t, p := range msgs {
			d.client.PublishAsync(t, p, true, 0)
		}
	}
}

// stateMessages are an entity's state topics and payloads. Caller holds mu.
func (d *HADevice) stateMessages(e HAEntity) map[string][]byte {
	b := d.base(e)
	st := d.state[e.ObjectID]
	switch e.Type {
	case "switch":
		j, _ := json.Marshal(map[string]any{"POWER": st["state"]})
		return map[string][]byte{b + "/state": j}
	case "light":
		j, _ := json.Marshal(map[string]any{"state": st["state"], "brightness": st["brightness"], "color_temp": st["color_temp"]})
		return map[string][]byte{b + "/state": j}
	case "cover":
		pos, _, dir := d.moving()
		state := map[int]string{1: "opening", -1: "closing", 0: "stopped"}[dir]
		return map[string][]byte{b + "/position": []byte(strconv.Itoa(pos)), b + "/state": []byte(state)}
	case "climate":
		return map[string][]byte{b + "/mode": []byte(fmt.Sprint(st["mode"])), b + "/target": []byte(strconv.FormatFloat(st["target"].(float64), 'f', 1, 64))}
	}
	return map[string][]byte{b + "/state": []byte(fmt.Sprint(st["state"]))}
}

// command applies a command and publishes the entity's states.
func (d *HADevice) command(topic string, payload []byte, answerLost bool) {
	for _, e := range d.cfg.Entities {
		rest, ok := strings.CutPrefix(topic, d.base(e)+"/")
		if !ok {
			continue
		}
		d.mu.Lock()
		applied := d.apply(e, strings.TrimSuffix(rest, "set"), string(payload))
		msgs := d.stateMessages(e)
		d.mu.Unlock()
		if !applied || answerLost {
			return
		}
		for t, p := range msgs {
			d.client.PublishAsync(t, p, true, 0)
		}
		return
	}
}

// apply changes an entity's state; cmd is "" or the sub-topic before
// /set ("brightness/", "position/", ...). Caller holds mu.
func (d *HADevice) apply(e HAEntity, cmd, arg string) bool {
	st := d.state[e.ObjectID]
	switch {
	case (e.Type == "switch" || e.Type == "light") && cmd == "" && (arg == "ON" || arg == "OFF"):
		st["state"] = arg
	case e.Type == "light" && cmd == "brightness/":
		v, err := strconv.Atoi(arg)
		if err != nil || v < 0 || v > 255 {
			return false
		}
		st["brightness"] = v
		if v > 0 {
			st["state"] = "ON" // a dimmer set to a level is on
		}
	case e.Type == "lock" && cmd == "" && (arg == "LOCK" || arg == "UNLOCK"):
		if e.Jammed {
			st["state"] = "JAMMED"
			break
		}
		st["state"] = arg + "ED"
	case e.Type == "cover" && cmd == "position/":
		var c struct {
			Position *int `json:"position"`
		}
		if json.Unmarshal([]byte(arg), &c) != nil || c.Position == nil || *c.Position < 0 || *c.Position > 100 {
			return false
		}
		d.travelTo(*c.Position, func() map[string][]byte { return d.stateMessages(e) })
	case e.Type == "climate" && cmd == "mode/":
		st["mode"] = arg
	case e.Type == "climate" && cmd == "target/":
		v, err := strconv.ParseFloat(arg, 64)
		if err != nil {
			return false
		}
		st["target"] = v
	default:
		return false
	}
	d.applied = append(d.applied, e.ObjectID+" "+cmd+"set "+arg)
	return true
}

// Applied lists the commands the device carried out.
func (d *HADevice) Applied() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.applied...)
}

// State returns an entity's state (by object id), in the device's terms.
func (d *HADevice) State(objectID string) map[string]any {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.state[objectID]
	if st == nil {
		return nil
	}
	out := make(map[string]any, len(st))
	for k, v := range st {
		out[k] = v
	}
	return out
}

// discoveryJSON is the entity's discovery config, as such firmware
// writes it: abbreviated keys under a "~" base.
func (d *HADevice) discoveryJSON(e HAEntity) []byte {
	c := map[string]any{
		"~": d.base(e), "name": strings.ReplaceAll(e.ObjectID, "_", " "), "uniq_id": d.cfg.Name + "_" + e.ObjectID,
		"avty_t": d.cfg.Name + "/availability",
		"dev":    map[string]any{"ids": []string{d.cfg.Name}, "name": d.cfg.Name, "mf": "DIY", "mdl": "ESP32 relay board"},
	}
	switch e.Type {
	case "switch":
		c["cmd_t"], c["stat_t"], c["val_tpl"] = "~/set", "~/state", "{{ value_json.POWER }}"
	case "light":
		c["cmd_t"], c["stat_t"], c["stat_val_tpl"] = "~/set", "~/state", "{{ value_json.state }}"
		c["bri_cmd_t"], c["bri_stat_t"], c["bri_val_tpl"] = "~/brightness/set", "~/state", "{{ value_json.brightness }}"
	case "lock":
		c["cmd_t"], c["stat_t"] = "~/set", "~/state"
	case "cover":
		c["set_pos_t"], c["set_pos_tpl"], c["pos_t"], c["stat_t"] = "~/position/set", `{"position": {{ position }}}`, "~/position", "~/state"
	case "climate":
		c["mode_cmd_t"], c["mode_stat_t"], c["modes"] = "~/mode/set", "~/mode", []string{"off", "heat", "auto"}
		c["temp_cmd_t"], c["temp_stat_t"] = "~/target/set", "~/target"
	}
	j, _ := json.Marshal(c) // strings, lists and maps of strings always encode
	return j
}
