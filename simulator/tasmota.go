package simulator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
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
	Broker             string `toml:"-"`
	Username, Password string `toml:"-"`
	// Topic is the device's %topic%, e.g. tasmota_1A2B3C.
	Topic string `toml:"topic"`
	// Kind is plug (Power), dimmer (Power, Dimmer), light (Power,
	// Dimmer, CT), or shutter (ShutterPosition1).
	Kind string `toml:"kind"`
	// SetOption4 answers on stat/<topic>/<COMMAND> instead of RESULT.
	SetOption4 bool `toml:"setoption4"`
	// Delay (plus up to Jitter) before a command is answered.
	Delay  time.Duration `toml:"delay"`
	Jitter time.Duration `toml:"jitter"`
	// Loss is the chance a command is lost on the Wi-Fi: nothing done,
	// nothing answered.
	Loss float64 `toml:"loss"`
	// ResultLoss is the chance the answer is lost after the command was
	// carried out.
	ResultLoss float64 `toml:"result_loss"`
	// Travel is a shutter's full travel time.
	Travel time.Duration `toml:"travel"`
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
	cfg    TasmotaConfig
	s      tasmota.Settings
	log    *slog.Logger
	client *mqttc.Client
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// queue hands commands from the MQTT handler to the worker, which
	// carries them out one by one, in order, as Tasmota does.
	queue chan tasmotaCmd

	mu       sync.Mutex
	power    bool
	dimmer   int
	ct       int
	pos      int
	move     *move
	rng      *rand.Rand
	commands int // commands received, queries included
	applied  []string
}

type tasmotaCmd struct {
	name, arg  string
	delay      time.Duration
	resultLost bool
}

func (c TasmotaConfig) check() error {
	switch {
	case c.Topic == "" || strings.ContainsAny(c.Topic, "/+# "):
		return fmt.Errorf("topic: %q is not a Tasmota topic", c.Topic)
	case c.Kind != "plug" && c.Kind != "dimmer" && c.Kind != "light" && c.Kind != "shutter":
		return fmt.Errorf("kind: %q is not plug, dimmer, light or shutter", c.Kind)
	case c.Loss < 0 || c.Loss > 1 || c.ResultLoss < 0 || c.ResultLoss > 1:
		return errors.New("loss and result_loss are probabilities 0..1")
	case c.Delay < 0 || c.Jitter < 0 || c.Travel < 0:
		return errors.New("delay, jitter and travel must not be negative")
	}
	return nil
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
	d := &Tasmota{
		cfg: cfg, s: s, log: cfg.Logger.With("tasmota", cfg.Topic),
		power: cfg.Power, dimmer: cfg.Dimmer, ct: cfg.CT, pos: cfg.Position,
		rng: rand.New(rand.NewPCG(cfg.Seed, 0x7a5)), queue: make(chan tasmotaCmd, 64),
	}
	if d.ct == 0 {
		d.ct = 370
	}
	d.ctx, d.cancel = context.WithCancel(context.WithoutCancel(ctx))
	d.wg.Go(d.work)
	c, err := mqttc.New(mqttc.Options{
		Broker: cfg.Broker, ClientID: "DVES_" + strings.ToUpper(cfg.Topic), Username: cfg.Username, Password: cfg.Password,
		Will:      &mqttc.Will{Topic: s.Topic("tele", cfg.Topic, "LWT"), Payload: []byte("Offline"), QoS: 1, Retained: true},
		KeepAlive: 30 * time.Second, Ordered: true, Abortable: true,
		OnConnect: d.announce, Logger: d.log,
	})
	if err != nil {
		d.cancel()
		d.wg.Wait()
		return nil, err
	}
	d.client = c
	if err := subscribeAndConnect(ctx, c, s.Topic("cmnd", cfg.Topic, "+"), d.onCommand); err != nil {
		d.cancel()
		d.wg.Wait()
		return nil, err
	}
	return d, nil
}

// subscribeAndConnect subscribes a simulated device's client to the
// topics it takes commands on and connects it; on failure it closes it.
func subscribeAndConnect(ctx context.Context, c *mqttc.Client, filter string, handle func(string, []byte)) error {
	if _, err := c.Subscribe(filter, handle); err != nil {
		c.Close()
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.Connect(cctx); err != nil {
		c.Close()
		return err
	}
	return nil
}

func (d *Tasmota) announce() {
	d.client.PublishAsync(d.s.Topic("tele", d.cfg.Topic, "LWT"), []byte("Online"), true, 1)
	d.client.PublishAsync(d.s.Topic("cmnd", d.cfg.Topic, "POWER"), nil, false, 0)
}

func (d *Tasmota) publish(name string, payload []byte) {
	d.client.PublishAsync(d.s.Topic("stat", d.cfg.Topic, name), payload, false, 0)
}

func (d *Tasmota) onCommand(topic string, payload []byte) {
	name := topic[strings.LastIndexByte(topic, '/')+1:]
	d.mu.Lock()
	d.commands++
	lost := len(payload) > 0 && d.rng.Float64() < d.cfg.Loss
	resultLost := d.rng.Float64() < d.cfg.ResultLoss
	delay := d.cfg.Delay
	if d.cfg.Jitter > 0 {
		delay += time.Duration(d.rng.Int64N(int64(d.cfg.Jitter)))
	}
	d.mu.Unlock()
	if lost {
		return
	}
	select {
	case d.queue <- tasmotaCmd{name: name, arg: string(payload), delay: delay, resultLost: resultLost}:
	default: // a flood beyond the device's buffer is dropped, as on a busy ESP
	}
}

func (d *Tasmota) work() {
	for {
		select {
		case c := <-d.queue:
			if !sleepCtx(d.ctx, c.delay) {
				return
			}
			d.answer(c.name, c.arg, c.resultLost)
		case <-d.ctx.Done():
			return
		}
	}
}

func (d *Tasmota) answer(name, arg string, resultLost bool) {
	upper := strings.ToUpper(name)
	d.mu.Lock()
	result, powerChanged := d.execute(upper, strings.TrimSpace(arg))
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
		d.startShutter(v)
		d.applied = append(d.applied, "ShutterPosition1 "+arg)
		return fmt.Appendf(nil, `{"ShutterPosition1":%d}`, v), false
	case cmd == "STATUS" && arg == "10":
		return fmt.Appendf(nil, `{"StatusSNS":{"Time":%q,%s}}`, time.Now().UTC().Format("2006-01-02T15:04:05"), strings.Trim(string(d.shutterJSON()), "{}")), false
	}
	return []byte(`{"Command":"Unknown"}`), false
}

// shutterJSON is the shutter's report. Caller holds mu.
func (d *Tasmota) shutterJSON() []byte {
	pos, dir, target := d.pos, 0, d.pos
	if d.move != nil {
		now := time.Now()
		pos, target = d.move.at(now), d.move.to
		if now.Before(d.move.end) {
			dir = map[bool]int{true: 1, false: -1}[d.move.to > d.move.from]
		}
	}
	return fmt.Appendf(nil, `{"Shutter1":{"Position":%d,"Direction":%d,"Target":%d,"Tilt":0}}`, pos, dir, target)
}

// startShutter sets the shutter moving. Caller holds mu.
func (d *Tasmota) startShutter(to int) {
	now := time.Now()
	from := d.pos
	if d.move != nil {
		from = d.move.at(now)
	}
	dist := float64(to - from)
	if dist < 0 {
		dist = -dist
	}
	mv := &move{from: from, to: to, start: now, end: now.Add(time.Duration(dist / 100 * float64(d.cfg.Travel)))}
	d.move = mv
	d.wg.Add(1)
	go d.travel(mv)
}

func (d *Tasmota) travel(mv *move) {
	defer d.wg.Done()
	tick := max(d.cfg.Travel/10, 10*time.Millisecond)
	for {
		if !sleepCtx(d.ctx, tick) {
			return
		}
		d.mu.Lock()
		if d.move != mv {
			d.mu.Unlock()
			return
		}
		arrived := !time.Now().Before(mv.end)
		if arrived {
			d.pos, d.move = mv.to, nil
		}
		b := d.shutterJSON()
		d.mu.Unlock()
		d.publish("RESULT", b)
		if arrived {
			return
		}
	}
}

// Power reports the relay; Dimmer, CT and Position the rest.
func (d *Tasmota) Power() bool { d.mu.Lock(); defer d.mu.Unlock(); return d.power }

// Dimmer reports the dimmer level.
func (d *Tasmota) Dimmer() int { d.mu.Lock(); defer d.mu.Unlock(); return d.dimmer }

// Position reports a shutter's position.
func (d *Tasmota) Position() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.move != nil {
		return d.move.at(time.Now())
	}
	return d.pos
}

// Applied lists the commands that changed something, in order.
func (d *Tasmota) Applied() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.applied...)
}

// SetLoss changes the command and result loss.
func (d *Tasmota) SetLoss(loss, resultLoss float64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cfg.Loss, d.cfg.ResultLoss = loss, resultLoss
}

// Kill drops the connection without a goodbye (the broker publishes the
// will, LWT Offline) and stops the device.
func (d *Tasmota) Kill() {
	d.client.Abort()
	d.Close()
}

// Close stops the device.
func (d *Tasmota) Close() {
	d.cancel()
	d.wg.Wait()
	d.client.Close()
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
