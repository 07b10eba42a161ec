package devices_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/broker"
	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/simulator"
)

// ecoTypes are the device types of the ecosystem tests' registries: a
// light, a lock, a curtain and a relay, in the common vocabulary.
const ecoTypes = `
[types.light.actions.turn_on]
expect = { power = "on" }
params.brightness = { type = "int", min = 1, max = 100 }
params.color_temp = { type = "int", min = 2200, max = 6500 }
[types.light.actions.turn_off]
expect = { power = "off" }
[types.light.actions.set]
params.power = { type = "enum", values = ["on", "off"] }
params.brightness = { type = "int", min = 0, max = 100 }
params.color_temp = { type = "int", min = 2200, max = 6500 }

[types.lock.actions.lock]
expect = { locked = true }
[types.lock.actions.unlock]
expect = { locked = false }
[types.lock.actions.set]
params.locked = { type = "bool" }

[types.curtain.actions.set_position]
params.position = { type = "int", min = 0, max = 100, required = true }
[types.curtain.actions.set]
params.position = { type = "int", min = 0, max = 100 }

[types.relay.actions.turn_on]
expect = { power = "on" }
[types.relay.actions.turn_off]
expect = { power = "off" }
[types.relay.actions.set]
params.power = { type = "enum", values = ["on", "off"] }
`

// z2mRegistry is a home of Zigbee devices behind one Zigbee2MQTT bridge.
const z2mRegistry = ecoTypes + `
[[devices]]
id = "hall-bulb"
type = "light"
protocol = "zigbee2mqtt"
address = "Hall/Bulb"

[[devices]]
id = "door"
type = "lock"
protocol = "zigbee2mqtt"
address = "Front door"

[[devices]]
id = "blind"
type = "curtain"
protocol = "zigbee2mqtt"
address = "Blind"
`

type z2mRig struct {
	*rig
	bridge *simulator.Zigbee2MQTT
}

// newEcoRig starts the agent's client and handlers for registry on b
// (a new broker when nil): devices of other ecosystems then start
// against it.
func newEcoRig(t testing.TB, b *broker.Broker, registry string) *rig {
	t.Helper()
	if b == nil {
		b = brokertest.Start(t)
	}
	reg, err := devices.ParseRegistry([]byte(registry), "eco.toml")
	if err != nil {
		t.Fatal(err)
	}
	w := newWakes()
	c := dial(t, b, func(o *devices.Options) { o.OnChange = w.wake; o.Registry = reg; o.AckTimeout = time.Second })
	h := devices.NewHandlers(c, reg, devices.HandlerOptions{})
	r := &rig{broker: b, client: c, h: h, kinds: map[string]driver.Handler{}, wakes: w}
	h.Register(func(kind string, x driver.Handler) { r.kinds[kind] = x })
	return r
}

// newZ2MRig starts the rig, then a simulated Zigbee2MQTT bridge with
// the registry's devices; cfg adjusts the bridge. The bridge starts
// after the agent listens: its states at start are not retained
// (Zigbee2MQTT's default).
func newZ2MRig(t *testing.T, b *broker.Broker, cfg func(*simulator.Z2MConfig)) *z2mRig {
	t.Helper()
	r := newEcoRig(t, b, z2mRegistry)
	zc := simulator.Z2MConfig{
		Broker: r.broker.URL(), Timeout: 300 * time.Millisecond,
		Devices: []simulator.Z2MDevice{
			{Name: "Hall/Bulb", Kind: "light", Delay: 20 * time.Millisecond},
			{Name: "Front door", Kind: "lock", Delay: 20 * time.Millisecond},
			{Name: "Blind", Kind: "cover", Delay: 20 * time.Millisecond, Travel: 300 * time.Millisecond},
		},
	}
	if cfg != nil {
		cfg(&zc)
	}
	z, err := simulator.StartZigbee2MQTT(t.Context(), zc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(z.Close)
	waitUntil(t, r.client, "hall-bulb", "first state", func() bool { _, ok := r.client.State("hall-bulb"); return ok })
	return &z2mRig{rig: r, bridge: z}
}

func z2mCommand(t testing.TB, id, device, action string, params map[string]any, attempt int) driver.StepRequest {
	t.Helper()
	return driver.StepRequest{MissionID: "m-" + id, IdempotencyKey: id, Attempt: attempt,
		Params:  mustJSON(t, map[string]any{"device": device, "action": action, "params": params}),
		Started: time.Now(), Deadline: time.Now().Add(30 * time.Second)}
}

func TestZigbee2MQTTCommandConfirmedByTheBridgesStatePublish(t *testing.T) {
	r := newZ2MRig(t, nil, nil)
	out, err := r.run(t, devices.KindCommand, z2mCommand(t, "c1", "hall-bulb", "turn_on", map[string]any{"brightness": 40, "color_temp": 2700}, 1))
	if err != nil {
		t.Fatal(err)
	}
	st := out["state"].(map[string]any)
	if st["power"] != "on" || st["brightness"] != int64(40) {
		t.Errorf("state = %v, want power on, brightness 40", st)
	}
	if prior, _ := out["prior_state"].(map[string]any); prior["power"] != "off" {
		t.Errorf("prior_state = %v, want the bulb's state before (off)", out["prior_state"])
	}
	got := r.bridge.State("Hall/Bulb")
	if got["state"] != "ON" || got["brightness"] != 102.0 || got["color_temp"] != 370.0 {
		t.Errorf("the bulb has %v, want ON, brightness 102 of 254, 370 mireds", got)
	}
}

func TestZigbee2MQTTPublishFailureFailsTheAttemptAtOnceAsRetryable(t *testing.T) {
	r := newZ2MRig(t, nil, func(c *simulator.Z2MConfig) { c.Devices[0].Loss = 1 })
	start := time.Now()
	_, err := r.run(t, devices.KindCommand, z2mCommand(t, "c1", "hall-bulb", "turn_on", nil, 1))
	var se *driver.StepError
	if !errors.As(err, &se) || se.Code != "unreachable" || se.Class != driver.Retryable {
		t.Fatalf("err = %v, want a retryable unreachable step error from the bridge's log", err)
	}
	// The bridge's log came at its 300 ms timeout, well before the 1 s
	// the ack would have been waited for.
	if took := time.Since(start); took > 900*time.Millisecond {
		t.Errorf("the failure took %v: it waited for the ack timeout, not the bridge's log", took)
	}
}

func TestZigbee2MQTTNoConverterFailsTheStepPermanently(t *testing.T) {
	// A bulb the bridge knows as a plain switch has no brightness.
	r := newZ2MRig(t, nil, func(c *simulator.Z2MConfig) { c.Devices[0].Kind = "switch" })
	_, err := r.run(t, devices.KindCommand, z2mCommand(t, "c1", "hall-bulb", "turn_on", map[string]any{"brightness": 10}, 1))
	var se *driver.StepError
	if !errors.As(err, &se) || se.Code != "unsupported" || se.Class != driver.Permanent {
		t.Fatalf("err = %v, want a permanent unsupported step error (No converter available)", err)
	}
}

func TestZigbee2MQTTRetainedStateNeverConfirmsANewCommand(t *testing.T) {
	b := brokertest.Start(t)
	// A bridge with retain on leaves the bulb's state "ON" retained, and
	// then goes away without its devices answering any more.
	r := newZ2MRig(t, b, func(c *simulator.Z2MConfig) {
		c.Retain = true
		c.Devices[0].State = map[string]any{"state": "ON", "brightness": 254.0}
		c.Devices[0].Unreachable = true
		c.Timeout = time.Hour // the bridge never logs a failure
	})
	if st, _ := r.client.State("hall-bulb"); st["power"] != "on" {
		t.Fatalf("state = %v, want the retained ON", st)
	}
	// A second client subscribes now and gets the retained ON replayed.
	reg, _ := devices.ParseRegistry([]byte(z2mRegistry), "z2m.toml")
	w := newWakes()
	c2 := dial(t, b, func(o *devices.Options) { o.OnChange = w.wake; o.Registry = reg })
	waitUntil(t, c2, "hall-bulb", "retained state", func() bool { _, ok := c2.State("hall-bulb"); return ok })
	if _, done, err := c2.PostState("hall-bulb", "c1", map[string]any{"power": "on"}, 1, time.Now().Add(300*time.Millisecond), nil); done || err != nil {
		t.Fatalf("PostState: done %v, err %v; want it sent", done, err)
	}
	if w.await(devices.AckKey("hall-bulb", "c1"), time.Now().Add(300*time.Millisecond)) {
		t.Fatal("the command was confirmed by a replayed retained state")
	}
	if _, _, err := c2.Collect("hall-bulb", "c1", true); !errors.Is(err, driver.ErrAckTimeout) {
		t.Errorf("Collect = %v, want an ack timeout", err)
	}
}

func TestZigbee2MQTTRetryReadsTheDeviceAndDoesNotSendAgainWhenAlreadyThere(t *testing.T) {
	r := newZ2MRig(t, nil, func(c *simulator.Z2MConfig) { c.Devices[0].StateLoss = 1 })
	// The bulb switches on, but the bridge's publish of it is lost.
	ackTimeout := map[string]any{"device": "hall-bulb", "action": "turn_on", "ack_timeout": "200ms"}
	req := driver.StepRequest{MissionID: "m1", IdempotencyKey: "c1", Attempt: 1, Params: mustJSON(t, ackTimeout)}
	_, err := r.run(t, devices.KindCommand, req)
	if !errors.Is(err, driver.ErrAckTimeout) {
		t.Fatalf("first attempt: %v, want an ack timeout", err)
	}
	r.bridge.SetFaults("Hall/Bulb", 0, 0, false)
	req.Attempt = 2
	out, err := r.run(t, devices.KindCommand, req)
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	if st := out["state"].(map[string]any); st["power"] != "on" {
		t.Errorf("state = %v, want on", st)
	}
	if n := r.bridge.Sets(); n != 1 {
		t.Errorf("the bridge got %d sets, want 1: the retry read the bulb (already on) instead of commanding it again", n)
	}
}

func TestZigbee2MQTTBridgeOfflineTakesItsDevicesOffline(t *testing.T) {
	for _, version := range []int{1, 2} {
		t.Run(map[int]string{1: "1.x plain payloads", 2: "2.x JSON payloads"}[version], func(t *testing.T) {
			r := newZ2MRig(t, nil, func(c *simulator.Z2MConfig) { c.Version = version; c.Availability = true })
			waitUntil(t, r.client, "door", "online", func() bool { return r.client.Available("door") })
			r.bridge.SetReachable("Front door", false)
			waitUntil(t, r.client, "door", "offline", func() bool { return !r.client.Available("door") })
			if !r.client.Available("hall-bulb") {
				t.Error("the bulb went offline with the door")
			}
			r.bridge.Kill()
			waitUntil(t, r.client, "hall-bulb", "offline with its bridge", func() bool { return !r.client.Available("hall-bulb") })
		})
	}
}

func TestZigbee2MQTTCoverConfirmedWhenItStopsAtTheTarget(t *testing.T) {
	r := newZ2MRig(t, nil, nil)
	start := time.Now()
	out, err := r.run(t, devices.KindCommand, z2mCommand(t, "c1", "blind", "set_position", map[string]any{"position": 100}, 1))
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Errorf("confirmed after %v, before the blind's 300 ms of travel", took)
	}
	if st := out["state"].(map[string]any); st["position"] != int64(100) || st["moving"] != false {
		t.Errorf("state = %v, want position 100, not moving", st)
	}
}

func TestZigbee2MQTTJammedLockFailsAndUndoRestoresTheRealPriorState(t *testing.T) {
	r := newZ2MRig(t, nil, nil)
	out, err := r.run(t, devices.KindCommand, z2mCommand(t, "c1", "door", "unlock", nil, 1))
	if err != nil {
		t.Fatal(err)
	}
	// Compensation: the lock goes back to what it reported before.
	undo := driver.StepRequest{MissionID: "m-c1", IdempotencyKey: "c1-undo", Attempt: 1, Compensating: true, Forward: out}
	if _, err := r.run(t, devices.KindRestore, undo); err != nil {
		t.Fatal(err)
	}
	if st := r.bridge.State("Front door"); st["lock_state"] != "locked" {
		t.Errorf("the lock is %v after the undo, want locked as before", st)
	}
	r.bridge.SetFaults("Front door", 0, 0, true)
	_, err = r.run(t, devices.KindCommand, z2mCommand(t, "c2", "door", "unlock", nil, 1))
	var se *driver.StepError
	if !errors.As(err, &se) || se.Class != driver.Retryable {
		t.Fatalf("jammed: %v, want the bridge's failure (retryable: Zigbee2MQTT cannot tell a jam from a lost frame)", err)
	}
}

func mustJSON(t testing.TB, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
