package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/agent/agenttest"
	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/broker/passwd"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/mqttc"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/simulator"
)

// z2mHomeScenes drive the Zigbee2MQTT devices of the mixed demo home
// (configs/mixed/devices.toml).
const z2mHomeScenes = `
[[scene]]
name = "z_home"
deadline = "30s"
[[scene.step]]
id = "light"
device = "hall-light"
action = "turn_on"
params = { brightness = 60 }
compensate = "restore"
[[scene.step]]
id = "blind"
device = "living-blind"
action = "set"
params = { position = 80 }
compensate = "restore"
[[scene.step]]
id = "door"
device = "front-door"
action = "unlock"
retry = { max_attempts = 2, initial_backoff = "20ms" }

[[scene]]
name = "z_away"
deadline = "30s"
[[scene.step]]
device = "hall-light"
action = "turn_off"
[[scene.step]]
device = "living-blind"
action = "set"
params = { position = 10 }
[[scene.step]]
device = "front-door"
action = "lock"
`

// TestGoHomeOnZigbee2MQTTDevices runs scenes over real TCP on devices
// behind a simulated Zigbee2MQTT bridge, on the embedded broker and on
// Debian's mosquitto: a run succeeds with the devices in the state it
// asked; a run whose third step fails (a jammed lock) undoes the first
// two to the state the devices really had before; and a step for a
// device whose bridge went away waits, and ends well once it is back.
func TestGoHomeOnZigbee2MQTTDevices(t *testing.T) {
	for _, bk := range []string{"embedded", "mosquitto"} {
		t.Run(bk, func(t *testing.T) {
			reg, cat := agenttest.Scenes(t, "configs/mixed/devices.toml", z2mHomeScenes)
			ends := newEnds()
			opts := agent.Options{
				Gateway: "z2m", DataDir: filepath.Join(t.TempDir(), "data"), Registry: reg, Catalog: cat,
				Broker:        agent.BrokerOptions{Embedded: true, Listen: "127.0.0.1:0", AckTimeout: 5 * time.Second},
				Driver:        agent.DriverOptions{StepTimeout: 20 * time.Second, StopGrace: time.Second},
				Observers:     []driver.Observer{ends},
				QuietMissions: true,
			}
			if bk == "mosquitto" {
				opts.Broker = agent.BrokerOptions{URL: brokertest.Mosquitto(t), AckTimeout: 5 * time.Second}
			}
			a := agenttest.Start(t, opts)
			url := a.Addrs().BrokerURL
			bridge := func() *simulator.Zigbee2MQTT {
				z, err := simulator.StartZigbee2MQTT(t.Context(), simulator.Z2MConfig{
					Broker: url, Timeout: 200 * time.Millisecond, Seed: 7,
					Devices: []simulator.Z2MDevice{
						{Name: "Hall/Ceiling", Kind: "light", Delay: 50 * time.Millisecond, Jitter: 100 * time.Millisecond},
						{Name: "Living/Blind", Kind: "cover", Delay: 50 * time.Millisecond, Travel: 200 * time.Millisecond},
						{Name: "Front door", Kind: "lock", Delay: 300 * time.Millisecond},
						{Name: "Living/Radiator", Kind: "thermostat", Delay: 100 * time.Millisecond},
					},
				})
				if err != nil {
					t.Fatal(err)
				}
				return z
			}
			z := bridge()
			t.Cleanup(func() { z.Close() })
			app := triggerClient(t, url)
			trigger := func(scene, req string) {
				t.Helper()
				payload := fmt.Appendf(nil, `{"scene":%q,"request_id":%q}`, scene, req)
				if err := app.Publish(a.Addrs().TriggerTopic, payload, false, 1); err != nil {
					t.Fatal(err)
				}
			}

			trigger("z_away", "r0")
			if got := ends.await(t, "z_away"); got != driver.StateSucceeded {
				t.Fatalf("z_away ended %s: %q", got, ends.failures())
			}
			trigger("z_home", "r1")
			if got := ends.await(t, "z_home"); got != driver.StateSucceeded {
				t.Fatalf("z_home ended %s", got)
			}
			if st := z.State("Hall/Ceiling"); st["state"] != "ON" || st["brightness"] != 152.0 {
				t.Errorf("bulb %v, want ON at 152 of 254 (60%%)", st)
			}
			if st := z.State("Living/Blind"); st["position"] != 80.0 || st["moving"] != "STOP" {
				t.Errorf("blind %v, want stopped at 80", st)
			}
			if st := z.State("Front door"); st["lock_state"] != "unlocked" {
				t.Errorf("door %v, want unlocked", st)
			}

			trigger("z_away", "r2")
			if got := ends.await(t, "z_away"); got != driver.StateSucceeded {
				t.Fatalf("z_away ended %s", got)
			}
			z.SetFaults("Front door", 0, 0, true)
			trigger("z_home", "r3")
			if got := ends.await(t, "z_home"); got != driver.StateFailed {
				t.Fatalf("z_home with a jammed lock ended %s, want FAILED", got)
			}
			if st := z.State("Hall/Ceiling"); st["state"] != "OFF" {
				t.Errorf("bulb %v after the undo, want OFF as before the run", st)
			}
			if st := z.State("Living/Blind"); st["position"] != 10.0 {
				t.Errorf("blind %v after the undo, want back at 10", st)
			}
			if st := z.State("Front door"); st["lock_state"] != "locked" {
				t.Errorf("door %v, want still locked", st)
			}

			// The bridge goes away: its devices are offline, and a run
			// waits for them instead of spending its attempts.
			z.Kill()
			waitOffline(t, a, "hall-light")
			trigger("z_home", "r4")
			ends.notYet(t, "z_home", 300*time.Millisecond)
			z = bridge()
			t.Cleanup(func() { z.Close() })
			// The new bridge's lock is not jammed: the run ends well.
			if got := ends.await(t, "z_home"); got != driver.StateSucceeded {
				t.Fatalf("z_home after the bridge came back ended %s", got)
			}
			if st := z.State("Hall/Ceiling"); st["state"] != "ON" {
				t.Errorf("bulb %v, want ON once the bridge was back", st)
			}
		})
	}
}

// ends records the terminal state of each mission, by scene.
type ends struct {
	mu   sync.Mutex
	errs []string
	ch   map[string]chan driver.State
	seen map[string]bool
}

func newEnds() *ends { return &ends{ch: map[string]chan driver.State{}, seen: map[string]bool{}} }

func (e *ends) of(scene string) chan driver.State {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ch[scene] == nil {
		e.ch[scene] = make(chan driver.State, 16)
	}
	return e.ch[scene]
}

func (e *ends) Observe(ev driver.Event, m *driver.Mission) {
	if ev.Input == driver.InStepError {
		e.mu.Lock()
		e.errs = append(e.errs, fmt.Sprintf("%s %s: %s %s", m.Type, ev.StepID, ev.Code, ev.Error))
		e.mu.Unlock()
	}
	if ev.To.Terminal() {
		e.of(m.Type) <- ev.To
	}
}

// failures lists the step errors seen, for a failing test's message.
func (e *ends) failures() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.errs...)
}

func (e *ends) await(t *testing.T, scene string) driver.State {
	t.Helper()
	select {
	case s := <-e.of(scene):
		return s
	case <-time.After(30 * time.Second):
		t.Fatalf("no %s run ended in 30s", scene)
		return ""
	}
}

// notYet checks that no run of scene ends within d: a bounded wait for
// an event that must not come.
func (e *ends) notYet(t *testing.T, scene string, d time.Duration) {
	t.Helper()
	select {
	case s := <-e.of(scene):
		t.Fatalf("a %s run ended %s while its devices were offline", scene, s)
	case <-time.After(d):
	}
}

func triggerClient(t *testing.T, url string) *mqttc.Client {
	t.Helper()
	c, err := mqttc.New(mqttc.Options{Broker: url, ClientID: "z2m-test-app"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := c.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func waitOffline(t *testing.T, a *agenttest.Agent, id string) {
	t.Helper()
	// Nothing signals the agent's view of a device to a test: polled.
	testkit.Eventually(t, 10*time.Second, id+" offline to the agent", func() bool {
		for _, d := range a.Heartbeat(context.Background()).Devices {
			if d.ID == id && !d.Online {
				return true
			}
		}
		return false
	})
}

// TestDiscoverThroughTheAPIProposesOnlyNewDevices: the mixed demo's
// registry on an agent with its API, a Zigbee2MQTT bridge with the
// registry's devices and one just paired: POST /api/devices/discover
// proposes the new bulb, with a type, and lists the others as known;
// GET /api/devices lists it as announced and not in the registry.
func TestDiscoverThroughTheAPIProposesOnlyNewDevices(t *testing.T) {
	reg, cat := agenttest.Scenes(t, "configs/mixed/devices.toml", z2mHomeScenes)
	a := agenttest.Start(t, agent.Options{
		Gateway: "disc", DataDir: filepath.Join(t.TempDir(), "data"), Registry: reg, Catalog: cat,
		Broker: agent.BrokerOptions{Embedded: true, Listen: "127.0.0.1:0"},
		HTTP:   agent.HTTPOptions{Listen: "127.0.0.1:0"}, QuietMissions: true,
	})
	z, err := simulator.StartZigbee2MQTT(t.Context(), simulator.Z2MConfig{Broker: a.Addrs().BrokerURL, Devices: []simulator.Z2MDevice{
		{Name: "Hall/Ceiling", Kind: "light"}, {Name: "Front door", Kind: "lock"}, {Name: "Porch/Light", Kind: "light"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(z.Close)
	c := &api.Client{Base: a.Addrs().API}
	var res api.DiscoverResult
	if _, err := c.Call(t.Context(), "POST", "/api/devices/discover", api.DiscoverRequest{Seconds: 1}, &res); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`# already in the registry: hall-light (zigbee2mqtt "Hall/Ceiling")`, `id = "porch-light"`, `address = "Porch/Light"`, "[types.light_ct]"} {
		if !strings.Contains(res.TOML, want) {
			t.Errorf("the proposal lacks %q:\n%s", want, res.TOML)
		}
	}
	if strings.Count(res.TOML, "[[devices]]") != 1 {
		t.Errorf("want exactly the new bulb proposed:\n%s", res.TOML)
	}
	if _, err := c.Call(t.Context(), "POST", "/api/devices/discover", api.DiscoverRequest{Seconds: 90}, nil); err == nil || !strings.Contains(err.Error(), "1 to 60") {
		t.Errorf("a 90 s window: %v, want it refused", err)
	}
	// The agent follows the announcements as it runs: GET /api/devices
	// lists the bulb the registry does not name.
	var list api.DeviceList
	if _, err := c.Call(t.Context(), "GET", "/api/devices", nil, &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Announced) != 1 || list.Announced[0].Found.Address != "Porch/Light" || list.Announced[0].Gone {
		t.Errorf("announced: %+v, want the new bulb", list.Announced)
	}
}

// TestHomeAssistantRunsScenesFromItsButtons: with Home Assistant
// discovery on, the agent announces a button and a sensor per scene
// (retained, available while it runs), removes the entities of a scene
// it no longer has, runs a scene when its button is pressed, and
// publishes the run's outcome on the scene's sensor.
func TestHomeAssistantRunsScenesFromItsButtons(t *testing.T) {
	reg, cat := agenttest.Scenes(t, "configs/mixed/devices.toml", z2mHomeScenes)
	b := brokertest.Start(t)
	ha := triggerClient(t, b.URL())
	// A scene of an earlier configuration, announced then.
	if err := ha.Publish("homeassistant/button/sortie_ha/old_scene/config", []byte(`{"name":"old_scene"}`), true, 1); err != nil {
		t.Fatal(err)
	}
	seen := make(chan [2]string, 64)
	if _, err := ha.Subscribe("homeassistant/#", func(topic string, p []byte) { seen <- [2]string{topic, string(p)} }); err != nil {
		t.Fatal(err)
	}
	states := make(chan string, 16)
	if _, err := ha.Subscribe("sortie/gateways/ha/ha/scene/z_away", func(_ string, p []byte) { states <- string(p) }); err != nil {
		t.Fatal(err)
	}
	ends := newEnds()
	agenttest.Start(t, agent.Options{
		Gateway: "ha", DataDir: filepath.Join(t.TempDir(), "data"), Registry: reg, Catalog: cat,
		Broker:        agent.BrokerOptions{URL: b.URL(), AckTimeout: 5 * time.Second},
		HomeAssistant: &agent.HomeAssistantOptions{Version: "test"}, Observers: []driver.Observer{ends}, QuietMissions: true,
	})
	z, err := simulator.StartZigbee2MQTT(t.Context(), simulator.Z2MConfig{Broker: b.URL(), Devices: []simulator.Z2MDevice{
		{Name: "Hall/Ceiling", Kind: "light"}, {Name: "Living/Blind", Kind: "cover"}, {Name: "Front door", Kind: "lock"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(z.Close)
	want := map[string]bool{
		"homeassistant/button/sortie_ha/z_home/config": false, "homeassistant/sensor/sortie_ha/z_home_last/config": false,
		"homeassistant/button/sortie_ha/z_away/config": false, "homeassistant/sensor/sortie_ha/z_away_last/config": false,
	}
	removed := false
	var button map[string]any
	for deadline := time.After(10 * time.Second); !removed || slices.Contains(slices.Collect(maps.Values(want)), false); {
		select {
		case m := <-seen:
			if _, ok := want[m[0]]; ok && m[1] != "" {
				want[m[0]] = true
				if m[0] == "homeassistant/button/sortie_ha/z_away/config" {
					if err := json.Unmarshal([]byte(m[1]), &button); err != nil {
						t.Fatal(err)
					}
				}
			}
			if m[0] == "homeassistant/button/sortie_ha/old_scene/config" && m[1] == "" {
				removed = true
			}
		case <-deadline:
			t.Fatalf("configs seen %v, old scene removed %v", want, removed)
		}
	}
	if button["avty_t"] != "sortie/gateways/ha/ha/availability" || button["pl_prs"] != "PRESS" {
		t.Errorf("button config %v", button)
	}
	cmd, _ := button["cmd_t"].(string)
	if err := ha.Publish(cmd, []byte("PRESS"), false, 1); err != nil {
		t.Fatal(err)
	}
	if got := ends.await(t, "z_away"); got != driver.StateSucceeded {
		t.Fatalf("z_away from its button ended %s: %q", got, ends.failures())
	}
	s := testkit.Receive(t, states, 10*time.Second, "no state on the scene's sensor")
	var st map[string]any
	if err := json.Unmarshal([]byte(s), &st); err != nil || st["state"] != "SUCCEEDED" || st["source"] != "homeassistant" {
		t.Errorf("the sensor's state %s", s)
	}
}

// TestEcosystemDevicesLogInWithTheirOwnRoles: with the embedded broker's
// access control on, a Zigbee2MQTT bridge, a Tasmota and a Shelly log in
// with their own users and roles, and scenes on them succeed: each may
// do what its firmware does, within its own topics.
func TestEcosystemDevicesLogInWithTheirOwnRoles(t *testing.T) {
	reg, cat := agenttest.Scenes(t, "configs/mixed/devices.toml", z2mHomeScenes+`
[[scene]]
name = "wifi_on"
[[scene.step]]
devices = ["desk-lamp", "garden-pump"]
action = "turn_on"
`)
	hash := func(pw string) string {
		h, err := passwd.HashCost(pw, 1000)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	ends := newEnds()
	a := agenttest.Start(t, agent.Options{
		Gateway: "acl", DataDir: filepath.Join(t.TempDir(), "data"), Registry: reg, Catalog: cat,
		Broker: agent.BrokerOptions{Embedded: true, Listen: "127.0.0.1:0", AckTimeout: 5 * time.Second, Users: []agent.BrokerUser{
			{Name: "bridge", Role: agent.RoleZigbee2MQTT, PasswordHash: hash("bridge-pw")},
			{Name: "lamp", Role: agent.RoleTasmota, Scope: "tasmota_5E1A2B", PasswordHash: hash("lamp-pw")},
			{Name: "pump", Role: agent.RoleShelly, Scope: "shellyplus1-4855199bc0e8", PasswordHash: hash("pump-pw")},
			{Name: "app", Role: agent.RoleApp, PasswordHash: hash("app-pw")},
		}},
		Observers: []driver.Observer{ends}, QuietMissions: true,
	})
	url := a.Addrs().BrokerURL
	z, err := simulator.StartZigbee2MQTT(t.Context(), simulator.Z2MConfig{Broker: url, Username: "bridge", Password: "bridge-pw",
		Devices: []simulator.Z2MDevice{{Name: "Hall/Ceiling", Kind: "light"}, {Name: "Living/Blind", Kind: "cover"}, {Name: "Front door", Kind: "lock"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(z.Close)
	lamp, err := simulator.StartTasmota(t.Context(), simulator.TasmotaConfig{Conn: simulator.Conn{Broker: url, Username: "lamp", Password: "lamp-pw"},
		Topic: "tasmota_5E1A2B", Kind: "dimmer"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lamp.Close)
	pump, err := simulator.StartShelly(t.Context(), simulator.ShellyConfig{Conn: simulator.Conn{Broker: url, Username: "pump", Password: "pump-pw"},
		ID: "shellyplus1-4855199bc0e8", Kind: "switch"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pump.Close)
	app, err := mqttc.New(mqttc.Options{Broker: url, ClientID: "acl-app", Username: "app", Password: "app-pw"})
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := app.Connect(cctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(app.Close)
	for _, scene := range []string{"z_away", "wifi_on"} {
		if err := app.Publish(a.Addrs().TriggerTopic, fmt.Appendf(nil, `{"scene":%q,"request_id":"acl-%s"}`, scene, scene), false, 1); err != nil {
			t.Fatal(err)
		}
		if got := ends.await(t, scene); got != driver.StateSucceeded {
			t.Fatalf("%s ended %s: %q", scene, got, ends.failures())
		}
	}
	if !lamp.Power() || !pump.On() {
		t.Errorf("lamp on %v, pump on %v", lamp.Power(), pump.On())
	}
}

// wifiScenes drive the mixed home's Wi-Fi devices: a Tasmota dimmer, a
// Shelly relay and an ESPHome node's switch and cover.
const wifiScenes = `
[[scene]]
name = "wifi_on"
deadline = "30s"
[[scene.step]]
device = "desk-lamp"
action = "turn_on"
params = { brightness = 70 }
compensate = "restore"
[[scene.step]]
device = "garden-pump"
action = "turn_on"
compensate = "restore"
[[scene.step]]
device = "garage-light"
action = "turn_on"

[[scene]]
name = "wifi_door"
deadline = "30s"
[[scene.step]]
device = "desk-lamp"
action = "turn_off"
compensate = "restore"
[[scene.step]]
device = "garden-pump"
action = "turn_off"
compensate = "restore"
[[scene.step]]
device = "garage-door"
action = "open"
ack_timeout = "300ms"
retry = { max_attempts = 1 }
`

// TestScenesOnWiFiDevicesOnEveryBroker runs scenes on a Tasmota, a
// Shelly and an ESPHome node over real TCP, on the embedded broker and
// on Debian's mosquitto: a run succeeds with the devices where it asked;
// a run whose third step fails (a garage door slower than its step
// allows) undoes the first two to the state they really had; a step for
// a device that went away waits, and ends well once it is back.
func TestScenesOnWiFiDevicesOnEveryBroker(t *testing.T) {
	for _, bk := range []string{"embedded", "mosquitto"} {
		t.Run(bk, func(t *testing.T) {
			reg, cat := agenttest.Scenes(t, "configs/mixed/devices.toml", wifiScenes)
			ends := newEnds()
			opts := agent.Options{
				Gateway: "wifi", DataDir: filepath.Join(t.TempDir(), "data"), Registry: reg, Catalog: cat,
				Broker:    agent.BrokerOptions{Embedded: true, Listen: "127.0.0.1:0", AckTimeout: 5 * time.Second},
				Observers: []driver.Observer{ends}, QuietMissions: true,
			}
			if bk == "mosquitto" {
				opts.Broker = agent.BrokerOptions{URL: brokertest.Mosquitto(t), AckTimeout: 5 * time.Second}
			}
			a := agenttest.Start(t, opts)
			conn := simulator.Conn{Broker: a.Addrs().BrokerURL}
			wifi := simulator.WiFiFaults{Delay: 50 * time.Millisecond, Jitter: 100 * time.Millisecond}
			lamp, err := simulator.StartTasmota(t.Context(), simulator.TasmotaConfig{Conn: conn, Topic: "tasmota_5E1A2B", Kind: "dimmer", WiFiFaults: wifi, Dimmer: 30})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(lamp.Close)
			pump, err := simulator.StartShelly(t.Context(), simulator.ShellyConfig{Conn: conn, ID: "shellyplus1-4855199bc0e8", Kind: "switch", WiFiFaults: wifi})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pump.Close)
			nodeCfg := simulator.ESPHomeConfig{Conn: conn, Name: "garage-node", WiFiFaults: simulator.WiFiFaults{Delay: 50 * time.Millisecond, Travel: 2 * time.Second},
				Entities: []simulator.ESPHomeEntity{{Type: "switch", ObjectID: "garage_light"}, {Type: "cover", ObjectID: "garage_door"}}}
			node, err := simulator.StartESPHome(t.Context(), nodeCfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { node.Close() })
			app := triggerClient(t, a.Addrs().BrokerURL)
			run := func(scene, req string) driver.State {
				t.Helper()
				if err := app.Publish(a.Addrs().TriggerTopic, fmt.Appendf(nil, `{"scene":%q,"request_id":%q}`, scene, req), false, 1); err != nil {
					t.Fatal(err)
				}
				return ends.await(t, scene)
			}

			if got := run("wifi_on", "w1"); got != driver.StateSucceeded {
				t.Fatalf("wifi_on ended %s: %q", got, ends.failures())
			}
			if !lamp.Power() || lamp.Dimmer() != 70 || !pump.On() || node.State("garage_light")["state"] != "ON" {
				t.Errorf("after wifi_on: lamp %v/%d, pump %v, garage light %v", lamp.Power(), lamp.Dimmer(), pump.On(), node.State("garage_light"))
			}
			// The door needs 2 s, its step allows 300 ms once: the run
			// fails, and the lamp and the pump go back on, as they were.
			if got := run("wifi_door", "w2"); got != driver.StateFailed {
				t.Fatalf("wifi_door ended %s, want FAILED", got)
			}
			if !lamp.Power() || !pump.On() {
				t.Errorf("after the undo: lamp on %v, pump on %v; want both back on", lamp.Power(), pump.On())
			}
			if pump.Toggles() != 0 {
				t.Errorf("the pump got %d toggles", pump.Toggles())
			}

			// The node goes away: its light's step waits until it is back.
			node.Kill()
			waitOffline(t, a, "garage-light")
			if err := app.Publish(a.Addrs().TriggerTopic, []byte(`{"scene":"wifi_on","request_id":"w3"}`), false, 1); err != nil {
				t.Fatal(err)
			}
			ends.notYet(t, "wifi_on", 300*time.Millisecond)
			if node, err = simulator.StartESPHome(t.Context(), nodeCfg); err != nil {
				t.Fatal(err)
			}
			if got := ends.await(t, "wifi_on"); got != driver.StateSucceeded {
				t.Fatalf("wifi_on after the node came back ended %s: %q", got, ends.failures())
			}
		})
	}
}
