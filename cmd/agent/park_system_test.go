package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/simulator"
)

// TestSIGKILLWithHundredsParked: 300 missions on three lights that ack
// after 20 ms and take one command at a time, so that nearly all of
// them are parked (waiting for their turn or their ack, holding no
// worker) when the agent is killed with SIGKILL. The next start recovers
// every one: each mission succeeds, and each light applies each command
// exactly once, although the commands in flight at the kill are sent
// again (with their original IDs).
func TestSIGKILLWithHundredsParked(t *testing.T) {
	lights := []string{"living-light", "kitchen-light", "bedroom-light"}
	e := newBareEnv(t, "test")
	e.scenes = filepath.Join(e.dir, "scenes")
	var sc strings.Builder
	for _, l := range lights {
		fmt.Fprintf(&sc, "[[scene]]\nname = \"on-%s\"\nmode = \"parallel\"\n[[scene.step]]\ndevice = %q\naction = \"turn_on\"\nack_timeout = \"5s\"\n\n", l, l)
	}
	writeFile(t, filepath.Join(e.scenes, "lights.toml"), sc.String())
	e.broker = brokertest.Start(t)
	e.connect(e.broker.URL())
	e.writeConfig(fmt.Sprintf("embedded = false\nurl = %q\n", e.broker.URL()), "")
	for _, l := range lights {
		e.setFaults(l, simulator.Faults{AckDelay: 20 * time.Millisecond})
	}
	p := e.start()
	const perLight = 100
	var ids []string
	for i := range perLight {
		for _, l := range lights {
			r := e.trigger("on-"+l, fmt.Sprintf("r-%s-%d", l, i), nil)
			ids = append(ids, r["mission_id"].(string))
		}
	}
	// Kill once a few are done: the rest are parked or in flight.
	e.waitState(ids[15], driver.StateSucceeded, 30*time.Second)
	p.stop(t, syscall.SIGKILL)
	e.start()
	for _, id := range ids {
		e.waitState(id, driver.StateSucceeded, 60*time.Second)
	}
	for _, l := range lights {
		d := e.device(l)
		if c := d.Counters(); c.Applied != perLight {
			t.Errorf("%s applied %d commands, want %d, one per mission (%+v)", l, c.Applied, perLight, c)
		}
	}
	for _, id := range ids {
		for _, l := range lights {
			if n := e.device(l).Applied(id + "-0-0"); n > 1 {
				t.Errorf("%s applied command %s-0-0 %d times", l, id, n)
			}
		}
	}
	t.Logf("replayed after the restart: %d", e.device(lights[0]).Counters().Replayed+e.device(lights[1]).Counters().Replayed+e.device(lights[2]).Counters().Replayed)
}
