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

// ESPHomeConfig is a simulated ESPHome node with the MQTT component.
// Its wire behaviour follows ESPHome's documentation and source
// (components/mqtt):
//
//   - The birth message <prefix>/status "online" is retained; the will
//     is "offline", retained.
//   - Each entity takes commands on <prefix>/<type>/<object id>/command
//     (a cover's position on .../position/command, a climate's mode and
//     target on .../mode/command and .../target_temperature/command),
//     and publishes its state, retained, on the matching .../state topic
//     at connect and whenever it changes; a command that changes nothing
//     publishes nothing. An unknown payload is ignored.
//   - A light takes and reports the JSON schema, brightness 0..255.
//   - A lock reports LOCKED, UNLOCKED, or JAMMED when it cannot move.
type ESPHomeConfig struct {
	Conn
	// Name is the node's name, its topic prefix.
	Name     string          `toml:"name"`
	Entities []ESPHomeEntity `toml:"entity"`
	WiFiFaults
	Seed   uint64       `toml:"-"`
	Logger *slog.Logger `toml:"-"`
}

// ESPHomeEntity is one entity of a node.
type ESPHomeEntity struct {
	// Type is switch, light, lock, cover or climate; ObjectID its
	// object id (snake_case).
	Type     string `toml:"type"`
	ObjectID string `toml:"object_id"`
	// Jammed locks cannot move.
	Jammed bool `toml:"jammed"`
}

// ESPHome is a running ESPHomeConfig; safe for concurrent use.
type ESPHome struct {
	wifiDevice
	cfg ESPHomeConfig

	// Under wifiDevice.mu: each entity's state by its base topic.
	state   map[string]map[string]any
	applied []string
}

func (c ESPHomeConfig) check() error {
	if c.Name == "" || strings.ContainsAny(c.Name, "+# ") {
		return fmt.Errorf("name: %q is not an ESPHome node name", c.Name)
	}
	if err := checkEntities(c.Entities); err != nil {
		return err
	}
	return c.WiFiFaults.check()
}

// checkEntities checks a node's entities (an ESPHome's, a Home
// Assistant device's).
func checkEntities(entities []ESPHomeEntity) error {
	covers := 0
	for _, e := range entities {
		switch e.Type {
		case "switch", "light", "lock", "climate":
		case "cover":
			covers++
		default:
			return fmt.Errorf("entity %s: type %q is not switch, light, lock, cover or climate", e.ObjectID, e.Type)
		}
		if e.ObjectID == "" || strings.ContainsAny(e.ObjectID, "/+# ") {
			return fmt.Errorf("entity: object_id %q", e.ObjectID)
		}
	}
	if covers > 1 {
		return fmt.Errorf("a simulated node has at most one cover, not %d", covers)
	}
	return nil
}

// initialState is an entity's state when a node starts, in ESPHome's
// terms (a Home Assistant device's are the same).
func initialState(typ string) map[string]any {
	switch typ {
	case "switch":
		return map[string]any{"state": "OFF"}
	case "light":
		return map[string]any{"state": "OFF", "brightness": 255, "color_temp": 370}
	case "lock":
		return map[string]any{"state": "LOCKED"}
	case "climate":
		return map[string]any{"mode": "heat", "target": 20.0}
	}
	return map[string]any{}
}

// StartESPHome connects the node.
func StartESPHome(ctx context.Context, cfg ESPHomeConfig) (*ESPHome, error) {
	if err := cfg.check(); err != nil {
		return nil, fmt.Errorf("esphome %s: %w", cfg.Name, err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	n := &ESPHome{cfg: cfg, state: make(map[string]map[string]any)}
	n.faults, n.rng = cfg.WiFiFaults, rand.New(rand.NewPCG(cfg.Seed, 0xe5))
	for _, e := range cfg.Entities {
		n.state[n.base(e)] = initialState(e.Type)
	}
	n.serve, n.retainStates = n.command, true
	err := n.start(ctx, mqttc.Options{
		Broker: cfg.Broker, ClientID: cfg.Name, Username: cfg.Username, Password: cfg.Password,
		Will:      &mqttc.Will{Topic: cfg.Name + "/status", Payload: []byte("offline"), QoS: 1, Retained: true},
		KeepAlive: 15 * time.Second, Ordered: true, Abortable: true,
		OnConnect: n.announce, Logger: cfg.Logger.With("esphome", cfg.Name),
	}, cfg.Name+"/+/+/command", cfg.Name+"/+/+/+/command")
	if err != nil {
		return nil, err
	}
	return n, nil
}

func (n *ESPHome) base(e ESPHomeEntity) string { return n.cfg.Name + "/" + e.Type + "/" + e.ObjectID }

// announce publishes the birth and every entity's state
// (send_initial_state), retained.
func (n *ESPHome) announce() {
	n.client.PublishAsync(n.cfg.Name+"/status", []byte("online"), true, 1)
	for _, e := range n.cfg.Entities {
		n.client.PublishAsync("homeassistant/"+e.Type+"/"+n.cfg.Name+"/"+e.ObjectID+"/config", n.discoveryJSON(e), true, 1)
	}
	for _, e := range n.cfg.Entities {
		n.mu.Lock()
		msgs := n.stateMessages(e)
		n.mu.Unlock()
		for t, p := range msgs {
			n.client.PublishAsync(t, p, true, 0)
		}
	}
}

// stateMessages are an entity's state topics and payloads. Caller holds mu.
func (n *ESPHome) stateMessages(e ESPHomeEntity) map[string][]byte {
	b := n.base(e)
	st := n.state[b]
	switch e.Type {
	case "light":
		j, _ := json.Marshal(map[string]any{"state": st["state"], "brightness": st["brightness"], "color_temp": st["color_temp"], "color_mode": "color_temp"})
		return map[string][]byte{b + "/state": j}
	case "cover":
		pos, _, dir := n.moving()
		state := map[int]string{1: "opening", -1: "closing", 0: "stopped"}[dir]
		return map[string][]byte{b + "/position/state": []byte(strconv.Itoa(pos)), b + "/state": []byte(state)}
	case "climate":
		return map[string][]byte{b + "/mode/state": []byte(fmt.Sprint(st["mode"])), b + "/target_temperature/state": []byte(strconv.FormatFloat(st["target"].(float64), 'f', 1, 64))}
	}
	return map[string][]byte{b + "/state": []byte(fmt.Sprint(st["state"]))}
}

// command applies a command and publishes the states it changed.
func (n *ESPHome) command(topic string, payload []byte, _ bool) {
	for _, e := range n.cfg.Entities {
		b := n.base(e)
		rest, ok := strings.CutPrefix(topic, b+"/")
		if !ok || !strings.HasSuffix(rest, "command") {
			continue
		}
		n.mu.Lock()
		before := n.stateMessages(e)
		n.apply(e, rest, string(payload))
		after := n.stateMessages(e)
		n.mu.Unlock()
		for t, p := range after {
			if string(before[t]) != string(p) {
				n.client.PublishAsync(t, p, true, 0)
			}
		}
		return
	}
}

// apply changes an entity's state. Caller holds mu.
func (n *ESPHome) apply(e ESPHomeEntity, cmd, arg string) {
	st := n.state[n.base(e)]
	switch {
	case e.Type == "switch" && cmd == "command" && (arg == "ON" || arg == "OFF"):
		st["state"] = arg
	case e.Type == "light" && cmd == "command":
		var c struct {
			State      string `json:"state"`
			Brightness *int   `json:"brightness"`
			ColorTemp  *int   `json:"color_temp"`
		}
		if json.Unmarshal([]byte(arg), &c) != nil {
			return // logged by the node, nothing else
		}
		if c.State == "ON" || c.State == "OFF" {
			st["state"] = c.State
		}
		if c.Brightness != nil {
			st["brightness"] = *c.Brightness
		}
		if c.ColorTemp != nil {
			st["color_temp"] = *c.ColorTemp
		}
	case e.Type == "lock" && cmd == "command" && (arg == "LOCK" || arg == "UNLOCK"):
		if e.Jammed {
			st["state"] = "JAMMED"
			return
		}
		st["state"] = arg + "ED"
	case e.Type == "cover" && cmd == "position/command":
		if v, err := strconv.Atoi(arg); err == nil && v >= 0 && v <= 100 {
			n.travelTo(v, func() map[string][]byte { return n.stateMessages(e) })
		}
	case e.Type == "climate" && cmd == "mode/command":
		st["mode"] = strings.ToLower(arg)
	case e.Type == "climate" && cmd == "target_temperature/command":
		if v, err := strconv.ParseFloat(arg, 64); err == nil {
			st["target"] = v
		}
	default:
		return
	}
	n.applied = append(n.applied, e.ObjectID+" "+cmd+" "+arg)
}

// Applied lists the commands the node carried out.
func (n *ESPHome) Applied() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.applied...)
}

// State returns an entity's state (by object id), in ESPHome's terms.
func (n *ESPHome) State(objectID string) map[string]any {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, e := range n.cfg.Entities {
		if e.ObjectID == objectID {
			out := map[string]any{}
			for k, v := range n.state[n.base(e)] {
				out[k] = v
			}
			return out
		}
	}
	return nil
}

// discoveryJSON is the Home Assistant discovery config ESPHome publishes
// for an entity (discovery: true, abbreviated keys).
func (n *ESPHome) discoveryJSON(e ESPHomeEntity) []byte {
	b := n.base(e)
	c := map[string]any{
		"name": strings.ReplaceAll(e.ObjectID, "_", " "), "uniq_id": "ESP" + e.Type + e.ObjectID, "avty_t": n.cfg.Name + "/status",
		"dev": map[string]any{"ids": n.cfg.Name, "name": n.cfg.Name, "sw": "esphome v2025.11.0", "mf": "espressif", "mdl": "esp32dev"},
	}
	switch e.Type {
	case "cover":
		c["cmd_t"], c["stat_t"], c["pos_t"], c["set_pos_t"] = b+"/command", b+"/state", b+"/position/state", b+"/position/command"
	case "climate":
		c["mode_cmd_t"], c["mode_stat_t"] = b+"/mode/command", b+"/mode/state"
		c["temp_cmd_t"], c["temp_stat_t"] = b+"/target_temperature/command", b+"/target_temperature/state"
	case "light":
		c["cmd_t"], c["stat_t"], c["schema"], c["brightness"] = b+"/command", b+"/state", "json", true
	default:
		c["cmd_t"], c["stat_t"] = b+"/command", b+"/state"
	}
	j, _ := json.Marshal(c) // strings and maps of strings always encode
	return j
}
