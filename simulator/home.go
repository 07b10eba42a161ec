package simulator

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/BurntSushi/toml"

	"github.com/sortie-edge/sortie/devices/wire"
)

// HomeConfig describes a simulated home. Its TOML form is documented in
// configs/home.toml.
type HomeConfig struct {
	// Broker is the MQTT broker URL (tcp://host:port). It may be empty in
	// a file when the caller supplies it, as cmd/sim does.
	Broker string `toml:"broker"`
	// Prefix is the topic prefix; default wire.DefaultPrefix.
	Prefix string `toml:"prefix"`
	// Seed makes every fault reproducible: each device draws from sources
	// derived from Seed and its ID. Any value is fine (TOML integers are
	// signed, hence int64).
	Seed int64 `toml:"seed"`
	// Devices are the home's devices.
	Devices []DeviceConfig `toml:"device"`
	// Bridges are shared radios in front of some devices.
	Bridges []BridgeConfig `toml:"bridge"`
	// Zigbee2MQTT are simulated Zigbee2MQTT bridges and their devices,
	// which speak Zigbee2MQTT's MQTT API rather than Sortie's.
	Zigbee2MQTT []Z2MConfig `toml:"zigbee2mqtt"`
	// Tasmota are simulated Tasmota devices, each its own MQTT client.
	Tasmota []TasmotaConfig `toml:"tasmota"`
	// Shelly are simulated Shelly Gen2+ devices (RPC over MQTT).
	Shelly []ShellyConfig `toml:"shelly"`
	// ESPHome are simulated ESPHome nodes with the MQTT component.
	ESPHome []ESPHomeConfig `toml:"esphome"`
	// HomeAssistant are simulated devices that announce themselves
	// through Home Assistant's MQTT discovery.
	HomeAssistant []HAConfig `toml:"homeassistant"`

	// Username and Password log every device in, for a broker that
	// wants them.
	Username string `toml:"-"`
	Password string `toml:"-"`
	// TLS is the devices' TLS setup for an ssl:// broker.
	TLS *tls.Config `toml:"-"`

	// Logger receives one line per command and connection event; nil
	// discards them.
	Logger *slog.Logger `toml:"-"`
}

// DeviceConfig describes one device of a home.
type DeviceConfig struct {
	// ID names the device in topics; see wire.ValidateDeviceID.
	ID string `toml:"id"`
	// Type is one of Types().
	Type string `toml:"type"`
	// Travel is a curtain's full travel time (0 to 100); zero moves
	// instantly. Only curtains travel.
	Travel time.Duration `toml:"travel"`
	// State overrides the type's initial state; only settable keys (the
	// params of the type's "set" action) are allowed.
	State map[string]any `toml:"state"`
	// Faults are the device's faults at start.
	Faults Faults `toml:"faults"`
	// Bridge names the bridge its commands come through, if any.
	Bridge string `toml:"bridge"`
}

// check validates the device and returns its initial state in the form
// the device keeps it.
func (c DeviceConfig) check() (map[string]any, error) {
	bad := func(field string, err error) error {
		return &ConfigError{Device: c.ID, Field: field, Err: err}
	}
	if err := wire.ValidateDeviceID(c.ID); err != nil {
		return nil, bad("id", err)
	}
	m, ok := catalogue[c.Type]
	if !ok {
		return nil, bad("type", fmt.Errorf("unknown type %q (want one of %s)", c.Type, strings.Join(Types(), ", ")))
	}
	if c.Travel < 0 {
		return nil, bad("travel", fmt.Errorf("must not be negative, got %v", c.Travel))
	}
	if c.Travel > 0 && !m.travels {
		return nil, bad("travel", fmt.Errorf("only a curtain travels, this is a %s", c.Type))
	}
	if err := c.Faults.Validate(c.Type); err != nil {
		var ce *ConfigError
		if errors.As(err, &ce) {
			ce.Device = c.ID
		}
		return nil, err
	}
	// State arrives as TOML values; give it the JSON shape of command
	// params so the same checks apply (25.0 is an integer, "25" is not).
	raw, err := json.Marshal(c.State)
	if err != nil {
		return nil, bad("state", err)
	}
	var st map[string]any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&st); err != nil {
		return nil, bad("state", err)
	}
	st, err = m.checkState(st)
	if err != nil {
		return nil, bad("state", err)
	}
	return st, nil
}

// Validate checks the whole config and returns a *ConfigError naming the
// first bad field.
func (c *HomeConfig) Validate() error {
	if c.Broker != "" {
		if err := checkBrokerURL(c.Broker); err != nil {
			return &ConfigError{Field: "broker", Err: err}
		}
	}
	if err := checkPrefix(c.Prefix); err != nil {
		return &ConfigError{Field: "prefix", Err: err}
	}
	if len(c.Devices) == 0 && len(c.Zigbee2MQTT) == 0 && len(c.Tasmota) == 0 && len(c.Shelly) == 0 && len(c.ESPHome) == 0 && len(c.HomeAssistant) == 0 {
		return &ConfigError{Field: "device", Err: errors.New("a home needs at least one [[device]], [[zigbee2mqtt]] bridge, [[tasmota]], [[shelly]], [[esphome]] or [[homeassistant]] node")}
	}
	nodes := make(map[string]bool)
	for i, ec := range c.ESPHome {
		if err := ec.check(); err != nil {
			return &ConfigError{Field: fmt.Sprintf("esphome[%d]", i), Err: err}
		}
		if nodes[ec.Name] {
			return &ConfigError{Field: fmt.Sprintf("esphome[%d].name", i), Err: fmt.Errorf("%q is another node's", ec.Name)}
		}
		nodes[ec.Name] = true
	}
	for i, hc := range c.HomeAssistant {
		if err := hc.check(); err != nil {
			return &ConfigError{Field: fmt.Sprintf("homeassistant[%d]", i), Err: err}
		}
		if nodes[hc.Name] {
			return &ConfigError{Field: fmt.Sprintf("homeassistant[%d].name", i), Err: fmt.Errorf("%q is another node's", hc.Name)}
		}
		nodes[hc.Name] = true
	}
	shellys := make(map[string]bool)
	for i, sc := range c.Shelly {
		if err := sc.check(); err != nil {
			return &ConfigError{Field: fmt.Sprintf("shelly[%d]", i), Err: err}
		}
		if shellys[sc.ID] {
			return &ConfigError{Field: fmt.Sprintf("shelly[%d].id", i), Err: fmt.Errorf("%q is another device's", sc.ID)}
		}
		shellys[sc.ID] = true
	}
	tasmotas := make(map[string]bool)
	for i, tc := range c.Tasmota {
		if err := tc.check(); err != nil {
			return &ConfigError{Field: fmt.Sprintf("tasmota[%d]", i), Err: err}
		}
		if tasmotas[tc.Topic] {
			return &ConfigError{Field: fmt.Sprintf("tasmota[%d].topic", i), Err: fmt.Errorf("%q is another device's", tc.Topic)}
		}
		tasmotas[tc.Topic] = true
	}
	z2mIDs := make(map[string]bool)
	for i, z := range c.Zigbee2MQTT {
		if err := z.check(); err != nil {
			return &ConfigError{Field: fmt.Sprintf("zigbee2mqtt[%d]", i), Err: err}
		}
		id := z.clientID()
		if z2mIDs[id] {
			return &ConfigError{Field: fmt.Sprintf("zigbee2mqtt[%d].client_id", i), Err: fmt.Errorf("%q is another bridge's", id)}
		}
		z2mIDs[id] = true
	}
	bridges := make(map[string]bool, len(c.Bridges))
	for _, b := range c.Bridges {
		if err := b.check(); err != nil {
			return err
		}
		if bridges[b.ID] {
			return &ConfigError{Field: "bridge." + b.ID, Err: errors.New("duplicate bridge id")}
		}
		bridges[b.ID] = true
	}
	seen := make(map[string]bool, len(c.Devices))
	for i, d := range c.Devices {
		if d.Bridge != "" && !bridges[d.Bridge] {
			return &ConfigError{Device: d.ID, Field: "bridge", Err: fmt.Errorf("no [[bridge]] with id %q", d.Bridge)}
		}
		if _, err := d.check(); err != nil {
			var ce *ConfigError
			if errors.As(err, &ce) && ce.Device == "" {
				ce.Field = fmt.Sprintf("device[%d].%s", i, ce.Field)
			}
			return err
		}
		if seen[d.ID] {
			return &ConfigError{Device: d.ID, Field: "id", Err: errors.New("duplicate device id")}
		}
		seen[d.ID] = true
	}
	return nil
}

func checkBrokerURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	switch u.Scheme {
	case "tcp", "mqtt", "ssl", "tls", "mqtts", "tcps":
	default:
		return fmt.Errorf("scheme of %q must be tcp, mqtt, ssl, tls, mqtts or tcps", s)
	}
	if u.Host == "" {
		return fmt.Errorf("%q has no host:port", s)
	}
	return nil
}

func checkPrefix(p string) error {
	if p == "" {
		return nil
	}
	if strings.HasPrefix(p, "/") || strings.HasSuffix(p, "/") || strings.Contains(p, "//") {
		return fmt.Errorf("%q has an empty topic level", p)
	}
	for _, r := range p {
		if r == '+' || r == '#' || unicode.IsControl(r) || r == unicode.ReplacementChar {
			return fmt.Errorf("%q contains %q", p, r)
		}
	}
	return nil
}

// ParseHome decodes and validates a home config. name is used in errors,
// typically the file's path. Unknown keys are rejected: a misspelt fault
// would otherwise silently leave a device healthy.
func ParseHome(name string, data []byte) (HomeConfig, error) {
	var cfg HomeConfig
	md, err := toml.NewDecoder(bytes.NewReader(data)).Decode(&cfg)
	if err != nil {
		return HomeConfig{}, &ConfigError{File: name, Err: err}
	}
	if undec := md.Undecoded(); len(undec) > 0 {
		var raw map[string]any
		_, _ = toml.Decode(string(data), &raw)
		return HomeConfig{}, &ConfigError{File: name, Device: deviceWithKey(raw, undec[0]), Field: undec[0].String(),
			Err: errors.New("unknown key")}
	}
	if err := cfg.Validate(); err != nil {
		var ce *ConfigError
		if errors.As(err, &ce) {
			ce.File = name
		}
		return HomeConfig{}, err
	}
	return cfg, nil
}

// deviceWithKey finds the ID of the [[device]] table holding an unknown
// key, which the TOML decoder reports without an index.
func deviceWithKey(raw map[string]any, key toml.Key) string {
	if len(key) < 2 || key[0] != "device" {
		return ""
	}
	tables, _ := raw["device"].([]map[string]any)
	for _, t := range tables {
		var v any = t
		for _, k := range key[1:] {
			m, ok := v.(map[string]any)
			if !ok {
				v = nil
				break
			}
			v, ok = m[k]
			if !ok {
				break
			}
		}
		if v != nil {
			id, _ := t["id"].(string)
			return id
		}
	}
	return ""
}

// LoadHome reads and parses a home config file.
func LoadHome(path string) (HomeConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return HomeConfig{}, fmt.Errorf("load home: %w", err)
	}
	return ParseHome(path, data)
}

// Home is a running simulated home: a set of devices, each with its own
// MQTT connection. Its methods are safe for concurrent use.
type Home struct {
	cfg  HomeConfig
	devs []*Device
	z2m  []*Zigbee2MQTT
	tas  []*Tasmota
	shl  []*Shelly
	esp  []*ESPHome
	ha   []*HADevice
	byID map[string]*Device
	log  *slog.Logger

	mu      sync.Mutex
	started bool
	closed  bool
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// NewHome builds a home from a config; it connects nothing until Start.
func NewHome(cfg HomeConfig) (*Home, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Broker == "" {
		return nil, &ConfigError{Field: "broker", Err: errors.New("no broker URL")}
	}
	if cfg.Prefix == "" {
		cfg.Prefix = wire.DefaultPrefix
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	h := &Home{cfg: cfg, byID: make(map[string]*Device, len(cfg.Devices)), log: log}
	topics := wire.Topics{Prefix: cfg.Prefix}
	bridges := make(map[string]*bridge, len(cfg.Bridges))
	for _, b := range cfg.Bridges {
		bridges[b.ID] = &bridge{cfg: b}
	}
	for _, dc := range cfg.Devices {
		st, err := dc.check()
		if err != nil {
			return nil, err
		}
		d := newDevice(dc, st, uint64(cfg.Seed), topics, cfg.Broker, cfg.Prefix+"-sim-"+dc.ID, log)
		d.username, d.password, d.tls = cfg.Username, cfg.Password, cfg.TLS
		d.bridge = bridges[dc.Bridge]
		h.devs = append(h.devs, d)
		h.byID[d.id] = d
	}
	return h, nil
}

// Start connects every device and returns once all are online, or with
// an error when ctx ends first; the devices keep trying in the background
// until Close either way. ctx bounds only the wait, not the home's life.
func (h *Home) Start(ctx context.Context) error {
	h.mu.Lock()
	switch {
	case h.closed:
		h.mu.Unlock()
		return ErrClosed
	case h.started:
		h.mu.Unlock()
		return errors.New("home already started")
	}
	h.started = true
	runCtx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	for _, d := range h.devs {
		h.wg.Go(func() { d.run(runCtx) })
		h.wg.Go(func() { d.work(runCtx, &h.wg) })
	}
	h.mu.Unlock()
	h.log.Info("home starting", "broker", h.cfg.Broker, "prefix", h.cfg.Prefix, "devices", len(h.devs), "seed", h.cfg.Seed)
	for _, d := range h.devs {
		if f := d.Faults(); f != (Faults{}) {
			d.log.Info("faults", "faults", f)
		}
	}
	for i, zc := range h.cfg.Zigbee2MQTT {
		zc.Broker, zc.Username, zc.Password, zc.Logger = h.cfg.Broker, h.cfg.Username, h.cfg.Password, h.log
		zc.Seed = uint64(h.cfg.Seed) + uint64(i)
		z, err := StartZigbee2MQTT(ctx, zc)
		if err != nil {
			return fmt.Errorf("start home: zigbee2mqtt bridge %s: %w", zc.clientID(), err)
		}
		h.mu.Lock()
		h.z2m = append(h.z2m, z)
		h.mu.Unlock()
	}
	for i, tc := range h.cfg.Tasmota {
		tc.Broker, tc.Username, tc.Password, tc.Logger = h.cfg.Broker, h.cfg.Username, h.cfg.Password, h.log
		tc.Seed = uint64(h.cfg.Seed) + 1000 + uint64(i)
		d, err := StartTasmota(ctx, tc)
		if err != nil {
			return fmt.Errorf("start home: tasmota %s: %w", tc.Topic, err)
		}
		h.mu.Lock()
		h.tas = append(h.tas, d)
		h.mu.Unlock()
	}
	for i, sc := range h.cfg.Shelly {
		sc.Broker, sc.Username, sc.Password, sc.Logger = h.cfg.Broker, h.cfg.Username, h.cfg.Password, h.log
		sc.Seed = uint64(h.cfg.Seed) + 2000 + uint64(i)
		d, err := StartShelly(ctx, sc)
		if err != nil {
			return fmt.Errorf("start home: shelly %s: %w", sc.ID, err)
		}
		h.mu.Lock()
		h.shl = append(h.shl, d)
		h.mu.Unlock()
	}
	for i, ec := range h.cfg.ESPHome {
		ec.Broker, ec.Username, ec.Password, ec.Logger = h.cfg.Broker, h.cfg.Username, h.cfg.Password, h.log
		ec.Seed = uint64(h.cfg.Seed) + 3000 + uint64(i)
		n, err := StartESPHome(ctx, ec)
		if err != nil {
			return fmt.Errorf("start home: esphome %s: %w", ec.Name, err)
		}
		h.mu.Lock()
		h.esp = append(h.esp, n)
		h.mu.Unlock()
	}
	for i, hc := range h.cfg.HomeAssistant {
		hc.Broker, hc.Username, hc.Password, hc.Logger = h.cfg.Broker, h.cfg.Username, h.cfg.Password, h.log
		hc.Seed = uint64(h.cfg.Seed) + 4000 + uint64(i)
		d, err := StartHA(ctx, hc)
		if err != nil {
			return fmt.Errorf("start home: homeassistant %s: %w", hc.Name, err)
		}
		h.mu.Lock()
		h.ha = append(h.ha, d)
		h.mu.Unlock()
	}
	for _, d := range h.devs {
		if err := d.WaitOnline(ctx); err != nil {
			return fmt.Errorf("start home: %w", err)
		}
	}
	h.log.Info("home online")
	return nil
}

// Close takes every device offline (announcing "offline" and
// disconnecting cleanly) and waits for the devices' goroutines. It is
// safe to call more than once.
func (h *Home) Close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	cancel := h.cancel
	z2m, tas, shl, esp, ha := h.z2m, h.tas, h.shl, h.esp, h.ha
	h.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	for _, z := range z2m {
		z.Close()
	}
	for _, d := range tas {
		d.Close()
	}
	for _, d := range shl {
		d.Close()
	}
	for _, n := range esp {
		n.Close()
	}
	for _, d := range ha {
		d.Close()
	}
	h.wg.Wait()
	return nil
}

// Zigbee2MQTTBridges returns the home's running Zigbee2MQTT bridges, in
// config order.
func (h *Home) Zigbee2MQTTBridges() []*Zigbee2MQTT {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.z2m)
}

// TasmotaDevices returns the home's running Tasmota devices, in config
// order.
func (h *Home) TasmotaDevices() []*Tasmota {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.tas)
}

// ShellyDevices returns the home's running Shelly devices, in config
// order.
func (h *Home) ShellyDevices() []*Shelly {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.shl)
}

// HADevices returns the home's running Home Assistant MQTT devices, in
// config order.
func (h *Home) HADevices() []*HADevice {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.ha)
}

// Device returns the device with the given ID, or nil.
func (h *Home) Device(id string) *Device { return h.byID[id] }

// Devices returns the home's devices in config order.
func (h *Home) Devices() []*Device { return slices.Clone(h.devs) }

// Prefix is the topic prefix the devices use.
func (h *Home) Prefix() string { return h.cfg.Prefix }

// Broker is the broker URL the devices connect to.
func (h *Home) Broker() string { return h.cfg.Broker }

// SetFaults sets the faults of the device with the given ID.
func (h *Home) SetFaults(id string, f Faults) error {
	d := h.byID[id]
	if d == nil {
		return fmt.Errorf("%w: %q", ErrUnknownDevice, id)
	}
	return d.SetFaults(f)
}
