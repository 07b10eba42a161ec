package agent_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/agent/agenttest"
	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/scenes"
	"github.com/sortie-edge/sortie/simulator"
)

// haWorkshop is a DIY board known to Home Assistant: the mixed demo's
// fan and lamp (configs/mixed/devices.toml) and a lock that jams.
const haWorkshop = `
[[devices]]
id = "workshop-door"
type = "lock"
protocol = "homeassistant"
address = "lock/workshop/door"
config = { command_topic = "workshop/door/set", state_topic = "workshop/door/state", availability_topic = "workshop/availability" }
`

const haScenes = `
[[scene]]
name = "ha_on"
deadline = "30s"
[[scene.step]]
device = "workshop-lamp"
action = "turn_on"
params = { brightness = 40 }
compensate = "restore"
[[scene.step]]
device = "workshop-fan"
action = "turn_on"
compensate = "restore"

[[scene]]
name = "ha_open"
deadline = "30s"
[[scene.step]]
device = "workshop-lamp"
action = "turn_off"
compensate = "restore"
[[scene.step]]
device = "workshop-fan"
action = "turn_off"
compensate = "restore"
[[scene.step]]
device = "workshop-door"
action = "unlock"
`

// TestScenesOnHomeAssistantDevicesOnEveryBroker runs scenes on a device
// described by Home Assistant discovery configs over real TCP, on the
// embedded broker and on Debian's mosquitto: a run succeeds with the
// device where it asked; a run whose third step fails (a lock reporting
// JAMMED) undoes the first two to the state they really had; a step for
// a device that went away waits, and ends well once it is back.
func TestScenesOnHomeAssistantDevicesOnEveryBroker(t *testing.T) {
	for _, bk := range []string{"embedded", "mosquitto"} {
		t.Run(bk, func(t *testing.T) {
			src, err := os.ReadFile("../configs/mixed/devices.toml")
			if err != nil {
				t.Fatal(err)
			}
			reg, err := devices.ParseRegistry(append(src, haWorkshop...), "devices.toml")
			if err != nil {
				t.Fatal(err)
			}
			cat, err := scenes.Parse([]byte(haScenes), "scenes.toml", reg)
			if err != nil {
				t.Fatal(err)
			}
			ends := newEnds()
			opts := agent.Options{
				Gateway: "ha", DataDir: filepath.Join(t.TempDir(), "data"), Registry: reg, Catalog: cat,
				Broker:    agent.BrokerOptions{Embedded: true, Listen: "127.0.0.1:0", AckTimeout: 3 * time.Second},
				Observers: []driver.Observer{ends}, QuietMissions: true,
			}
			if bk == "mosquitto" {
				opts.Broker = agent.BrokerOptions{URL: brokertest.Mosquitto(t), AckTimeout: 3 * time.Second}
			}
			a := agenttest.Start(t, opts)
			cfg := simulator.HAConfig{Conn: simulator.Conn{Broker: a.Addrs().BrokerURL}, Name: "workshop",
				WiFiFaults: simulator.WiFiFaults{Delay: 50 * time.Millisecond, Jitter: 150 * time.Millisecond},
				Entities: []simulator.HAEntity{{Type: "switch", ObjectID: "fan"}, {Type: "light", ObjectID: "lamp"},
					{Type: "lock", ObjectID: "door", Jammed: true}}}
			board, err := simulator.StartHA(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { board.Close() })
			app := triggerClient(t, a.Addrs().BrokerURL)
			trigger := func(scene, req string) {
				t.Helper()
				if err := app.Publish(a.Addrs().TriggerTopic, fmt.Appendf(nil, `{"scene":%q,"request_id":%q}`, scene, req), false, 1); err != nil {
					t.Fatal(err)
				}
			}

			trigger("ha_on", "h1")
			if got := ends.await(t, "ha_on"); got != driver.StateSucceeded {
				t.Fatalf("ha_on ended %s: %q", got, ends.failures())
			}
			if lamp, fan := board.State("lamp"), board.State("fan"); lamp["state"] != "ON" || lamp["brightness"] != 102 || fan["state"] != "ON" {
				t.Errorf("after ha_on: lamp %v, fan %v", lamp, fan)
			}
			// The lock jams: the run fails, and the lamp and the fan go
			// back on, the lamp at the level it had.
			trigger("ha_open", "h2")
			if got := ends.await(t, "ha_open"); got != driver.StateFailed {
				t.Fatalf("ha_open ended %s, want FAILED", got)
			}
			if lamp, fan := board.State("lamp"), board.State("fan"); lamp["state"] != "ON" || lamp["brightness"] != 102 || fan["state"] != "ON" {
				t.Errorf("after the undo: lamp %v, fan %v; want both back on, the lamp at 102", lamp, fan)
			}

			// The board goes away: the scene waits until it is back.
			board.Kill()
			waitOffline(t, a, "workshop-fan")
			trigger("ha_on", "h3")
			ends.notYet(t, "ha_on", 300*time.Millisecond)
			if board, err = simulator.StartHA(t.Context(), cfg); err != nil {
				t.Fatal(err)
			}
			if got := ends.await(t, "ha_on"); got != driver.StateSucceeded {
				t.Fatalf("ha_on after the board came back ended %s: %q", got, ends.failures())
			}
		})
	}
}
