package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/testkit"
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
	// Asked of the API, not of the event feed: the feed is advisory
	// (QoS 0, and it drops events when hundreds of missions move at once,
	// as here after the restart), the store is the record.
	left := append([]string(nil), ids...)
	testkit.Until(t, 60*time.Second, func() error { // polling another process's API
		var rest []string
		var d api.MissionDetail
		for _, id := range left {
			if code := e.get("/api/missions/"+id, &d); code != 200 || d.Mission == nil || d.Mission.State != driver.StateSucceeded {
				rest = append(rest, id)
			}
		}
		if left = rest; len(left) > 0 {
			e.get("/api/missions/"+left[0], &d)
			return fmt.Errorf("%d missions not SUCCEEDED after the restart, e.g. %s: %+v", len(left), left[0], d.Mission)
		}
		return nil
	})
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

// TestSIGKILLDuringGroupResendsOnlyUnfinishedBranches: all_off's first
// group turns three lights off at once; the living-room light acks
// after 10 ms, the other two after 1 s. The agent is killed with SIGKILL
// once the living-room light's branch has succeeded. The next start
// re-sends only the two unfinished branches, with their original
// command IDs: every device applies its command exactly once, the
// living-room light receives it once, and the mission succeeds.
func TestSIGKILLDuringGroupResendsOnlyUnfinishedBranches(t *testing.T) {
	e := newEnv(t, "")
	p := e.start()
	e.setFaults("living-light", simulator.Faults{AckDelay: 10 * time.Millisecond})
	for _, id := range []string{"kitchen-light", "bedroom-light"} {
		e.setFaults(id, simulator.Faults{AckDelay: time.Second})
	}
	r := e.trigger("all_off", "r-group-kill", nil)
	id := r["mission_id"].(string)
	e.waitEvent(id, func(ev agent.EventMessage) bool {
		return ev.Input == driver.InStepOK && ev.StepID == "lights.living-light"
	}, 20*time.Second)
	p.stop(t, syscall.SIGKILL)
	e.start()
	e.waitState(id, driver.StateSucceeded, 30*time.Second)
	for _, dev := range []string{"living-light", "kitchen-light", "bedroom-light", "living-ac", "living-speaker"} {
		if c := e.device(dev).Counters(); c.Applied != 1 {
			t.Errorf("%s applied %d effects, want 1 (%+v)", dev, c.Applied, c)
		}
	}
	if c := e.device("living-light").Counters(); c.Received != 1 {
		t.Errorf("living-light received %d commands, want 1: its finished branch was sent again (%+v)", c.Received, c)
	}
	var d api.MissionDetail
	e.get("/api/missions/"+id, &d)
	for k, st := range d.Mission.Steps {
		cmd := fmt.Sprintf("%s-0-%d", id, k)
		dev := strings.TrimPrefix(strings.TrimPrefix(st.ID, "lights."), "comfort.")
		if n := e.device(dev).Applied(cmd); n != 1 {
			t.Errorf("%s applied %s %d times, want once (the re-sent branch keeps its command ID)", dev, cmd, n)
		}
	}
	recovered := false
	for _, ev := range d.Timeline {
		recovered = recovered || ev.Input == driver.InRecover
	}
	if !recovered {
		t.Error("no recover event on the timeline")
	}
}
