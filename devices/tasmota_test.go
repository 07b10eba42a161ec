package devices_test

import (
	"errors"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/simulator"
)

const tasmotaRegistry = ecoTypes + `
[[devices]]
id = "desk-lamp"
type = "light"
protocol = "tasmota"
address = "tasmota_5E1A2B"

[[devices]]
id = "shutter"
type = "curtain"
protocol = "tasmota"
address = "tasmota_77AA01"
`

// newTasmotaRig starts a broker, the agent's client and handlers, then
// a dimmer and a shutter speaking Tasmota's MQTT interface.
func newTasmotaRig(t *testing.T, mod func(lamp, shutter *simulator.TasmotaConfig)) (*rig, *simulator.Tasmota, *simulator.Tasmota) {
	t.Helper()
	r := newEcoRig(t, nil, tasmotaRegistry)
	b, c := r.broker, r.client
	conn := simulator.Conn{Broker: b.URL()}
	lc := simulator.TasmotaConfig{Conn: conn, Topic: "tasmota_5E1A2B", Kind: "dimmer", WiFiFaults: simulator.WiFiFaults{Delay: 30 * time.Millisecond}, Dimmer: 20}
	sc := simulator.TasmotaConfig{Conn: conn, Topic: "tasmota_77AA01", Kind: "shutter", WiFiFaults: simulator.WiFiFaults{Delay: 30 * time.Millisecond, Travel: 300 * time.Millisecond}}
	if mod != nil {
		mod(&lc, &sc)
	}
	lamp, err := simulator.StartTasmota(t.Context(), lc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lamp.Close)
	shutter, err := simulator.StartTasmota(t.Context(), sc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(shutter.Close)
	// The lamp answers the empty POWER it sends itself at connect.
	waitUntil(t, c, "desk-lamp", "first state", func() bool { _, ok := c.State("desk-lamp"); return ok })
	return r, lamp, shutter
}

func TestTasmotaCommandConfirmedByItsResultEcho(t *testing.T) {
	for _, so4 := range []bool{false, true} {
		t.Run(map[bool]string{false: "RESULT", true: "SetOption4"}[so4], func(t *testing.T) {
			r, lamp, _ := newTasmotaRig(t, func(l, _ *simulator.TasmotaConfig) { l.SetOption4 = so4 })
			out, err := r.run(t, devices.KindCommand, z2mCommand(t, "c1", "desk-lamp", "turn_on", map[string]any{"brightness": 65}, 1))
			if err != nil {
				t.Fatal(err)
			}
			if st := out["state"].(map[string]any); st["power"] != "on" || st["brightness"] != int64(65) {
				t.Errorf("state %v", st)
			}
			if !lamp.Power() || lamp.Dimmer() != 65 {
				t.Errorf("the lamp is power %v, dimmer %d", lamp.Power(), lamp.Dimmer())
			}
			if got := lamp.Applied(); len(got) != 2 || got[0] != "Power ON" || got[1] != "Dimmer 65" {
				t.Errorf("applied %q, want Power ON then Dimmer 65, no toggle", got)
			}
		})
	}
}

func TestTasmotaShutterConfirmedWhenItStopsAtTheTarget(t *testing.T) {
	r, _, shutter := newTasmotaRig(t, nil)
	start := time.Now()
	out, err := r.run(t, devices.KindCommand, z2mCommand(t, "c1", "shutter", "set_position", map[string]any{"position": 100}, 1))
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Errorf("confirmed after %v, before its 300 ms of travel ended", took)
	}
	if st := out["state"].(map[string]any); st["position"] != int64(100) || st["moving"] != false {
		t.Errorf("state %v, want position 100, not moving", st)
	}
	if shutter.Position() != 100 {
		t.Errorf("the shutter is at %d", shutter.Position())
	}
}

func TestTasmotaRetryQueriesFirstAndSendsNothingAgain(t *testing.T) {
	r, lamp, _ := newTasmotaRig(t, nil)
	lamp.SetLoss(0, 1)
	req := driver.StepRequest{MissionID: "m1", IdempotencyKey: "c1", Attempt: 1,
		Params: mustJSON(t, map[string]any{"device": "desk-lamp", "action": "turn_on", "ack_timeout": "200ms"})}
	if _, err := r.run(t, devices.KindCommand, req); !errors.Is(err, driver.ErrAckTimeout) {
		t.Fatalf("first attempt: %v, want an ack timeout (the lamp's answer was lost)", err)
	}
	lamp.SetLoss(0, 0)
	req.Attempt = 2
	if _, err := r.run(t, devices.KindCommand, req); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if got := lamp.Applied(); len(got) != 1 {
		t.Errorf("applied %q: the retry commanded the lamp again instead of reading it", got)
	}
}

func TestTasmotaLWTTakesTheDeviceOffline(t *testing.T) {
	r, lamp, _ := newTasmotaRig(t, nil)
	waitUntil(t, r.client, "desk-lamp", "online", func() bool { return r.client.Available("desk-lamp") })
	lamp.Kill()
	waitUntil(t, r.client, "desk-lamp", "offline", func() bool { return !r.client.Available("desk-lamp") })
}
