package agent_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
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

// TestOverlapArbitrationNeverTearsOrFlipFlops: scenes that share
// devices, triggered 2 to 5 at a time in random overlapping order, with
// faults on (devices busy now and then, acks late, sometimes a device
// that refuses everything, so that missions fail and undo), over 1,000 (500 under -race)
// seeds. Each scene has its own on_conflict (preempt, queue or skip), and
// half of them run their steps as a parallel group. After each seed, for
// every device, from the order in which it applied commands:
//
//   - no flip-flop: the missions whose commands it applied come in the
//     order the missions were created (an older mission never changes a
//     device after a newer one has);
//   - no torn end: the last command it applied is a step of a mission
//     that stands succeeded, in the state that step asked for, or an undo
//     that no newer mission's standing change came before;
//   - every step superseded, every undo left alone and every take-over
//     shows on the other mission's timeline too.
//
// Runs go 20 lanes at a time, each on its own 3 lights.
func TestOverlapArbitrationNeverTearsOrFlipFlops(t *testing.T) {
	if testing.Short() {
		t.Skip("1,000 seeds")
	}
	const lanes, perLane, nScenes = 20, 3, 5
	seeds := 1000
	if testkit.Race {
		seeds = 500 // a new seed every run; `go test -run TestOverlap ./agent` runs them all
	}
	// SORTIE_OVERLAP_SEED replays a run's scenes, faults and picks (the
	// interleaving of 20 lanes on 2 cores replays only roughly).
	seed := uint64(time.Now().UnixNano())
	if s, err := strconv.ParseUint(os.Getenv("SORTIE_OVERLAP_SEED"), 10, 64); err == nil {
		seed = s
	}
	t.Logf("seed %d (SORTIE_OVERLAP_SEED=%d replays it)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	var reg, sc strings.Builder
	var devs []simulator.DeviceConfig
	// values[scene][step] is the brightness the step sets.
	values := map[string][]int{}
	for l := range lanes {
		prefix := fmt.Sprintf("o%02d", l)
		r, ds := lights(prefix, perLane, "", simulator.Faults{}, "")
		reg.WriteString(r)
		devs = append(devs, ds...)
		for j := range nScenes {
			name := fmt.Sprintf("%s-s%d", prefix, j)
			policy := []string{"preempt", "queue", "skip"}[rng.IntN(3)]
			fmt.Fprintf(&sc, "[[scene]]\nname = %q\nmode = \"parallel\"\ndeadline = \"20s\"\non_conflict = %q\n", name, policy)
			n := 2 + rng.IntN(2)
			perm := rng.Perm(perLane)[:n]
			common := "compensate = \"restore\"\nack_timeout = \"1s\"\nretry = { max_attempts = 8, initial_backoff = \"10ms\", max_backoff = \"50ms\" }\n"
			for k := range n {
				values[name] = append(values[name], 1+j*10+k)
			}
			if rng.IntN(2) == 0 {
				sc.WriteString("[[scene.step]]\nid = \"g\"\naction = \"set\"\n" + common)
				for k, d := range perm {
					fmt.Fprintf(&sc, "[[scene.step.parallel]]\ndevice = \"%s-%03d\"\nparams = { power = \"on\", brightness = %d }\n", prefix, d, values[name][k])
				}
				continue
			}
			for k, d := range perm {
				fmt.Fprintf(&sc, "[[scene.step]]\ndevice = \"%s-%03d\"\naction = \"set\"\nparams = { power = \"on\", brightness = %d }\n%s", prefix, d, values[name][k], common)
			}
		}
	}
	r := startSlowRig(t, slowHome{registry: reg.String(), scenes: sc.String(), devices: devs, workers: 16, timeout: time.Minute})
	byID := map[string]*simulator.Device{}
	for _, d := range r.home.Devices() {
		byID[d.ID()] = d
	}
	var mu sync.Mutex
	var problems []string
	report := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(problems) < 30 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	var stats struct {
		sync.Mutex
		superseded, skipped, leftAlone, failed, queued int
	}
	var wg sync.WaitGroup
	for l := range lanes {
		wg.Go(func() {
			prefix := fmt.Sprintf("o%02d", l)
			for i := range seeds / lanes {
				run := l*seeds/lanes + i
				rng := rand.New(rand.NewPCG(seed, uint64(run)+1))
				for k := range perLane {
					f := simulator.Faults{AckDelay: time.Duration(rng.IntN(20)) * time.Millisecond, Busy: 0.1}
					if rng.IntN(10) < 3 && k == rng.IntN(perLane) {
						f = simulator.Faults{Reject: "jammed"}
					}
					if err := byID[fmt.Sprintf("%s-%03d", prefix, k)].SetFaults(f); err != nil {
						t.Error(err)
						return
					}
				}
				picked := rng.Perm(nScenes)[:2+rng.IntN(4)]
				var ids []string
				for n, j := range picked {
					if n > 0 {
						time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond) // overlap, not synchronisation
					}
					var rep scenes.Reply
					if _, err := r.a.API.Call(context.Background(), "POST", "/api/missions", api.SubmitRequest{
						Scene: fmt.Sprintf("%s-s%d", prefix, j), RequestID: fmt.Sprintf("ov-%d-%d", run, n),
					}, &rep); err != nil {
						t.Error(err)
						return
					}
					ids = append(ids, rep.MissionID)
				}
				missions := map[string]*driver.Mission{}
				for _, id := range ids {
					select {
					case <-r.done(id):
					case <-time.After(time.Minute):
						report("seed %d: mission %s did not end within a minute", run, id)
						return
					}
					m, err := r.a.Driver().Get(context.Background(), id)
					if err != nil {
						t.Error(err)
						return
					}
					missions[id] = m
				}
				checkOverlap(t, report, run, prefix, perLane, missions, values, byID, r)
				stats.Lock()
				for _, m := range missions {
					if m.State != driver.StateSucceeded {
						stats.failed++
					}
					for k, res := range m.Results {
						switch {
						case res.Status == driver.StepSuperseded && m.Undo != nil && k < len(m.Undo) && m.Undo[k].Code == driver.CodeSuperseded:
							stats.leftAlone++
						case res.Status == driver.StepSuperseded:
							stats.superseded++
						case res.Status == driver.StepSkipped && res.Code == driver.CodeSkipped:
							stats.skipped++
						}
						if res.Waits > 0 {
							stats.queued++
						}
					}
				}
				stats.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("over %d seeds: %d missions failed (and undid), %d steps superseded, %d skipped, %d undos left alone, %d steps waited",
		seeds, stats.failed, stats.superseded, stats.skipped, stats.leftAlone, stats.queued)
	for _, p := range problems {
		t.Error(p)
	}
}

// checkOverlap checks one seed's missions against the order in which
// each device applied their commands.
func checkOverlap(t *testing.T, report func(string, ...any), run int, prefix string, perLane int,
	missions map[string]*driver.Mission, values map[string][]int, byID map[string]*simulator.Device, r *slowRig) {
	t.Helper()
	older := func(a, b *driver.Mission) bool { // a created before b
		if !a.Meta.Created.Equal(b.Meta.Created) {
			return a.Meta.Created.Before(b.Meta.Created)
		}
		return a.ID < b.ID
	}
	for k := range perLane {
		dev := fmt.Sprintf("%s-%03d", prefix, k)
		type applied struct {
			m    *driver.Mission
			step int
			undo bool
		}
		var hist []applied
		for _, cmd := range byID[dev].History() {
			if len(cmd) < 24 {
				continue
			}
			m := missions[cmd[:24]]
			if m == nil {
				continue // an earlier seed's
			}
			undo := strings.HasSuffix(cmd, "-undo")
			parts := strings.Split(strings.TrimSuffix(cmd, "-undo"), "-")
			var step int
			_, _ = fmt.Sscan(parts[len(parts)-1], &step)
			hist = append(hist, applied{m, step, undo})
		}
		// The changes standing on the device: a forward command stands
		// until its mission's undo of it.
		var standing []applied
		for _, a := range hist {
			if a.undo {
				standing = slices.DeleteFunc(standing, func(s applied) bool { return s.m == a.m && s.step == a.step })
				continue
			}
			for _, s := range standing {
				if older(a.m, s.m) {
					report("seed %d: %s flip-flop: older mission %s (%s) changed it while newer %s's (%s) change stood", run, dev, a.m.ID, a.m.Type, s.m.ID, s.m.Type)
				}
			}
			standing = append(standing, a)
		}
		if len(hist) == 0 {
			continue
		}
		last := hist[len(hist)-1]
		res := last.m.Results[last.step]
		if !last.undo {
			if res.Status != driver.StepSucceeded {
				report("seed %d: %s torn: its last command is step %d of %s (%s), which ended %s (%s)", run, dev, last.step, last.m.ID, last.m.Type, res.Status, res.Error)
				continue
			}
			want := values[last.m.Type][last.step]
			if got := byID[dev].State()["brightness"]; fmt.Sprint(got) != fmt.Sprint(want) {
				report("seed %d: %s at brightness %v, want %d from %s's standing step", run, dev, got, want, last.m.ID)
			}
			continue
		}
		for _, a := range hist {
			if !a.undo && older(last.m, a.m) && a.m.Results[a.step].Status == driver.StepSucceeded {
				report("seed %d: %s torn: %s's undo came last, after newer %s's standing change", run, dev, last.m.ID, a.m.ID)
			}
		}
	}
	// Visibility: the other side of each decision has a note naming the
	// mission that decided.
	for _, m := range missions {
		for k, res := range m.Results {
			var other string
			text := res.Error
			if m.Undo != nil && k < len(m.Undo) && m.Undo[k].Code == driver.CodeSuperseded {
				text = m.Undo[k].Error
			}
			gaveWay := res.Status == driver.StepSuperseded || res.Status == driver.StepSkipped && res.Code == driver.CodeSkipped
			if !gaveWay {
				continue
			}
			if i := strings.Index(text, "mission "); i >= 0 {
				other = strings.TrimRight(strings.Fields(text[i+len("mission "):])[0], ";,.")
			}
			if other == "" || !r.noted(other, m.ID) {
				report("seed %d: %s's step %d %s (%q), but mission %q's timeline has no note of it", run, m.ID, k, res.Status, text, other)
			}
		}
		evs, _ := r.a.Driver().Timeline(context.Background(), m.ID)
		for _, ev := range evs {
			if ev.Input == driver.InNote && strings.HasPrefix(ev.Detail, "took ") {
				o := ev.Detail[strings.LastIndex(ev.Detail, " ")+1:]
				if !r.noted(o, m.ID) {
					report("seed %d: %s %q, but %s's timeline has no note of it", run, m.ID, ev.Detail, o)
				}
			}
		}
	}
}
