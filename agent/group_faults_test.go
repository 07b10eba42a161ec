package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/scenes"
	"github.com/sortie-edge/sortie/simulator"
)

// TestGroupPoliciesUnderSeededFaults runs a scene whose parallel group
// sets 10 lights, 1,000 times under each policy (500 under -race), with two of the ten
// lights faulty in each run (chosen by the run's seed: one offline, one
// rejecting every command as jammed), and checks every run's end:
//
//   - best_effort: the mission succeeds with reason
//     completed_with_errors, every light has an outcome (the 8 healthy
//     succeeded, the 2 faulty failed with an error), and the 8 healthy
//     lights are in the state the run asked for;
//   - all: the mission fails, every light that had succeeded is
//     compensated, and each is back in the state it had before the run.
//
// Runs go 20 at a time, each on its own 10 lights.
func TestGroupPoliciesUnderSeededFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("2,000 runs")
	}
	const lanes, perLane = 20, 10
	runs := 1000 // two runs each: one per policy
	if testkit.Race {
		runs = 500 // a new seed every run; `go test -run TestGroupPolicies ./agent` runs them all
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	var reg, sc strings.Builder
	var devs []simulator.DeviceConfig
	// ack_timeout is far above the lights' 5-25 ms: a run checks the
	// policies, and at a load average of 20 an undo's ack once took over
	// 5 s, failing the undo (its retry budget is the step's 120 ms).
	for l := range lanes {
		prefix := fmt.Sprintf("f%02d", l)
		r, ds := lights(prefix, perLane, "", simulator.Faults{AckDelay: 5 * time.Millisecond, AckJitter: 20 * time.Millisecond}, "")
		reg.WriteString(r)
		devs = append(devs, ds...)
		var ids []string
		for _, d := range ds {
			ids = append(ids, fmt.Sprintf("%q", d.ID))
		}
		for _, pol := range []string{"best_effort", "all"} {
			fmt.Fprintf(&sc, `[[scene]]
name = "%s-%s"
policy = %q
deadline = "30s"
[[scene.step]]
id = "g"
devices = [%s]
action = "set"
params = { power = "on", brightness = { from = "b" } }
compensate = "restore"
ack_timeout = "20s"
retry = { max_attempts = 2, initial_backoff = "20ms", max_elapsed = "120ms" }
`, pol, prefix, pol, strings.Join(ids, ", "))
		}
	}
	r := startSlowRig(t, slowHome{registry: reg.String(), scenes: sc.String(), devices: devs, workers: 16, timeout: time.Minute})
	byID := map[string]*simulator.Device{}
	for _, d := range r.home.Devices() {
		byID[d.ID()] = d
	}
	available := func(id string, want bool) {
		t.Helper()
		// Nothing signals the agent's view of a device to the test: poll
		// it, bounded.
		for range 5000 {
			for _, d := range r.a.Heartbeat(context.Background()).Devices {
				if d.ID == id && d.Online == want {
					return
				}
			}
			time.Sleep(2 * time.Millisecond)
		}
		t.Errorf("device %s never became available=%v to the agent", id, want)
	}
	var mu sync.Mutex
	var problems []string
	report := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(problems) < 20 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	var wg sync.WaitGroup
	for l := range lanes {
		wg.Go(func() {
			prefix := fmt.Sprintf("f%02d", l)
			for i := range runs * 2 / lanes {
				run := l*runs*2/lanes + i
				rng := rand.New(rand.NewPCG(seed, uint64(run)))
				policy := []string{"best_effort", "all"}[i%2]
				perm := rng.Perm(perLane)
				offline := byID[fmt.Sprintf("%s-%03d", prefix, perm[0])]
				jammed := byID[fmt.Sprintf("%s-%03d", prefix, perm[1])]
				before := map[string]map[string]any{}
				for k := range perLane {
					id := fmt.Sprintf("%s-%03d", prefix, k)
					before[id] = byID[id].State()
				}
				offline.SetOnline(false)
				available(offline.ID(), false)
				if err := jammed.SetFaults(simulator.Faults{Reject: "jammed"}); err != nil {
					t.Error(err)
					return
				}
				b := 1 + rng.IntN(100)
				var rep scenes.Reply
				params, _ := json.Marshal(map[string]any{"b": b})
				if _, err := r.a.API.Call(context.Background(), "POST", "/api/missions", api.SubmitRequest{
					Scene: policy + "-" + prefix, RequestID: fmt.Sprintf("run-%d", run), Params: params,
				}, &rep); err != nil {
					t.Error(err)
					return
				}
				select {
				case <-r.done(rep.MissionID):
				case <-time.After(time.Minute):
					report("run %d (%s): mission %s did not end within a minute", run, policy, rep.MissionID)
				}
				m, err := r.a.Driver().Get(context.Background(), rep.MissionID)
				if err != nil {
					t.Error(err)
					return
				}
				checkRun(report, run, policy, m, before, byID, offline.ID(), jammed.ID(), b)
				offline.SetOnline(true)
				if err := jammed.SetFaults(simulator.Faults{AckDelay: 5 * time.Millisecond, AckJitter: 20 * time.Millisecond}); err != nil {
					t.Error(err)
					return
				}
				available(offline.ID(), true)
			}
		})
	}
	wg.Wait()
	for _, p := range problems {
		t.Error(p)
	}
}

// checkRun checks one run's mission and the lights' states against its
// policy, reporting what is wrong.
func checkRun(report func(string, ...any), run int, policy string, m *driver.Mission, before map[string]map[string]any,
	byID map[string]*simulator.Device, offline, jammed string, b int) {
	if !m.State.Terminal() {
		report("run %d (%s): mission %s still %s", run, policy, m.ID, m.State)
		return
	}
	for k, step := range m.Steps {
		dev := strings.TrimPrefix(step.ID, "g.")
		st := m.Results[k]
		faulty := dev == offline || dev == jammed
		got := byID[dev].State()
		switch {
		case policy == "best_effort" && faulty:
			if st.Status != driver.StepFailed || st.Error == "" {
				report("run %d (%s): faulty %s ended %s %q, want failed with its reason", run, policy, dev, st.Status, st.Error)
			}
		case policy == "best_effort":
			if st.Status != driver.StepSucceeded || got["power"] != "on" || fmt.Sprint(got["brightness"]) != fmt.Sprint(b) {
				report("run %d (%s): healthy %s ended %s (%s) in state %v, want succeeded at brightness %d", run, policy, dev, st.Status, st.Error, got, b)
			}
		case faulty:
			if st.Status == driver.StepSucceeded || st.Status == driver.StepCompensated {
				report("run %d (%s): faulty %s ended %s", run, policy, dev, st.Status)
			}
		default:
			if st.Status == driver.StepSucceeded {
				var undo driver.StepResult
				if k < len(m.Undo) {
					undo = m.Undo[k]
				}
				report("run %d (%s): %s (step %d) succeeded and was left so after the group failed (undo %s %q; mission %s)", run, policy, dev, k, undo.Status, undo.Error, m.Error)
			}
			if st.Status == driver.StepCompensated && (got["power"] != before[dev]["power"] || fmt.Sprint(got["brightness"]) != fmt.Sprint(before[dev]["brightness"])) {
				report("run %d (%s): %s compensated to %v, was %v before the run", run, policy, dev, got, before[dev])
			}
		}
	}
	switch {
	case policy == "best_effort" && (m.State != driver.StateSucceeded || m.Reason != "completed_with_errors"):
		report("run %d (%s): mission %s %s (%s), want SUCCEEDED completed_with_errors", run, policy, m.ID, m.State, m.Reason)
	case policy == "all" && m.State != driver.StateFailed:
		report("run %d (%s): mission %s %s, want FAILED", run, policy, m.ID, m.State)
	}
}
