package simulator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sortie-edge/sortie/devices/zigbee2mqtt"
	"github.com/sortie-edge/sortie/internal/mqttc"
)

// Z2MConfig is a simulated Zigbee2MQTT bridge: one MQTT client, as the
// real bridge is, in front of Zigbee devices that it commands through a
// coordinator working on a few commands at once. Its wire behaviour
// follows Zigbee2MQTT's own (docs/devices.md has the sources):
//
//   - <base>/bridge/state is {"state":"online"} (2.x) or "online" (1.x),
//     retained, and the connection's will says "offline" the same way.
//   - A set on <base>/<name>/set is queued for the coordinator; once the
//     device answered (Delay later) the bridge publishes the device's
//     whole cached state on <base>/<name>, not retained unless Retain.
//   - A device that does not answer (Unreachable, a lost frame) gives,
//     Timeout later, an error on <base>/bridge/logging: "Publish 'set'
//     'state' to '<name>' failed: …" (and on 1.x also the legacy
//     <base>/bridge/log), and no state publish. A log payload identical to
//     the one before is not published again, as Zigbee2MQTT does.
//   - A get on <base>/<name>/get publishes the state the same way.
//   - With Availability, <base>/<name>/availability is published,
//     retained, as the device comes and goes.
type Z2MConfig struct {
	// Broker is the MQTT broker's URL (a home's, in a home config);
	// ClientID defaults to "zigbee2mqtt".
	Broker             string `toml:"-"`
	ClientID           string `toml:"client_id"`
	Username, Password string `toml:"-"`
	// Base is mqtt.base_topic; "" means zigbee2mqtt.
	Base string `toml:"base_topic"`
	// Version is 1 or 2 (default): the availability payloads' form, and
	// whether bridge/log is published.
	Version int `toml:"version"`
	// Availability enables the per-device availability topics (off by
	// default in Zigbee2MQTT).
	Availability bool `toml:"availability"`
	// Retain publishes device states retained (the device option retain).
	Retain bool `toml:"retain"`
	// Queue is how many commands the coordinator works on at once
	// (default 4); the others wait their turn, in order.
	Queue int `toml:"queue"`
	// Timeout is how long the bridge waits for a device that does not
	// answer before it logs the failure (zigbee-herdsman's 10 s default).
	Timeout time.Duration `toml:"timeout"`
	// Seed drives the random faults.
	Seed uint64 `toml:"-"`
	// OnSet, when set, is called with a device's name for each set the
	// bridge receives (before its delay), for tests that act at that
	// moment. It must not block.
	OnSet   func(name string) `toml:"-"`
	Devices []Z2MDevice       `toml:"device"`
	Logger  *slog.Logger      `toml:"-"`
}

// Z2MDevice is one Zigbee device behind the bridge.
type Z2MDevice struct {
	// Name is its friendly name (it may contain '/').
	Name string `toml:"name"`
	// Kind is light, switch, lock, cover or thermostat.
	Kind string `toml:"kind"`
	// State overrides the kind's initial state, in Zigbee2MQTT's terms
	// ({"state":"ON","brightness":254}).
	State map[string]any `toml:"state"`
	// Delay (plus up to Jitter) is the radio round trip of a command.
	Delay  time.Duration `toml:"delay"`
	Jitter time.Duration `toml:"jitter"`
	// Loss is the chance that a command's frame is lost: the device does
	// nothing and the bridge logs a timeout.
	Loss float64 `toml:"loss"`
	// StateLoss is the chance that the device applies a command but the
	// bridge's state publish is lost (QoS 0 on a bad Wi-Fi link).
	StateLoss float64 `toml:"state_loss"`
	// Unreachable devices answer nothing; with Availability they show
	// offline.
	Unreachable bool `toml:"unreachable"`
	// Jammed locks refuse to move (the ZCL answer is FAILURE).
	Jammed bool `toml:"jammed"`
	// Travel is a cover's full travel time; it reports its position
	// every tenth of it while moving.
	Travel time.Duration `toml:"travel"`
	// Optimistic publishes a cover's target position as soon as the
	// command is accepted, as Zigbee2MQTT does by default; the cover's
	// own reports follow as it moves. Lights, switches and locks are
	// always optimistic, as in Zigbee2MQTT.
	Optimistic bool `toml:"optimistic"`
}

// Z2MApplied is a command a simulated Zigbee device carried out.
type Z2MApplied struct {
	Device string
	Set    map[string]any // what the command changed, in Zigbee2MQTT's terms
	At     time.Time
}

// Zigbee2MQTT is a running Z2MConfig. Its methods are safe for
// concurrent use.
type Zigbee2MQTT struct {
	cfg    Z2MConfig
	log    *slog.Logger
	client *mqttc.Client
	slots  chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	devs    map[string]*z2mDev
	applied []Z2MApplied
	lastLog string
	rng     *rand.Rand
	sets    int // set commands received
}

type z2mDev struct {
	cfg   Z2MDevice
	state map[string]any
	move  *move
}

var z2mKinds = map[string]map[string]any{
	"light":      {"state": "OFF", "brightness": 254.0, "color_temp": 370.0},
	"switch":     {"state": "OFF"},
	"lock":       {"state": "LOCK", "lock_state": "locked"},
	"cover":      {"state": "CLOSE", "position": 0.0},
	"thermostat": {"system_mode": "heat", "occupied_heating_setpoint": 20.0, "local_temperature": 19.5},
}

func (c Z2MConfig) clientID() string {
	if c.ClientID == "" {
		return "zigbee2mqtt"
	}
	return c.ClientID
}

// check validates the bridge's config.
func (c Z2MConfig) check() error {
	switch {
	case c.Version != 0 && c.Version != 1 && c.Version != 2:
		return fmt.Errorf("version: %d is not 1 or 2", c.Version)
	case c.Queue < 0:
		return fmt.Errorf("queue: %d is negative", c.Queue)
	case c.Timeout < 0:
		return fmt.Errorf("timeout: %v is negative", c.Timeout)
	case len(c.Devices) == 0:
		return errors.New("device: a bridge needs at least one device")
	}
	seen := make(map[string]bool)
	for _, d := range c.Devices {
		if _, ok := z2mKinds[d.Kind]; !ok {
			return fmt.Errorf("device %q: kind %q is not light, switch, lock, cover or thermostat", d.Name, d.Kind)
		}
		if d.Name == "" || seen[d.Name] || strings.ContainsAny(d.Name, "+#") || strings.HasSuffix(d.Name, "/set") || strings.HasSuffix(d.Name, "/get") {
			return fmt.Errorf("device %q: empty, repeated, or not a friendly name Zigbee2MQTT takes", d.Name)
		}
		seen[d.Name] = true
		for _, p := range []float64{d.Loss, d.StateLoss} {
			if p < 0 || p > 1 {
				return fmt.Errorf("device %q: loss and state_loss are probabilities 0..1", d.Name)
			}
		}
		if d.Delay < 0 || d.Jitter < 0 || d.Travel < 0 {
			return fmt.Errorf("device %q: delay, jitter and travel must not be negative", d.Name)
		}
	}
	return nil
}

// StartZigbee2MQTT connects the bridge and announces it and its devices.
func StartZigbee2MQTT(ctx context.Context, cfg Z2MConfig) (*Zigbee2MQTT, error) {
	if err := cfg.check(); err != nil {
		return nil, fmt.Errorf("zigbee2mqtt bridge: %w", err)
	}
	if cfg.Base == "" {
		cfg.Base = zigbee2mqtt.DefaultBase
	}
	if cfg.ClientID == "" {
		cfg.ClientID = "zigbee2mqtt"
	}
	if cfg.Version == 0 {
		cfg.Version = 2
	}
	if cfg.Queue <= 0 {
		cfg.Queue = 4
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	z := &Zigbee2MQTT{
		cfg: cfg, log: cfg.Logger.With("bridge", cfg.ClientID), slots: make(chan struct{}, cfg.Queue),
		devs: make(map[string]*z2mDev), rng: rand.New(rand.NewPCG(cfg.Seed, 0x2b2)),
	}
	for _, d := range cfg.Devices {
		if err := z.add(d); err != nil {
			return nil, err
		}
	}
	z.ctx, z.cancel = context.WithCancel(context.WithoutCancel(ctx))
	c, err := mqttc.New(mqttc.Options{
		Broker: cfg.Broker, ClientID: cfg.ClientID, Username: cfg.Username, Password: cfg.Password,
		Will:      &mqttc.Will{Topic: cfg.Base + "/bridge/state", Payload: z.availability(false), QoS: 1, Retained: true},
		KeepAlive: 15 * time.Second, Ordered: true, Abortable: true,
		OnConnect: z.announce,
		Logger:    z.log,
	})
	if err != nil {
		return nil, err
	}
	z.client = c
	if err := subscribeAndConnect(ctx, c, z.onMessage, cfg.Base+"/#"); err != nil {
		return nil, err
	}
	return z, nil
}

func (z *Zigbee2MQTT) availability(online bool) []byte {
	s := map[bool]string{true: "online", false: "offline"}[online]
	if z.cfg.Version == 1 {
		return []byte(s)
	}
	return []byte(`{"state":"` + s + `"}`)
}

// add puts a device on the network. Caller holds mu, or z is not
// running yet.
func (z *Zigbee2MQTT) add(d Z2MDevice) error {
	init, ok := z2mKinds[d.Kind]
	if !ok {
		return fmt.Errorf("zigbee2mqtt device %q: kind %q is not light, switch, lock, cover or thermostat", d.Name, d.Kind)
	}
	if _, dup := z.devs[d.Name]; dup || d.Name == "" || strings.HasPrefix(d.Name, "bridge/") {
		return fmt.Errorf("zigbee2mqtt device %q: empty, reserved or repeated name", d.Name)
	}
	st := maps.Clone(init)
	for k, v := range d.State {
		if f, ok := asNumber(v); ok {
			v = f
		}
		st[k] = v
	}
	if d.Kind == "cover" && d.Travel > 0 {
		st["moving"] = "STOP"
	}
	z.devs[d.Name] = &z2mDev{cfg: d, state: st}
	return nil
}

// Pair joins a device to the network as Zigbee2MQTT reports it: a
// device_joined event on bridge/event, then, its interview done, the new
// bridge/devices (retained) and its state.
func (z *Zigbee2MQTT) Pair(d Z2MDevice) error {
	z.mu.Lock()
	defer z.mu.Unlock() // publishes are queued in order: no stale list after a concurrent Remove
	if err := z.add(d); err != nil {
		return err
	}
	ev, _ := json.Marshal(map[string]any{"type": "device_joined", "data": map[string]any{"friendly_name": d.Name, "ieee_address": ieee(d.Name)}})
	z.publish(z.cfg.Base+"/bridge/event", ev, false)
	z.publish(z.cfg.Base+"/bridge/devices", z.devicesJSONLocked(), true)
	st, _ := json.Marshal(z.devs[d.Name].state)
	z.publish(z.cfg.Base+"/"+d.Name, st, z.cfg.Retain)
	return nil
}

// Remove takes a device off the network (bridge/request/device/remove,
// or the device leaving): a device_leave event, the new bridge/devices,
// and its retained availability cleared, as Zigbee2MQTT does.
func (z *Zigbee2MQTT) Remove(name string) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if _, ok := z.devs[name]; !ok {
		return
	}
	delete(z.devs, name)
	ev, _ := json.Marshal(map[string]any{"type": "device_leave", "data": map[string]any{"friendly_name": name, "ieee_address": ieee(name)}})
	z.publish(z.cfg.Base+"/bridge/event", ev, false)
	z.publish(z.cfg.Base+"/bridge/devices", z.devicesJSONLocked(), true)
	if z.cfg.Availability {
		z.publish(z.cfg.Base+"/"+name+"/availability", nil, true)
	}
}

// ieee is a device's IEEE address, made from its name so that it stays
// the same while devices come and go.
func ieee(name string) string {
	h := fnv.New64a()
	h.Write([]byte(name))
	return fmt.Sprintf("0x%016x", h.Sum64())
}

// announce runs after every connection: the bridge online, each
// device's availability and cached state (cache_state_send_on_startup).
func (z *Zigbee2MQTT) announce() {
	z.publish(z.cfg.Base+"/bridge/state", z.availability(true), true)
	z.publish(z.cfg.Base+"/bridge/devices", z.devicesJSON(), true)
	z.mu.Lock()
	names := make([]string, 0, len(z.devs))
	for n := range z.devs {
		names = append(names, n)
	}
	z.mu.Unlock()
	for _, n := range names {
		z.mu.Lock()
		d := z.devs[n]
		online := !d.cfg.Unreachable
		st, _ := json.Marshal(d.state)
		z.mu.Unlock()
		if z.cfg.Availability {
			z.publish(z.cfg.Base+"/"+n+"/availability", z.availability(online), true)
		}
		z.publish(z.cfg.Base+"/"+n, st, z.cfg.Retain)
	}
}

// publish sends at QoS 0, as Zigbee2MQTT does by default, but for the
// retained bridge and availability topics (QoS 1).
func (z *Zigbee2MQTT) publish(topic string, payload []byte, retained bool) {
	qos := byte(0)
	if retained {
		qos = 1
	}
	z.client.PublishAsync(topic, payload, retained, qos)
}

// onMessage takes a set or a get; everything else under the base topic
// (the bridge's own publishes coming back) is not for it.
func (z *Zigbee2MQTT) onMessage(topic string, payload []byte) {
	rest, ok := strings.CutPrefix(topic, z.cfg.Base+"/")
	if !ok || strings.HasPrefix(rest, "bridge/") {
		return
	}
	var op, name string
	switch {
	case strings.HasSuffix(rest, "/set"):
		op, name = "set", strings.TrimSuffix(rest, "/set")
	case strings.HasSuffix(rest, "/get"):
		op, name = "get", strings.TrimSuffix(rest, "/get")
	default:
		return
	}
	var req map[string]any
	if err := json.Unmarshal(payload, &req); err != nil || req == nil {
		z.logError(fmt.Sprintf("Invalid message '%s', skipping...", clipText(payload)))
		return
	}
	z.mu.Lock()
	d := z.devs[name]
	if op == "set" {
		z.sets++
	}
	z.mu.Unlock()
	if op == "set" && z.cfg.OnSet != nil {
		z.cfg.OnSet(name)
	}
	if d == nil {
		z.logError(fmt.Sprintf("Entity '%s' is unknown", name))
		return
	}
	if op == "set" {
		for k := range req {
			if !z2mConverts(d.cfg.Kind, k) {
				z.logError(fmt.Sprintf("No converter available for '%s' on '%s': (%v)", k, name, req[k]))
				return
			}
		}
	}
	z.wg.Add(1)
	go z.serve(op, name, d, req) // one per command, bounded by the coordinator's slots
}

// serve carries out one command: it waits its turn at the coordinator,
// the radio round trip, then publishes the outcome.
func (z *Zigbee2MQTT) serve(op, name string, d *z2mDev, req map[string]any) {
	defer z.wg.Done()
	select {
	case z.slots <- struct{}{}:
	case <-z.ctx.Done():
		return
	}
	defer func() { <-z.slots }()
	z.mu.Lock()
	delay := d.cfg.Delay
	if d.cfg.Jitter > 0 {
		delay += time.Duration(z.rng.Int64N(int64(d.cfg.Jitter)))
	}
	lost := d.cfg.Unreachable || z.rng.Float64() < d.cfg.Loss
	stateLost := z.rng.Float64() < d.cfg.StateLoss
	jammed := d.cfg.Jammed && d.cfg.Kind == "lock" && op == "set"
	z.mu.Unlock()
	if lost {
		delay = z.cfg.Timeout
	}
	if !z.sleep(delay) {
		return
	}
	key := firstKey(req)
	switch {
	case lost:
		z.logError(fmt.Sprintf("Publish '%s' '%s' to '%s' failed: 'Error: ZCL command %s/1 genOnOff.read failed (Timeout - %d, 10000ms)'",
			op, key, name, strings.ReplaceAll(name, "/", "_"), z2mSeq(name)))
		return
	case jammed:
		z.logError(fmt.Sprintf("Publish 'set' '%s' to '%s' failed: 'Error: ZCL command %s/1 closuresDoorLock.lockDoor({}) failed (Status 'FAILURE')'", key, name, name))
		return
	}
	z.mu.Lock()
	if op == "set" {
		z.apply(name, d, req)
	}
	st, _ := json.Marshal(d.state)
	z.mu.Unlock()
	if !stateLost {
		z.publish(z.cfg.Base+"/"+name, st, z.cfg.Retain)
	}
}

// apply changes a device's state as its command says. Caller holds mu.
func (z *Zigbee2MQTT) apply(name string, d *z2mDev, req map[string]any) {
	change := make(map[string]any, len(req))
	for k, v := range req {
		if f, ok := asNumber(v); ok {
			v = f
		}
		switch {
		case k == "state" && d.cfg.Kind == "lock":
			s, _ := v.(string)
			s = strings.ToUpper(s)
			change["state"] = s
			change["lock_state"] = map[string]string{"LOCK": "locked", "UNLOCK": "unlocked"}[s]
		case k == "state":
			s, _ := v.(string)
			s = strings.ToUpper(s)
			if s == "TOGGLE" {
				s = map[bool]string{true: "OFF", false: "ON"}[d.state["state"] == "ON"]
			}
			change["state"] = s
		case k == "position" && d.cfg.Kind == "cover" && d.cfg.Travel > 0:
			z.startMove(name, d, v)
			continue
		default:
			change[k] = v
		}
	}
	if d.cfg.Kind == "light" && change["state"] == nil && change["brightness"] != nil {
		change["state"] = "ON" // a brightness set turns a light on (moveToLevelWithOnOff)
	}
	if p, ok := change["position"].(float64); ok && d.cfg.Kind == "cover" {
		change["state"] = map[bool]string{true: "OPEN", false: "CLOSE"}[p > 0]
	}
	maps.Copy(d.state, change)
	z.applied = append(z.applied, Z2MApplied{Device: name, Set: change, At: time.Now()})
}

// startMove sets a cover travelling to target. Caller holds mu.
func (z *Zigbee2MQTT) startMove(name string, d *z2mDev, target any) {
	to, _ := asNumber(target)
	from, _ := asNumber(d.state["position"])
	if d.move != nil {
		from = float64(d.move.at(time.Now()))
	}
	dist := to - from
	if dist < 0 {
		dist = -dist
	}
	now := time.Now()
	mv := &move{from: int(from), to: int(to), start: now, end: now.Add(time.Duration(dist / 100 * float64(d.cfg.Travel)))}
	d.move = mv
	d.state["moving"] = map[bool]string{true: "UP", false: "DOWN"}[to > from]
	if d.cfg.Optimistic {
		d.state["position"] = to
	}
	z.applied = append(z.applied, Z2MApplied{Device: name, Set: map[string]any{"position": to}, At: now})
	z.wg.Add(1)
	go z.travel(name, d, mv)
}

// travel reports a moving cover's position every tenth of its travel
// time, and its arrival with moving STOP.
func (z *Zigbee2MQTT) travel(name string, d *z2mDev, mv *move) {
	defer z.wg.Done()
	tick := max(d.cfg.Travel/10, 10*time.Millisecond)
	for {
		if !z.sleep(tick) {
			return
		}
		z.mu.Lock()
		if d.move != mv {
			z.mu.Unlock()
			return // a newer command took over
		}
		now := time.Now()
		d.state["position"] = float64(mv.at(now))
		arrived := !now.Before(mv.end)
		if arrived {
			d.state["moving"] = "STOP"
			d.move = nil
		}
		st, _ := json.Marshal(d.state)
		z.mu.Unlock()
		z.publish(z.cfg.Base+"/"+name, st, z.cfg.Retain)
		if arrived {
			return
		}
	}
}

func (z *Zigbee2MQTT) sleep(d time.Duration) bool {
	if d <= 0 {
		return z.ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-z.ctx.Done():
		return false
	}
}

// logError publishes an error on bridge/logging (and, on 1.x, a publish
// error on the legacy bridge/log), unless it is the same payload as the
// last one, which Zigbee2MQTT does not repeat.
func (z *Zigbee2MQTT) logError(msg string) {
	payload, _ := json.Marshal(zigbee2mqtt.Log{Level: "error", Message: msg, Namespace: "z2m"})
	z.mu.Lock()
	repeat := string(payload) == z.lastLog
	z.lastLog = string(payload)
	z.mu.Unlock()
	if repeat {
		return
	}
	z.publish(z.cfg.Base+"/bridge/logging", payload, false)
	if name, ok := zigbee2mqtt.FailedDevice(msg); ok && z.cfg.Version == 1 && strings.HasPrefix(msg, "Publish") {
		legacy, _ := json.Marshal(map[string]any{"type": "zigbee_publish_error", "message": msg, "meta": map[string]string{"friendly_name": name}})
		z.publish(z.cfg.Base+"/bridge/log", legacy, false)
	}
}

// SetReachable makes a device answer again, or stop answering; with
// availability enabled the bridge says so.
func (z *Zigbee2MQTT) SetReachable(name string, ok bool) {
	z.mu.Lock()
	d := z.devs[name]
	if d != nil {
		d.cfg.Unreachable = !ok
	}
	z.mu.Unlock()
	if d != nil && z.cfg.Availability {
		z.publish(z.cfg.Base+"/"+name+"/availability", z.availability(ok), true)
	}
}

// SetFaults changes a device's loss, state loss and jam.
func (z *Zigbee2MQTT) SetFaults(name string, loss, stateLoss float64, jammed bool) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if d := z.devs[name]; d != nil {
		d.cfg.Loss, d.cfg.StateLoss, d.cfg.Jammed = loss, stateLoss, jammed
	}
}

// State returns a copy of a device's state in Zigbee2MQTT's terms.
func (z *Zigbee2MQTT) State(name string) map[string]any {
	z.mu.Lock()
	defer z.mu.Unlock()
	if d := z.devs[name]; d != nil {
		return maps.Clone(d.state)
	}
	return nil
}

// Applied returns the commands the devices carried out, in order.
func (z *Zigbee2MQTT) Applied() []Z2MApplied {
	z.mu.Lock()
	defer z.mu.Unlock()
	return append([]Z2MApplied(nil), z.applied...)
}

// Sets is how many set commands the bridge received.
func (z *Zigbee2MQTT) Sets() int {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.sets
}

// Kill drops the bridge's connection without a goodbye, so that the
// broker publishes its will (bridge/state offline), and stops it.
func (z *Zigbee2MQTT) Kill() {
	z.client.Abort()
	z.Close()
}

// Close stops the bridge: its commands in progress are dropped.
func (z *Zigbee2MQTT) Close() {
	z.cancel()
	z.wg.Wait()
	z.client.Close()
}

func z2mConverts(kind, key string) bool {
	switch kind {
	case "light":
		return key == "state" || key == "brightness" || key == "color_temp" || key == "transition"
	case "switch", "lock":
		return key == "state"
	case "cover":
		return key == "state" || key == "position"
	case "thermostat":
		return key == "system_mode" || key == "occupied_heating_setpoint" || key == "current_heating_setpoint"
	}
	return false
}

func firstKey(m map[string]any) string {
	for _, k := range []string{"state", "brightness", "color_temp", "position", "system_mode", "occupied_heating_setpoint"} {
		if _, ok := m[k]; ok {
			return k
		}
	}
	for k := range m {
		return k
	}
	return ""
}

// z2mSeq is a stable stand-in for the ZCL transaction number in a log
// line, so that two failures of one device read alike (and the second
// is suppressed as a repeat, as on a real bridge).
func z2mSeq(name string) int { return len(name) % 256 }

func asNumber(v any) (float64, bool) {
	switch n := v.(type) {
	case float64:
		return n, true
	case int64:
		return float64(n), true
	case int:
		return float64(n), true
	}
	return 0, false
}

func clipText(b []byte) string {
	if len(b) > 64 {
		return string(b[:64]) + "…"
	}
	return string(b)
}

// devicesJSON is bridge/devices: the coordinator, then each device with
// its definition's exposes, in the shape Zigbee2MQTT publishes.
func (z *Zigbee2MQTT) devicesJSON() []byte {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.devicesJSONLocked()
}

// devicesJSONLocked is devicesJSON; caller holds mu.
func (z *Zigbee2MQTT) devicesJSONLocked() []byte {
	bin := func(prop, on, off string) map[string]any {
		return map[string]any{"type": "binary", "name": prop, "property": prop, "value_on": on, "value_off": off, "access": 7}
	}
	numeric := func(prop string, lo, hi int) map[string]any {
		return map[string]any{"type": "numeric", "name": prop, "property": prop, "value_min": lo, "value_max": hi, "access": 7}
	}
	list := []map[string]any{{"ieee_address": "0x00124b0000000000", "type": "Coordinator", "friendly_name": "Coordinator", "supported": true, "disabled": false}}
	for _, name := range slices.Sorted(maps.Keys(z.devs)) {
		d := z.devs[name]
		var exposes []map[string]any
		model := map[string]string{"light": "LED1545G12", "switch": "E1603", "lock": "YRD256HA20BP", "cover": "E1757", "thermostat": "TS0601_thermostat"}[d.cfg.Kind]
		switch d.cfg.Kind {
		case "light":
			exposes = []map[string]any{{"type": "light", "features": []any{bin("state", "ON", "OFF"), numeric("brightness", 0, 254), numeric("color_temp", 250, 454)}}}
		case "switch":
			exposes = []map[string]any{{"type": "switch", "features": []any{bin("state", "ON", "OFF")}}}
		case "lock":
			exposes = []map[string]any{{"type": "lock", "features": []any{bin("state", "LOCK", "UNLOCK"),
				map[string]any{"type": "enum", "name": "lock_state", "property": "lock_state", "values": []string{"not_fully_locked", "locked", "unlocked"}, "access": 1}}}}
		case "cover":
			exposes = []map[string]any{{"type": "cover", "features": []any{
				map[string]any{"type": "enum", "name": "state", "property": "state", "values": []string{"OPEN", "CLOSE", "STOP"}, "access": 3},
				numeric("position", 0, 100)}}}
		case "thermostat":
			exposes = []map[string]any{{"type": "climate", "features": []any{numeric("occupied_heating_setpoint", 5, 30),
				map[string]any{"type": "enum", "name": "system_mode", "property": "system_mode", "values": []string{"off", "heat", "auto"}, "access": 7}}}}
		}
		list = append(list, map[string]any{
			"ieee_address": ieee(name), "type": "Router", "friendly_name": name,
			"supported": true, "disabled": false, "interview_completed": true,
			"definition": map[string]any{"model": model, "vendor": "Simulated", "description": d.cfg.Kind, "exposes": exposes},
		})
	}
	b, _ := json.Marshal(list) // maps of strings, numbers and slices always encode
	return b
}
