package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/simulator"
)

// TestSIGKILLLoopWithDevicesOfOtherEcosystems is the SIGKILL loop on the
// mixed demo home (configs/mixed: a Zigbee2MQTT bridge, Tasmotas, a
// Shelly, an ESPHome node, a native light), simulated in the test
// process on a broker that outlives the agent, with go_home and
// leave_home triggered in turn while commands are in flight: every
// restart comes back, every mission ends, no request makes two
// missions, no device got a toggle (the only command whose repetition
// would undo itself), and a last leave_home leaves every device where
// it says, whatever the kills left half done.
func TestSIGKILLLoopWithDevicesOfOtherEcosystems(t *testing.T) {
	if testing.Short() {
		t.Skip("SIGKILLs the agent dozens of times")
	}
	// Its own broker, home and agent: it runs beside the other long loops.
	t.Parallel()
	var home *simulator.Home
	h := killHome{
		scenes: []string{"go_home", "leave_home"},
		start: func(e *testEnv, url string) {
			hc, err := simulator.LoadHome(testkit.RepoPath("configs/mixed/home.toml"))
			if err != nil {
				t.Fatal(err)
			}
			hc.Broker = url
			if home, err = simulator.NewHome(hc); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := home.Start(ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = home.Close() })
			e.devices, e.scenes, e.ackTimeout = testkit.RepoPath("configs/mixed/devices.toml"), testkit.RepoPath("configs/mixed/scenes"), "2s"
		},
		check: func(e *testEnv) {
			for _, d := range home.ShellyDevices() {
				if d.Toggles() != 0 {
					t.Errorf("shelly got %d toggles", d.Toggles())
				}
			}
			for _, d := range home.TasmotaDevices() {
				for _, c := range d.Applied() {
					if strings.Contains(strings.ToUpper(c), "TOGGLE") {
						t.Errorf("tasmota applied %q", c)
					}
				}
			}
			// The last word: leave_home, once every mission has ended.
			e.proc.mu.Lock()
			c := &api.Client{Base: "http://" + e.proc.http}
			e.proc.mu.Unlock()
			if _, err := c.Call(context.Background(), "POST", "/api/missions", api.SubmitRequest{Scene: "leave_home", RequestID: "final-leave"}, nil); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(time.Minute); ; {
				_, live := e.missionsByRequest()
				if live == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the final leave_home did not end in a minute")
				}
				time.Sleep(100 * time.Millisecond) // missions end by themselves; polled as an operator would
			}
			var list api.DeviceList
			e.get("/api/devices", &list)
			for _, d := range list.Devices {
				if slices.Contains([]string{"front-door", "living-radiator"}, d.ID) || d.State == nil {
					continue
				}
				if p, ok := d.State["power"]; ok && p != "off" {
					t.Errorf("%s is %v after the final leave_home", d.ID, d.State)
				}
			}
		},
	}
	t.Run("embedded", func(t *testing.T) { killLoop(t, brokertest.Start(t).URL(), *kills, h) })
}
