package simulator

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/sortie-edge/sortie/devices/shelly"
	"github.com/sortie-edge/sortie/internal/mqttc"
)

// ShellyConfig is a simulated Shelly Gen2+ device with RPC over MQTT.
// Its wire behaviour follows Shelly's API documentation and captures of
// real devices (docs/devices.md):
//
//   - It subscribes to <prefix>/rpc. A request {"id","src","method",
//     "params"} is answered on <src>/rpc with {"id","src":<device
//     id>,"dst":<src>,"result"} or "error" {"code","message"}, at QoS 1.
//   - Switch.Set answers {"was_on":<before>}; Light.Set and
//     Cover.GoToPosition answer null; Switch.GetStatus and
//     Shelly.GetStatus answer the status. An unknown method is error 404
//     "No handler for …", a missing id -103, an uncalibrated cover's
//     GoToPosition -109.
//   - Every change is notified on <prefix>/events/rpc as NotifyStatus
//     with the changed component; a moving cover notifies as it moves.
//   - <prefix>/online is "true" when it connects and "false" its will,
//     neither retained.
type ShellyConfig struct {
	Conn
	// ID is the device ID (shellyplus1-4855199bc0e8), also its topic
	// prefix unless Prefix is set.
	ID     string `toml:"id"`
	Prefix string `toml:"prefix"`
	// Kind is switch, light or cover (component id 0).
	Kind string `toml:"kind"`
	WiFiFaults
	// Uncalibrated covers refuse GoToPosition.
	Uncalibrated bool `toml:"uncalibrated"`
	// On, Brightness, Position are the initial state.
	On         bool         `toml:"on"`
	Brightness int          `toml:"brightness"`
	Position   int          `toml:"position"`
	Seed       uint64       `toml:"-"`
	Logger     *slog.Logger `toml:"-"`
}

func (c ShellyConfig) prefix() string {
	if c.Prefix != "" {
		return c.Prefix
	}
	return c.ID
}

func (c ShellyConfig) check() error {
	switch {
	case c.ID == "" || strings.ContainsAny(c.ID, "/+# "):
		return fmt.Errorf("id: %q is not a Shelly device ID", c.ID)
	case strings.ContainsAny(c.Prefix, "+#"):
		return fmt.Errorf("prefix: %q holds a wildcard", c.Prefix)
	case c.Kind != "switch" && c.Kind != "light" && c.Kind != "cover":
		return fmt.Errorf("kind: %q is not switch, light or cover", c.Kind)
	}
	return c.WiFiFaults.check()
}

// Shelly is a running ShellyConfig; safe for concurrent use.
type Shelly struct {
	wifiDevice
	cfg ShellyConfig

	// Under wifiDevice.mu:
	on         bool
	brightness int
	applied    []string
	toggles    int
}

// StartShelly connects the device.
func StartShelly(ctx context.Context, cfg ShellyConfig) (*Shelly, error) {
	if err := cfg.check(); err != nil {
		return nil, fmt.Errorf("shelly %s: %w", cfg.ID, err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	d := &Shelly{cfg: cfg, on: cfg.On, brightness: cfg.Brightness}
	d.faults, d.pos, d.rng = cfg.WiFiFaults, cfg.Position, rand.New(rand.NewPCG(cfg.Seed, 0x5e1))
	d.serve = d.request
	p := cfg.prefix()
	err := d.start(ctx, mqttc.Options{
		Broker: cfg.Broker, ClientID: cfg.ID, Username: cfg.Username, Password: cfg.Password,
		Will:      &mqttc.Will{Topic: p + "/online", Payload: []byte("false")},
		KeepAlive: 60 * time.Second, Ordered: true, Abortable: true,
		OnConnect: func() { d.client.PublishAsync(p+"/online", []byte("true"), false, 1) },
		Logger:    cfg.Logger.With("shelly", cfg.ID),
	}, p+"/rpc")
	if err != nil {
		return nil, err
	}
	return d, nil
}

// request answers one request frame; one without a src has nowhere to
// be answered and is dropped.
func (d *Shelly) request(_ string, payload []byte, replyLost bool) {
	var f shelly.Frame
	if json.Unmarshal(payload, &f) != nil || f.Src == "" {
		return
	}
	d.handle(f, replyLost)
}

func (d *Shelly) handle(f shelly.Frame, replyLost bool) {
	var params struct {
		ID         *int  `json:"id"`
		On         *bool `json:"on"`
		Brightness *int  `json:"brightness"`
		Pos        *int  `json:"pos"`
	}
	_ = json.Unmarshal(f.Params, &params) // a bad params object shows as missing fields below
	comp := d.cfg.Kind
	var result any
	var rpcErr *shelly.RPCError
	changed := false
	d.mu.Lock()
	switch {
	case len(f.ID) == 0:
		rpcErr = &shelly.RPCError{Code: -103, Message: "Missing required 'id'"}
	case f.Method == "Shelly.GetStatus":
		result = map[string]any{comp + ":0": d.statusLocked()}
	case f.Method == "Switch.GetStatus" && comp == "switch", f.Method == "Light.GetStatus" && comp == "light", f.Method == "Cover.GetStatus" && comp == "cover":
		if params.ID == nil || *params.ID != 0 {
			rpcErr = &shelly.RPCError{Code: -105, Message: "Argument 'id', value 1 not found!"}
			break
		}
		result = d.statusLocked()
	case (f.Method == "Switch.Set" && comp == "switch") || (f.Method == "Light.Set" && comp == "light"):
		if params.ID == nil || *params.ID != 0 {
			rpcErr = &shelly.RPCError{Code: -103, Message: "Missing required argument 'id'!"}
			break
		}
		was := d.on
		if params.On != nil {
			d.on = *params.On
		}
		if params.Brightness != nil && comp == "light" {
			d.brightness = *params.Brightness
		}
		changed = true
		d.applied = append(d.applied, fmt.Sprintf("%s on=%v", f.Method, d.on))
		if comp == "switch" {
			result = map[string]any{"was_on": was}
		}
	case f.Method == "Switch.Toggle" && comp == "switch":
		was := d.on
		d.on = !d.on
		d.toggles++
		changed = true
		result = map[string]any{"was_on": was}
	case f.Method == "Cover.GoToPosition" && comp == "cover":
		switch {
		case d.cfg.Uncalibrated:
			rpcErr = &shelly.RPCError{Code: -109, Message: "Cover calibration required!"}
		case params.Pos == nil || *params.Pos < 0 || *params.Pos > 100:
			rpcErr = &shelly.RPCError{Code: -103, Message: "Invalid argument 'pos'!"}
		default:
			d.travelTo(*params.Pos, func() map[string][]byte { return map[string][]byte{d.cfg.prefix() + "/events/rpc": d.notification()} })
			d.applied = append(d.applied, fmt.Sprintf("Cover.GoToPosition pos=%d", *params.Pos))
			changed = true
		}
	default:
		rpcErr = &shelly.RPCError{Code: 404, Message: "No handler for " + f.Method}
	}
	status := d.statusLocked()
	d.mu.Unlock()
	if !replyLost {
		reply := map[string]any{"id": f.ID, "src": d.cfg.ID, "dst": f.Src}
		if rpcErr != nil {
			reply["error"] = rpcErr
		} else {
			reply["result"] = result
		}
		b, _ := json.Marshal(reply)
		d.client.PublishAsync(f.Src+"/rpc", b, false, 1)
	}
	if changed {
		d.notify(status)
	}
}

// statusLocked is the component's status. Caller holds mu.
func (d *Shelly) statusLocked() map[string]any {
	switch d.cfg.Kind {
	case "cover":
		pos, _, dir := d.moving()
		state := map[int]string{1: "opening", -1: "closing", 0: "stopped"}[dir]
		if dir == 0 && pos == 100 {
			state = "open"
		} else if dir == 0 && pos == 0 {
			state = "closed"
		}
		return map[string]any{"id": 0, "source": "MQTT", "state": state, "current_pos": pos, "pos_control": !d.cfg.Uncalibrated}
	case "light":
		return map[string]any{"id": 0, "source": "MQTT", "output": d.on, "brightness": d.brightness}
	}
	return map[string]any{"id": 0, "source": "MQTT", "output": d.on, "apower": 0.0, "voltage": 230.1}
}

func (d *Shelly) notify(status map[string]any) {
	d.client.PublishAsync(d.cfg.prefix()+"/events/rpc", d.notificationOf(status), false, 0)
}

// notification is the NotifyStatus of the component now. Caller holds mu.
func (d *Shelly) notification() []byte { return d.notificationOf(d.statusLocked()) }

func (d *Shelly) notificationOf(status map[string]any) []byte {
	b, _ := json.Marshal(map[string]any{
		"src": d.cfg.ID, "dst": d.cfg.prefix() + "/events", "method": "NotifyStatus",
		"params": map[string]any{"ts": float64(time.Now().UnixMilli()) / 1000, d.cfg.Kind + ":0": status},
	})
	return b
}

// On reports the output.
func (d *Shelly) On() bool { d.mu.Lock(); defer d.mu.Unlock(); return d.on }

// Applied lists the requests that changed the device; Toggles counts
// Switch.Toggle requests (Sortie must send none).
func (d *Shelly) Applied() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.applied...)
}

// Toggles counts the Switch.Toggle requests received.
func (d *Shelly) Toggles() int { d.mu.Lock(); defer d.mu.Unlock(); return d.toggles }
