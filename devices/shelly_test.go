package devices_test

import (
	"errors"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/simulator"
)

const shellyRegistry = ecoTypes + `
[protocols.shelly]
src = "sortie-test"
probe_timeout = "300ms"

[[devices]]
id = "pump"
type = "relay"
protocol = "shelly"
address = "shellyplus1-4855199bc0e8"

[[devices]]
id = "awning"
type = "curtain"
protocol = "shelly"
address = "shellyplus2pm-c4d8d5:0"

[[devices]]
id = "garage"
type = "relay"
protocol = "shelly"
address = "shellypro1-0000aa"
`

func newShellyRig(t *testing.T, mod func(relay, cover *simulator.ShellyConfig)) (*rig, *simulator.Shelly, *simulator.Shelly) {
	t.Helper()
	r := newEcoRig(t, nil, shellyRegistry)
	conn := simulator.Conn{Broker: r.broker.URL()}
	rc := simulator.ShellyConfig{Conn: conn, ID: "shellyplus1-4855199bc0e8", Kind: "switch", WiFiFaults: simulator.WiFiFaults{Delay: 30 * time.Millisecond}, On: true}
	cc := simulator.ShellyConfig{Conn: conn, ID: "shellyplus2pm-c4d8d5", Kind: "cover", WiFiFaults: simulator.WiFiFaults{Delay: 30 * time.Millisecond, Travel: 300 * time.Millisecond}}
	if mod != nil {
		mod(&rc, &cc)
	}
	relay, err := simulator.StartShelly(t.Context(), rc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(relay.Close)
	cover, err := simulator.StartShelly(t.Context(), cc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cover.Close)
	return r, relay, cover
}

func TestShellyReplyConfirmsAndItsWasOnIsThePriorState(t *testing.T) {
	r, relay, _ := newShellyRig(t, nil)
	out, err := r.run(t, devices.KindCommand, z2mCommand(t, "c1", "pump", "turn_off", nil, 1))
	if err != nil {
		t.Fatal(err)
	}
	if prior, _ := out["prior_state"].(map[string]any); prior["power"] != "on" {
		t.Errorf("prior_state %v, want the reply's was_on (on)", out["prior_state"])
	}
	if relay.On() {
		t.Error("the relay is still on")
	}
	if relay.Toggles() != 0 {
		t.Errorf("%d toggles sent", relay.Toggles())
	}
}

func TestShellyLostReplyIsConfirmedByTheStatusNotification(t *testing.T) {
	r, relay, _ := newShellyRig(t, nil)
	relay.SetLoss(0, 1)
	if _, err := r.run(t, devices.KindCommand, z2mCommand(t, "c1", "pump", "turn_off", nil, 1)); err != nil {
		t.Fatalf("%v: the NotifyStatus showing the output off confirms the command", err)
	}
	if got := relay.Applied(); len(got) != 1 {
		t.Errorf("applied %q", got)
	}
}

func TestShellyUncalibratedCoverFailsAtOnce(t *testing.T) {
	r, _, _ := newShellyRig(t, func(_, c *simulator.ShellyConfig) { c.Uncalibrated = true })
	_, err := r.run(t, devices.KindCommand, z2mCommand(t, "c1", "awning", "set_position", map[string]any{"position": 50}, 1))
	var se *driver.StepError
	if !errors.As(err, &se) || se.Class != driver.Permanent || se.Code != "unsupported" {
		t.Fatalf("err %v, want a permanent unsupported error (Shelly -109)", err)
	}
}

func TestShellyCoverConfirmedWhenItStops(t *testing.T) {
	r, _, cover := newShellyRig(t, nil)
	start := time.Now()
	out, err := r.run(t, devices.KindCommand, z2mCommand(t, "c1", "awning", "set_position", map[string]any{"position": 100}, 1))
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Errorf("confirmed after %v, within its travel time", took)
	}
	if st := out["state"].(map[string]any); st["position"] != int64(100) || st["moving"] != false || cover.Position() != 100 {
		t.Errorf("state %v, cover at %d", st, cover.Position())
	}
}

func TestShellyThatDoesNotAnswerTheProbeAtConnectIsOffline(t *testing.T) {
	r, _, _ := newShellyRig(t, nil)
	// garage has no device: its probe at connect goes unanswered.
	waitUntil(t, r.client, "garage", "offline", func() bool { return !r.client.Available("garage") })
	if !r.client.Available("pump") {
		t.Error("the pump, which answered, is offline")
	}
	_, err := r.run(t, devices.KindCommand, z2mCommand(t, "c1", "garage", "turn_on", nil, 1))
	var se *driver.StepError
	if !errors.As(err, &se) || se.Class != driver.NotReady || se.Code != devices.CodeDeviceOffline {
		t.Fatalf("err %v, want the step to wait for the device", err)
	}
}
