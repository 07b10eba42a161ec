package agent_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/agent/agenttest"
	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/scenes"
	"github.com/sortie-edge/sortie/simulator"
)

// The benchmarks of this file run a whole agent (embedded broker, store,
// driver, devices client) against simulated devices that answer the way
// real ones do: after 50-500 ms, losing acks, behind a bridge that takes
// only so much. A design that is fast only with instant devices is not
// fast.

// slowRig is an agent in this process and a simulated home on its
// broker, with every mission's end recorded.
type slowRig struct {
	stop func() // ends the rig: agent, broker and devices
	a    *agenttest.Agent
	home *simulator.Home

	submits atomic.Int64 // makes request IDs unique across submits

	mu    sync.Mutex
	ends  map[string]driver.State
	errs  map[string]int // step_error events by mission
	codes map[string]int // step_error events by code
	// superseded counts steps that gave way to a newer mission on their
	// device: done without a command, so not counted as work.
	superseded int
	ended      chan string
	// waits are closed when their mission ends (see done).
	waits map[string]chan struct{}
	// notes are the details of each mission's note events; noteCh is
	// closed at each new one.
	notes  map[string][]string
	noteCh chan struct{}
}

// done returns a channel closed when mission id has ended.
func (r *slowRig) done(id string) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch := make(chan struct{})
	if _, ended := r.ends[id]; ended {
		close(ch)
		return ch
	}
	if r.waits == nil {
		r.waits = map[string]chan struct{}{}
	}
	if old, ok := r.waits[id]; ok {
		return old
	}
	r.waits[id] = ch
	return ch
}

func (r *slowRig) observeNote(ev driver.Event, m *driver.Mission) {
	if ev.Input != driver.InNote {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notes[m.ID] = append(r.notes[m.ID], ev.Detail)
	close(r.noteCh)
	r.noteCh = make(chan struct{})
}

// noted waits until mission id has a note naming about, and reports
// whether it came within a minute. The arbiter writes its notes one at a
// time after the decisions, so on a loaded machine they may come seconds
// after the missions they name have ended.
func (r *slowRig) noted(id, about string) bool {
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		ok := slices.ContainsFunc(r.notes[id], func(d string) bool { return strings.Contains(d, about) })
		ch := r.noteCh
		r.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ch:
		case <-deadline.C:
			return false
		}
	}
}

// slowHome describes the rig: registry additions (links, devices) to the
// shipped one, scenes, and the simulated devices.
type slowHome struct {
	registry string // TOML appended to configs/devices.toml
	scenes   string
	devices  []simulator.DeviceConfig
	bridges  []simulator.BridgeConfig
	workers  int
	timeout  time.Duration // the driver's step timeout
}

func startSlowRig(b testing.TB, h slowHome) *slowRig {
	b.Helper()
	dir := b.TempDir()
	shipped, err := os.ReadFile("../configs/devices.toml")
	if err != nil {
		b.Fatal(err)
	}
	reg, err := devices.ParseRegistry(append(shipped, h.registry...), "bench-devices.toml")
	if err != nil {
		b.Fatal(err)
	}
	cat, err := scenes.Parse([]byte(h.scenes), "bench.toml", reg)
	if err != nil {
		b.Fatal(err)
	}
	r := &slowRig{ends: map[string]driver.State{}, errs: map[string]int{}, codes: map[string]int{}, ended: make(chan string, 1<<16),
		notes: map[string][]string{}, noteCh: make(chan struct{})}
	obs := driver.ObserverFunc(func(ev driver.Event, m *driver.Mission) {
		switch {
		case ev.Input == driver.InStepError && ev.Code == driver.CodeSuperseded:
			r.mu.Lock()
			r.superseded++
			r.mu.Unlock()
		case ev.Input == driver.InStepError:
			r.mu.Lock()
			r.errs[m.ID]++
			r.codes[ev.Code]++
			r.mu.Unlock()
		case ev.To.Terminal():
			r.mu.Lock()
			r.ends[m.ID] = ev.To
			if ch, ok := r.waits[m.ID]; ok {
				close(ch)
				delete(r.waits, m.ID)
			}
			r.mu.Unlock()
			select {
			case r.ended <- m.ID:
			default: // a test that waits with done does not read ended
			}
		}
	})
	r.a = agenttest.Start(b, agent.Options{
		Gateway: "bench", DataDir: filepath.Join(dir, "data"), Registry: reg, Catalog: cat,
		Driver:        agent.DriverOptions{Workers: h.workers, StepTimeout: h.timeout, StopGrace: time.Second},
		Observers:     []driver.Observer{obs, driver.ObserverFunc(r.observeNote)},
		QuietMissions: true,
	})
	r.home, err = simulator.NewHome(simulator.HomeConfig{Broker: r.a.Addrs().BrokerURL, Seed: 1, Devices: h.devices, Bridges: h.bridges})
	if err != nil {
		b.Fatal(err)
	}
	hctx, hcancel := context.WithTimeout(context.Background(), time.Minute)
	defer hcancel()
	if err := r.home.Start(hctx); err != nil {
		b.Fatal(err)
	}
	// Stopped at the end of its iteration, not of the benchmark: the
	// framework may run several, and two rigs of a thousand devices at
	// once would measure each other.
	r.stop = sync.OnceFunc(func() {
		r.a.Stop()
		_ = r.home.Close() // the devices' goodbyes; the measurement is over
	})
	b.Cleanup(r.stop) // a rig left by a failed iteration
	return r
}

// submit triggers every scene of names, conc at a time, through the
// API, and returns their mission IDs by request ID.
func (r *slowRig) submit(b testing.TB, names []string, conc int) []string {
	b.Helper()
	ids := make([]string, len(names))
	batch := r.submits.Add(1)
	var wg sync.WaitGroup
	sem := make(chan struct{}, conc)
	for i, n := range names {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			var rep scenes.Reply
			if _, err := r.a.API.Call(context.Background(), "POST", "/api/missions", api.SubmitRequest{Scene: n, RequestID: fmt.Sprintf("%s-%d-%d", n, batch, i)}, &rep); err != nil {
				b.Errorf("submit %s: %v", n, err)
				return
			}
			ids[i] = rep.MissionID
		})
	}
	wg.Wait()
	return ids
}

// await waits until every mission of ids has ended, and returns when the
// last did.
func (r *slowRig) await(b testing.TB, ids []string, within time.Duration) time.Time {
	b.Helper()
	want := make(map[string]bool, len(ids))
	r.mu.Lock()
	for _, id := range ids {
		if _, done := r.ends[id]; !done {
			want[id] = true
		}
	}
	r.mu.Unlock()
	last := time.Now()
	deadline := time.After(within)
	for len(want) > 0 {
		select {
		case id := <-r.ended:
			if want[id] {
				delete(want, id)
				last = time.Now()
			}
		case <-deadline:
			b.Fatalf("%d of %d missions still running after %v", len(want), len(ids), within)
		}
	}
	return last
}

// outcome counts the missions of ids that did not succeed, and their
// failed step attempts.
func (r *slowRig) outcome(ids []string) (failed, stepErrors int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range ids {
		if r.ends[id] != driver.StateSucceeded {
			failed++
		}
		stepErrors += r.errs[id]
	}
	return failed, stepErrors
}

// lights are n simulated lights named prefix-000..., with the ack faults
// f, and their registry entries (with link, when set).
func lights(prefix string, n int, link string, f simulator.Faults, bridge string) (string, []simulator.DeviceConfig) {
	var reg strings.Builder
	var devs []simulator.DeviceConfig
	for i := range n {
		id := fmt.Sprintf("%s-%03d", prefix, i)
		fmt.Fprintf(&reg, "[[devices]]\nid = %q\ntype = \"light\"\n", id)
		if link != "" {
			fmt.Fprintf(&reg, "link = %q\n", link)
		}
		devs = append(devs, simulator.DeviceConfig{ID: id, Type: simulator.TypeLight, Faults: f, Bridge: bridge})
	}
	return reg.String(), devs
}

// oneStepScenes is a parallel-mode scene per device, turning it on.
func oneStepScenes(devs []simulator.DeviceConfig, extra string) string {
	var s strings.Builder
	for _, d := range devs {
		fmt.Fprintf(&s, "[[scene]]\nname = %q\nmode = \"parallel\"\n[[scene.step]]\ndevice = %q\naction = \"turn_on\"\n%s\n", "on-"+d.ID, d.ID, extra)
	}
	return s.String()
}

// BenchmarkBuilding is the building integrator's case of issue 14: 100
// lights that ack after 200 ms, and one flaky light that loses half its
// acks (2 s ack timeout); 300 two-step missions on the healthy lights (3
// each) and 300 one-step missions on the flaky one, all submitted at once
// through the API, with the default 16 workers. Each healthy light has 6
// commands to carry out one at a time, so the healthy missions' ideal is
// 6 × 200 ms = 1.2 s; the figure is how long they took over that ideal.
func BenchmarkBuilding(b *testing.B) {
	const latency = 200 * time.Millisecond
	healthyReg, healthy := lights("light", 100, "", simulator.Faults{AckDelay: latency}, "")
	flakyReg, flaky := lights("flaky", 1, "", simulator.Faults{AckDelay: latency, AckLoss: 0.5}, "")
	var sc strings.Builder
	for _, d := range healthy {
		fmt.Fprintf(&sc, "[[scene]]\nname = %q\nmode = \"parallel\"\n[[scene.step]]\ndevice = %q\naction = \"turn_on\"\n[[scene.step]]\ndevice = %q\naction = \"turn_off\"\n\n", "two-"+d.ID, d.ID, d.ID)
	}
	sc.WriteString(oneStepScenes(flaky, "ack_timeout = \"2s\"\nretry = { max_attempts = 6 }"))
	for range b.N {
		b.StopTimer()
		r := startSlowRig(b, slowHome{registry: healthyReg + flakyReg, scenes: sc.String(), devices: append(healthy, flaky...), workers: 16, timeout: time.Hour})
		var names, flakyNames []string
		for range 3 {
			for _, d := range healthy {
				names = append(names, "two-"+d.ID)
			}
		}
		for range 300 {
			flakyNames = append(flakyNames, "on-"+flaky[0].ID)
		}
		// Interleaved, as they would arrive from many apps at once.
		var all []string
		for i := range names {
			all = append(all, names[i], flakyNames[i])
		}
		b.StartTimer()
		start := time.Now()
		ids := r.submit(b, all, 64)
		var healthyIDs []string
		for i := 0; i < len(ids); i += 2 {
			healthyIDs = append(healthyIDs, ids[i])
		}
		last := r.await(b, healthyIDs, 5*time.Minute)
		b.StopTimer()
		took := last.Sub(start)
		failed, errs := r.outcome(healthyIDs)
		ideal := 6 * latency
		b.ReportMetric(took.Seconds(), "healthy-s")
		b.ReportMetric(ideal.Seconds(), "ideal-s")
		b.ReportMetric(float64(took)/float64(ideal), "healthy/ideal")
		b.ReportMetric(float64(failed), "healthy-failed")
		b.ReportMetric(float64(errs), "healthy-step-errors")
		b.ReportMetric(float64(r.superseded), "superseded") // runs of one scene are not arbitrated: 0
		b.ReportMetric(0, "ns/op")
		r.stop()
	}
}

// BenchmarkSlowDevices: one-step missions on 1,000 devices that ack
// after 200 ms, all submitted at once through the API, with the default
// 16 workers, in steps/s; beside the ceiling: the lower of
// devices/latency (5,000/s) and the same agent's end-to-end rate on
// instant devices with the same missions, measured in the same run.
// missions=1000 is one command per device, so its time holds one full
// 200 ms round trip on top of the intake; missions=5000 (five per
// device) shows the sustained rate.
func BenchmarkSlowDevices(b *testing.B) {
	const devices, latency = 1000, 200 * time.Millisecond
	reg, devs := lights("dev", devices, "", simulator.Faults{}, "")
	sc := oneStepScenes(devs, "")
	for _, n := range []int{1000, 5000} {
		b.Run(fmt.Sprintf("missions=%d", n), func(b *testing.B) {
			var names []string
			for i := range n {
				names = append(names, "on-"+devs[i%devices].ID)
			}
			for range b.N {
				b.StopTimer()
				r := startSlowRig(b, slowHome{registry: reg, scenes: sc, devices: devs, workers: 16, timeout: time.Minute})
				// The ceiling's second half: the same missions on instant
				// devices.
				start := time.Now()
				ids := r.submit(b, names, 64)
				r.await(b, ids, 5*time.Minute)
				instant := float64(n) / time.Since(start).Seconds()
				for _, d := range r.home.Devices() {
					if err := d.SetFaults(simulator.Faults{AckDelay: latency}); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
				start = time.Now()
				ids = r.submit(b, names, 64)
				last := r.await(b, ids, 5*time.Minute)
				b.StopTimer()
				rate := float64(n) / last.Sub(start).Seconds()
				ceiling := math.Min(float64(devices)/latency.Seconds(), instant)
				failed, errs := r.outcome(ids)
				if errs > 0 {
					b.Logf("step errors by code: %v", r.codes)
				}
				b.ReportMetric(float64(errs), "step-errors")
				b.ReportMetric(float64(r.superseded), "superseded")
				b.ReportMetric(rate, "steps/s")
				b.ReportMetric(instant, "instant-steps/s")
				b.ReportMetric(ceiling, "ceiling-steps/s")
				b.ReportMetric(rate/ceiling, "ratio")
				b.ReportMetric(float64(failed), "failed")
				b.ReportMetric(0, "ns/op")
				r.stop()
			}
		})
	}
}

// BenchmarkLinkOf4: 30 lights behind one bridge that relays 4 commands
// at once and loses any beyond (simulator), declared to the agent as a
// link of max_in_flight 4; one-step missions on all 30 at once. The
// ideal is ⌈30/4⌉ round trips of 200 ms; the figures are the time over
// that and the failed commands (the bridge's losses), which must be 0.
func BenchmarkLinkOf4(b *testing.B) {
	const n, latency = 30, 200 * time.Millisecond
	reg, devs := lights("blind", n, "zigbee", simulator.Faults{AckDelay: latency}, "zigbee")
	reg = "[links.zigbee]\nmax_in_flight = 4\n" + reg
	sc := oneStepScenes(devs, "")
	var names []string
	for _, d := range devs {
		names = append(names, "on-"+d.ID)
	}
	for range b.N {
		b.StopTimer()
		r := startSlowRig(b, slowHome{
			registry: reg, scenes: sc, devices: devs, workers: 16, timeout: time.Minute,
			bridges: []simulator.BridgeConfig{{ID: "zigbee", Capacity: 4}},
		})
		b.StartTimer()
		start := time.Now()
		ids := r.submit(b, names, n)
		last := r.await(b, ids, time.Minute)
		b.StopTimer()
		ideal := time.Duration(math.Ceil(n/4.0)) * latency
		failed, errs := r.outcome(ids)
		b.ReportMetric(last.Sub(start).Seconds(), "s")
		b.ReportMetric(float64(last.Sub(start))/float64(ideal), "time/ideal")
		b.ReportMetric(float64(errs), "failed-commands")
		b.ReportMetric(float64(failed), "failed-missions")
		b.ReportMetric(0, "ns/op")
		r.stop()
	}
}

// BenchmarkParkedHeap: heap per step parked waiting for its turn or its
// ack, with 10,000 missions on 100 devices that never ack (each device
// takes one command at a time, so one step per device waits for its ack
// and the rest for their turn). Measured after a GC, against the heap
// of the idle agent.
func BenchmarkParkedHeap(b *testing.B) {
	const n = 10000
	reg, devs := lights("mute", 100, "", simulator.Faults{AckLoss: 1}, "")
	sc := oneStepScenes(devs, "ack_timeout = \"1h\"")
	var names []string
	for i := range n {
		names = append(names, "on-"+devs[i%len(devs)].ID)
	}
	if os.Getenv("SORTIE_HEAP_PROFILE") != "" {
		runtime.MemProfileRate = 64 // fine enough to tell a parked step's parts apart
	}
	for range b.N {
		b.StopTimer()
		r := startSlowRig(b, slowHome{registry: reg, scenes: sc, devices: devs, workers: 16, timeout: time.Hour})
		before := heap()
		r.submit(b, names, 64)
		deadline := time.Now().Add(5 * time.Minute)
		for r.a.Driver().Queue().Parked < n {
			if time.Now().After(deadline) {
				b.Fatalf("only %d of %d steps parked", r.a.Driver().Queue().Parked, n)
			}
			time.Sleep(10 * time.Millisecond) // sampling a gauge; parking has no event
		}
		// The store keeps freshly committed records in memory until its
		// checkpointer has applied them to the file (up to 512 of them, for
		// up to 10 s); that is the store's, not the parked steps'. A list
		// checkpoints first.
		if _, _, err := r.a.Driver().List(context.Background(), driver.Filter{Limit: 1}); err != nil {
			b.Fatal(err)
		}
		after := heap()
		if f := os.Getenv("SORTIE_HEAP_PROFILE"); f != "" {
			writeHeapProfile(b, f)
		}
		b.ReportMetric(float64(after-before)/n, "heap-B/parked-step")
		b.ReportMetric(float64(r.a.Driver().Queue().Running), "workers-busy")
		b.ReportMetric(0, "ns/op")
		r.stop()
	}
}

func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// writeHeapProfile writes the live heap to path, to see what a
// measurement holds (SORTIE_HEAP_PROFILE=path).
func writeHeapProfile(b *testing.B, path string) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = f.Close() }() // a diagnostic file
	if err := pprof.WriteHeapProfile(f); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkGroup: one mission whose parallel group turns off n lights
// that ack after 200 ms, against one round trip measured in the same
// run (a one-step mission on one of those lights): the group's time
// over it should be near 1, not n. link=4 puts 40 lights behind a
// coordinator that takes 4 commands at once (declared as a link of
// max_in_flight 4), whose ideal is ⌈40/4⌉ round trips; sequential=20 is
// the same 20 lights as 20 steps in a row, for comparison.
func BenchmarkGroup(b *testing.B) {
	const latency = 200 * time.Millisecond
	for _, tc := range []struct {
		name       string
		n          int
		link       int
		sequential bool
	}{
		{"lights=20", 20, 0, false},
		{"lights=40/link=4", 40, 4, false},
		{"sequential=20", 20, 0, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			link, bridges := "", []simulator.BridgeConfig(nil)
			if tc.link > 0 {
				link = "coord"
				bridges = []simulator.BridgeConfig{{ID: "coord", Capacity: tc.link}}
			}
			reg, devs := lights("g", tc.n, link, simulator.Faults{AckDelay: latency}, link)
			if tc.link > 0 {
				reg = fmt.Sprintf("[links.coord]\nmax_in_flight = %d\n", tc.link) + reg
			}
			var sc strings.Builder
			fmt.Fprintf(&sc, "[[scene]]\nname = \"one\"\nmode = \"parallel\"\n[[scene.step]]\ndevice = %q\naction = \"turn_on\"\n\n", devs[0].ID)
			sc.WriteString("[[scene]]\nname = \"all\"\nmode = \"parallel\"\n")
			if tc.sequential {
				for _, d := range devs {
					fmt.Fprintf(&sc, "[[scene.step]]\ndevice = %q\naction = \"turn_off\"\n", d.ID)
				}
			} else {
				sc.WriteString("[[scene.step]]\nid = \"off\"\ndevices = [")
				for i, d := range devs {
					if i > 0 {
						sc.WriteString(", ")
					}
					fmt.Fprintf(&sc, "%q", d.ID)
				}
				sc.WriteString("]\naction = \"turn_off\"\n")
			}
			for range b.N {
				b.StopTimer()
				r := startSlowRig(b, slowHome{registry: reg, scenes: sc.String(), devices: devs, bridges: bridges, workers: 16, timeout: time.Minute})
				r.await(b, r.submit(b, []string{"one"}, 1), time.Minute) // warm: connections, caches
				start := time.Now()
				r.await(b, r.submit(b, []string{"one"}, 1), time.Minute)
				trip := time.Since(start)
				b.StartTimer()
				start = time.Now()
				ids := r.submit(b, []string{"all"}, 1)
				last := r.await(b, ids, time.Minute)
				b.StopTimer()
				took := last.Sub(start)
				failed, errs := r.outcome(ids)
				ideal := trip
				if tc.link > 0 {
					ideal = time.Duration(math.Ceil(float64(tc.n)/float64(tc.link))) * trip
				}
				b.ReportMetric(took.Seconds()*1000, "group-ms")
				b.ReportMetric(trip.Seconds()*1000, "round-trip-ms")
				b.ReportMetric(float64(took)/float64(ideal), "time/ideal")
				b.ReportMetric(float64(failed+errs), "failures")
				b.ReportMetric(0, "ns/op")
				r.stop()
			}
		})
	}
}
