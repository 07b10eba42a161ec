package simulator

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/sortie-edge/sortie/devices/tasmota"
	"github.com/sortie-edge/sortie/internal/mqttc"
)

// TasmotaConfig is a simulated Tasmota device with the default FullTopic
// (%prefix%/%topic%/) and prefixes. Its wire behaviour follows
// Tasmota's (docs/devices.md has the sources):
//
//   - tele/<topic>/LWT is "Online", retained, at connect, and the
//     connection's will says "Offline", retained.
//   - At connect it publishes an empty cmnd/<topic>/POWER to itself (as
//     Tasmota does "to satisfy iobroker"), and answers it.
//   - A command on cmnd/<topic>/<Command> (case-insensitive) is answered
//     on stat/<topic>/RESULT, or stat/<topic>/<COMMAND> with SetOption4,
//     with a JSON echo of the new values; a power change also publishes
//     plain ON/OFF on stat/<topic>/POWER<n>. An empty payload queries.
//     An unknown command is answered {"Command":"Unknown"}.
//   - ShutterPosition<n> echoes {"ShutterPosition<n>":target}, then
//     reports {"Shutter<n>":{"Position","Direction","Target","Tilt"}}
//     every tenth of its travel until Direction is 0.
type TasmotaConfig struct {
	Conn
	// Topic is the device's %topic%, e.g. tasmota_1A2B3C.
	Topic string `toml:"topic"`
	// Kind is plug (Power), dimmer (Power, Dimmer), light (Power,
	// Dimmer, CT), or shutter (ShutterPosition1).
	Kind string `toml:"kind"`
	// SetOption4 answers on stat/<topic>/<COMMAND> instead of RESULT.
	SetOption4 bool `toml:"setoption4"`
	WiFiFaults
	// Power, Dimmer, CT, Position are the initial state.
	Power    bool         `toml:"power"`
	Dimmer   int          `toml:"dimmer"`
	CT       int          `toml:"ct"`
	Position int          `toml:"position"`
	Seed     uint64       `toml:"-"`
	Logger   *slog.Logger `toml:"-"`
}

// Tasmota is a running TasmotaConfig; safe for concurrent use.
type Tasmota struct {
	wifiDevice
	cfg TasmotaConfig
	s   tasmota.Settings

	// Under wifiDevice.mu:
	power   bool
	dimmer  int
	ct      int
	applied []string
}

func (c TasmotaConfig) check() error {
	switch {
	case c.Topic == "" || strings.ContainsAny(c.Topic, "/+# "):
		return fmt.Errorf("topic: %q is not a Tasmota topic", c.Topic)
	case c.Kind != "plug" && c.Kind != "dimmer" && c.Kind != "light" && c.Kind != "shutter":
		return fmt.Errorf("kind: %q is not plug, dimmer, light or shutter", c.Kind)
	}
	return c.WiFiFaults.check()
}

// StartTasmota connects the device and announces it.
func StartTasmota(ctx context.Context, cfg TasmotaConfig) (*Tasmota, error) {
	if err := cfg.check(); err != nil {
		return nil, fmt.Errorf("tasmota %s: %w", cfg.Topic, err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s, _ := tasmota.ParseSettings(nil) // the defaults always parse
	d := &Tasmota{cfg: cfg, s: s, power: cfg.Power, dimmer: cfg.Dimmer, ct: cfg.CT}
	d.faults, d.pos, d.rng = cfg.WiFiFaults, cfg.Position, rand.New(rand.NewPCG(cfg.Seed, 0x7a5))
	if d.ct == 0 {
		d.ct = 370
	}
	d.serve = d.answer
	err := d.start(ctx, mqttc.Options{
		Broker: cfg.Broker, ClientID: "DVES_" + strings.ToUpper(cfg.Topic), Username: cfg.Username, Password: cfg.Password,
		Will:      &mqttc.Will{Topic: s.Topic("tele", cfg.Topic, "LWT"), Payload: []byte("Offline"), QoS: 1, Retained: true},
		KeepAlive: 30 * time.Second, Ordered: true, Abortable: true,
		OnConnect: d.announce, Logger: cfg.Logger.With("tasmota", cfg.Topic),
	}, s.Topic("cmnd", cfg.Topic, "+"))
	if err != nil {
		return nil, err
	}
	return d, nil
}

func (d *Tasmota) announce() {
	d.client.PublishAsync(d.s.Topic("tele", d.cfg.Topic, "LWT"), []byte("Online"), true, 1)
	d.client.PublishAsync("tasmota/discovery/"+d.mac()+"/config", d.discoveryJSON(), true, 1)
	d.client.PublishAsync(d.s.Topic("cmnd", d.cfg.Topic, "POWER"), nil, false, 0)
}

func (d *Tasmota) publish(name string, payload []byte) {
	d.client.PublishAsync(d.s.Topic("stat", d.cfg.Topic, name), payload, false, 0)
}

// answer carries out one command and answers it, unless the answer is
// lost.
func (d *Tasmota) answer(topic string, payload []byte, resultLost bool) {
	name := topic[strings.LastIndexByte(topic, '/')+1:]
	arg := strings.TrimSpace(string(payload))
	upper := strings.ToUpper(name)
	d.mu.Lock()
	result, powerChanged := d.execute(upper, arg)
	power := d.power
	d.mu.Unlock()
	if resultLost {
		return
	}
	out := "RESULT"
	if d.cfg.SetOption4 {
		out = upper
	}
	d.publish(out, result)
	if powerChanged || (upper == "POWER" || upper == "POWER1") && arg == "" {
		d.publish("POWER", []byte(map[bool]string{true: "ON", false: "OFF"}[power]))
	}
}

// execute carries out one command. Caller holds mu.
func (d *Tasmota) execute(cmd, arg string) (result []byte, powerChanged bool) {
	light := d.cfg.Kind == "dimmer" || d.cfg.Kind == "light"
	state := func() []byte {
		m := map[string]any{"POWER": map[bool]string{true: "ON", false: "OFF"}[d.power]}
		if light {
			m["Dimmer"] = d.dimmer
		}
		if d.cfg.Kind == "light" {
			m["CT"] = d.ct
		}
		b, _ := json.Marshal(m)
		return b
	}
	setPower := func(on bool) {
		powerChanged = d.power != on
		d.power = on
	}
	switch {
	case (cmd == "POWER" || cmd == "POWER1") && d.cfg.Kind != "shutter":
		switch strings.ToUpper(arg) {
		case "":
		case "ON", "1":
			setPower(true)
		case "OFF", "0":
			setPower(false)
		case "TOGGLE", "2":
			setPower(!d.power)
		default:
			return state(), false // Tasmota ignores a value out of range and answers with what it has
		}
		if arg != "" {
			d.applied = append(d.applied, "Power "+strings.ToUpper(arg))
		}
		b, _ := json.Marshal(map[string]string{"POWER": map[bool]string{true: "ON", false: "OFF"}[d.power]})
		return b, powerChanged
	case cmd == "DIMMER" && light:
		if arg != "" {
			v, err := strconv.Atoi(arg)
			if err != nil || v < 0 || v > 100 {
				return state(), false // Tasmota ignores a value out of range and answers with what it has
			}
			d.dimmer = v
			setPower(v > 0) // Dimmer turns the light on (SetOption20 0)
			d.applied = append(d.applied, "Dimmer "+arg)
		}
		return state(), powerChanged
	case cmd == "CT" && d.cfg.Kind == "light":
		if arg != "" {
			v, err := strconv.Atoi(arg)
			if err != nil || v < 153 || v > 500 {
				return state(), false // Tasmota ignores a value out of range and answers with what it has
			}
			d.ct = v
			setPower(true)
			d.applied = append(d.applied, "CT "+arg)
		}
		return state(), powerChanged
	case cmd == "STATE":
		m := map[string]any{"Time": time.Now().UTC().Format("2006-01-02T15:04:05"), "Uptime": "0T00:10:00"}
		_ = json.Unmarshal(state(), &m) // our own encoding
		b, _ := json.Marshal(m)
		return b, false
	case cmd == "SHUTTERPOSITION1" && d.cfg.Kind == "shutter":
		if arg == "" {
			return d.shutterJSON(), false
		}
		v, err := strconv.Atoi(arg)
		if err != nil || v < 0 || v > 100 {
			return state(), false // Tasmota ignores a value out of range and answers with what it has
		}
		d.travelTo(v, func() map[string][]byte {
			return map[string][]byte{d.s.Topic("stat", d.cfg.Topic, "RESULT"): d.shutterJSON()}
		})
		d.applied = append(d.applied, "ShutterPosition1 "+arg)
		return fmt.Appendf(nil, `{"ShutterPosition1":%d}`, v), false
	case cmd == "STATUS" && arg == "10":
		return fmt.Appendf(nil, `{"StatusSNS":{"Time":%q,%s}}`, time.Now().UTC().Format("2006-01-02T15:04:05"), strings.Trim(string(d.shutterJSON()), "{}")), false
	}
	return []byte(`{"Command":"Unknown"}`), false
}

// shutterJSON is the shutter's report. Caller holds mu.
func (d *Tasmota) shutterJSON() []byte {
	pos, target, dir := d.moving()
	return fmt.Appendf(nil, `{"Shutter1":{"Position":%d,"Direction":%d,"Target":%d,"Tilt":0}}`, pos, dir, target)
}

// Power reports the relay.
func (d *Tasmota) Power() bool { d.mu.Lock(); defer d.mu.Unlock(); return d.power }

// Dimmer reports the dimmer level.
func (d *Tasmota) Dimmer() int { d.mu.Lock(); defer d.mu.Unlock(); return d.dimmer }

// Applied lists the commands that changed something, in order.
func (d *Tasmota) Applied() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.applied...)
}

// mac is the device's MAC, made from its topic.
func (d *Tasmota) mac() string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(d.cfg.Topic)) // a hash's Write does not fail
	return fmt.Sprintf("A4CF12%06X", h.Sum32()&0xffffff)
}

// discoveryJSON is Tasmota's own discovery config (xdrv_12_discovery):
// its topic, FullTopic, prefixes, relay types and light subtype.
func (d *Tasmota) discoveryJSON() []byte {
	rl := make([]int, 8)
	lt := 0
	switch d.cfg.Kind {
	case "plug":
		rl[0] = 1
	case "dimmer":
		rl[0], lt = 2, 1
	case "light":
		rl[0], lt = 2, 2
	case "shutter":
		rl[0], rl[1] = 3, 3
	}
	b, _ := json.Marshal(map[string]any{
		"ip": "192.0.2.10", "dn": "Tasmota " + d.cfg.Topic, "fn": []string{"Tasmota " + d.cfg.Topic}, "hn": d.cfg.Topic, "mac": d.mac(),
		"md": map[string]string{"plug": "Sonoff Basic", "dimmer": "Sonoff D1", "light": "Generic CT bulb", "shutter": "Shelly 2.5 (Tasmota)"}[d.cfg.Kind],
		"ty": 0, "if": 0, "ofln": "Offline", "onln": "Online", "state": []string{"OFF", "ON", "TOGGLE", "HOLD"}, "sw": "14.3.0",
		"t": d.cfg.Topic, "ft": "%prefix%/%topic%/", "tp": []string{"cmnd", "stat", "tele"}, "rl": rl, "swc": []int{-1, -1, -1, -1, -1, -1, -1, -1},
		"lk": 0, "lt_st": lt, "so": map[string]int{"4": map[bool]int{true: 1, false: 0}[d.cfg.SetOption4], "11": 0, "13": 0, "17": 0, "20": 0, "30": 0, "68": 0, "73": 0, "82": 0, "114": 0, "117": 0},
	}) // maps of strings, numbers and slices always encode
	return b
}
