package agent_test

import (
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/simulator"
)

// TestLateAckEndsTheRetryWait: a device that acks after the step's ack
// timeout has still applied the command; its late ack ends the retry's
// backoff at once (here 20 s, and the test waits 15 s) and the
// retry completes from the remembered ack: the mission succeeds and the
// device applied the command once.
func TestLateAckEndsTheRetryWait(t *testing.T) {
	reg, devs := lights("late", 1, "", simulator.Faults{AckDelay: 450 * time.Millisecond}, "")
	scene := `[[scene]]
name = "slow-light"
deadline = "5m"
[[scene.step]]
device = "late-000"
action = "turn_on"
ack_timeout = "300ms"
retry = { max_attempts = 3, initial_backoff = "20s", max_backoff = "20s" }
`
	r := startSlowRig(t, slowHome{registry: reg, scenes: scene, devices: devs, workers: 4, timeout: time.Minute})
	start := time.Now()
	ids := r.submit(t, []string{"slow-light"}, 1)
	r.await(t, ids, 15*time.Second)
	t.Logf("ended %v after the trigger (ack after 450 ms, timeout 300 ms, backoff 20 s)", time.Since(start).Round(time.Millisecond))
	m, err := r.a.Driver().Get(t.Context(), ids[0])
	if err != nil {
		t.Fatal(err)
	}
	if m.State != driver.StateSucceeded || m.Results[0].Attempts != 2 {
		t.Errorf("mission %s after %d attempts, want SUCCEEDED after 2 (the timed-out one and its retry)", m.State, m.Results[0].Attempts)
	}
	if h := r.home.Device(devs[0].ID).History(); len(h) != 1 {
		t.Errorf("the device applied %d commands (%v), want 1", len(h), h)
	}
}
