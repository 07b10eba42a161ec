package agent_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/simulator"
)

// TestOnConflictPolicies: scene "first" sets a light to 10 and then
// holds on (a delay), so it owns the light while live; scene "second"
// sets it to 20 under each on_conflict policy, triggered while "first"
// runs.
func TestOnConflictPolicies(t *testing.T) {
	for _, tc := range []struct {
		policy     string
		status     driver.StepStatus
		brightness int
		noteFirst  string // on first's timeline
	}{
		{"preempt", driver.StepSucceeded, 20, "taken over by newer mission"},
		{"queue", driver.StepSucceeded, 20, "waits for t-000 until this mission ends"},
		{"skip", driver.StepSkipped, 10, "skipped t-000, held by this mission"},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			reg, devs := lights("t", 1, "", simulator.Faults{AckDelay: 20 * time.Millisecond}, "")
			sc := `[[scene]]
name = "first"
[[scene.step]]
device = "t-000"
action = "set"
params = { power = "on", brightness = 10 }
[[scene.step]]
delay = "400ms"

[[scene]]
name = "second"
on_conflict = "` + tc.policy + `"
[[scene.step]]
device = "t-000"
action = "set"
params = { power = "on", brightness = 20 }
`
			r := startSlowRig(t, slowHome{registry: reg, scenes: sc, devices: devs, workers: 4, timeout: time.Minute})
			first := r.submit(t, []string{"first"}, 1)[0]
			waitStep(t, r, first, 0, driver.StepSucceeded)
			second := r.submit(t, []string{"second"}, 1)[0]
			<-r.done(first)
			<-r.done(second)
			ctx := context.Background()
			f, _ := r.a.Driver().Get(ctx, first)
			s, _ := r.a.Driver().Get(ctx, second)
			if got := s.Results[0].Status; got != tc.status {
				t.Fatalf("second's step %s (%s), want %s", got, s.Results[0].Error, tc.status)
			}
			if f.State != driver.StateSucceeded || s.State != driver.StateSucceeded {
				t.Fatalf("first %s, second %s: want both SUCCEEDED", f.State, s.State)
			}
			if tc.policy == "queue" && (s.Results[0].Waits == 0 || s.Results[0].Finished.Before(f.Meta.Finished)) {
				t.Errorf("queued step: %d waits, finished %v, first ended %v: want it to wait for first's end", s.Results[0].Waits, s.Results[0].Finished, f.Meta.Finished)
			}
			if got := r.home.Devices()[0].State()["brightness"]; got != float64(tc.brightness) && got != tc.brightness {
				t.Errorf("light at %v, want %d", got, tc.brightness)
			}
			if !r.noted(first, second) {
				t.Errorf("first's timeline has no note of second")
			}
			evs, _ := r.a.Driver().Timeline(ctx, first)
			if !slices.ContainsFunc(evs, func(ev driver.Event) bool { return strings.Contains(ev.Detail, tc.noteFirst) }) {
				t.Errorf("first's timeline lacks a note %q", tc.noteFirst)
			}
		})
	}
}

// waitStep waits until step k of mission id has status want.
func waitStep(t *testing.T, r *slowRig, id string, k int, want driver.StepStatus) {
	t.Helper()
	// Polled: the step's commit is another goroutine's.
	testkit.Until(t, 30*time.Second, func() error {
		m, err := r.a.Driver().Get(context.Background(), id)
		if err == nil && m.Results[k].Status != want {
			err = fmt.Errorf("step %d of %s is %s, want %s", k, id, m.Results[k].Status, want)
		}
		return err
	})
}
