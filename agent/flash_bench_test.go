package agent_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/simulator"
)

// writeBytes is what this process has sent to storage so far
// (/proc/self/io write_bytes): the write-ahead log's direct writes and
// bbolt's checkpoints, as flash sees them.
func writeBytes(b testing.TB) int64 {
	f, err := os.Open("/proc/self/io")
	if err != nil {
		b.Skipf("no /proc/self/io: %v", err)
	}
	defer func() { _ = f.Close() }() // read-only
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "write_bytes: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	b.Skip("no write_bytes in /proc/self/io")
	return 0
}

// BenchmarkFlashWrites reports the bytes the agent writes to storage per
// step: 10 three-step scenes over 30 lights acking after 50–150 ms,
// submitted one mission at a time (a home) and 10 at a time (a busy
// building), and the shipped go_home (larger records: verify, prior
// states, compensation) one at a time; the store's writes are flushed at
// the end of each run by a read that checkpoints.
func BenchmarkFlashWrites(b *testing.B) {
	slow := simulator.Faults{AckDelay: 50 * time.Millisecond, AckJitter: 100 * time.Millisecond}
	reg, devs := lights("f", 30, "", slow, "")
	devs = append(devs,
		simulator.DeviceConfig{ID: "living-light", Type: simulator.TypeLight, Faults: slow},
		simulator.DeviceConfig{ID: "living-ac", Type: simulator.TypeAC, Faults: slow},
		simulator.DeviceConfig{ID: "living-speaker", Type: simulator.TypeSpeaker, Faults: slow})
	goHome, err := os.ReadFile("../configs/scenes/go_home.toml")
	if err != nil {
		b.Fatal(err)
	}
	var sc strings.Builder
	var names []string
	for s := range 10 {
		name := fmt.Sprintf("room-%d", s)
		names = append(names, name)
		fmt.Fprintf(&sc, "[[scene]]\nname = %q\nmode = \"parallel\"\n", name)
		for k := range 3 {
			fmt.Fprintf(&sc, "[[scene.step]]\ndevice = %q\naction = \"turn_on\"\nparams = { brightness = %d }\n", devs[s*3+k].ID, 40+k*20)
		}
	}
	sc.Write(goHome)
	for _, tc := range []struct {
		name     string
		scenes   []string
		missions int
		inFlight int
	}{{"one-at-a-time", names, 40, 1}, {"10-in-flight", names, 400, 10}, {"go_home", []string{"go_home"}, 40, 1}} {
		b.Run(tc.name, func(b *testing.B) {
			for range b.N {
				r := startSlowRig(b, slowHome{registry: reg, scenes: sc.String(), devices: devs, workers: 16, timeout: time.Minute})
				r.await(b, r.submit(b, tc.scenes[:1], 1), time.Minute) // warm
				flush := func() {
					if _, _, err := r.a.Driver().List(context.Background(), driver.Filter{Limit: 1}); err != nil {
						b.Fatal(err)
					}
				}
				flush()
				before := writeBytes(b)
				start := time.Now()
				for i := 0; i < tc.missions; i += tc.inFlight {
					batch := make([]string, tc.inFlight)
					for k := range batch {
						batch[k] = tc.scenes[(i+k)%len(tc.scenes)]
					}
					r.await(b, r.submit(b, batch, tc.inFlight), time.Minute)
				}
				flush()
				took := time.Since(start)
				written := writeBytes(b) - before
				steps := 3 * tc.missions
				b.ReportMetric(float64(written)/float64(steps), "B/step")
				b.ReportMetric(float64(steps)/took.Seconds(), "steps/s")
				b.ReportMetric(0, "ns/op")
				r.stop()
			}
		})
	}
}
