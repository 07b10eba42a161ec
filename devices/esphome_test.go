package devices_test

import (
	"errors"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/simulator"
)

const esphomeRegistry = ecoTypes + `
[[devices]]
id = "fan"
type = "relay"
protocol = "esphome"
address = "attic/switch/fan"

[[devices]]
id = "shed-lock"
type = "lock"
protocol = "esphome"
address = "attic/lock/shed"

[[devices]]
id = "skylight"
type = "curtain"
protocol = "esphome"
address = "attic/cover/skylight"
`

func newESPHomeRig(t *testing.T, jammed bool) (*rig, *simulator.ESPHome) {
	t.Helper()
	r := newEcoRig(t, nil, esphomeRegistry)
	n, err := simulator.StartESPHome(t.Context(), simulator.ESPHomeConfig{
		Conn: simulator.Conn{Broker: r.broker.URL()}, Name: "attic",
		Entities: []simulator.ESPHomeEntity{
			{Type: "switch", ObjectID: "fan"}, {Type: "lock", ObjectID: "shed", Jammed: jammed}, {Type: "cover", ObjectID: "skylight"},
		},
		WiFiFaults: simulator.WiFiFaults{Delay: 30 * time.Millisecond, Travel: 300 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	waitUntil(t, r.client, "fan", "first state", func() bool { _, ok := r.client.State("fan"); return ok })
	return r, n
}

func TestESPHomeCommandConfirmedByTheEntitysState(t *testing.T) {
	r, n := newESPHomeRig(t, false)
	if _, err := r.run(t, devices.KindCommand, z2mCommand(t, "c1", "fan", "turn_on", nil, 1)); err != nil {
		t.Fatal(err)
	}
	if n.State("fan")["state"] != "ON" {
		t.Errorf("fan %v", n.State("fan"))
	}
	// The fan is on: ESPHome publishes nothing for a command that changes
	// nothing, and the step is done on its last report, without a command.
	if _, err := r.run(t, devices.KindCommand, z2mCommand(t, "c2", "fan", "turn_on", nil, 1)); err != nil {
		t.Fatal(err)
	}
	if got := n.Applied(); len(got) != 1 {
		t.Errorf("applied %q, want the one command that changed the fan", got)
	}
}

func TestESPHomeJammedLockFailsAtOnce(t *testing.T) {
	r, _ := newESPHomeRig(t, true)
	start := time.Now()
	_, err := r.run(t, devices.KindCommand, z2mCommand(t, "c1", "shed-lock", "unlock", nil, 1))
	var se *driver.StepError
	if !errors.As(err, &se) || se.Code != "jammed" || se.Class != driver.Permanent {
		t.Fatalf("err %v, want a permanent jammed error", err)
	}
	if took := time.Since(start); took > 900*time.Millisecond {
		t.Errorf("took %v: waited for the ack timeout, not the JAMMED report", took)
	}
}

func TestESPHomeCoverConfirmedWhenItStops(t *testing.T) {
	r, n := newESPHomeRig(t, false)
	start := time.Now()
	out, err := r.run(t, devices.KindCommand, z2mCommand(t, "c1", "skylight", "set_position", map[string]any{"position": 60}, 1))
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 150*time.Millisecond {
		t.Errorf("confirmed after %v, before its travel", took)
	}
	// ESPHome reports the position and the movement on two topics: the
	// position at the target confirms, whichever comes first.
	if st := out["state"].(map[string]any); st["position"] != int64(60) || st["moving"] == true || n.Position() != 60 {
		t.Errorf("state %v, node at %d", st, n.Position())
	}
}

func TestESPHomeNodeWillTakesItsEntitiesOffline(t *testing.T) {
	r, n := newESPHomeRig(t, false)
	waitUntil(t, r.client, "fan", "online", func() bool { return r.client.Available("fan") })
	n.Kill()
	waitUntil(t, r.client, "shed-lock", "offline", func() bool { return !r.client.Available("shed-lock") })
}
