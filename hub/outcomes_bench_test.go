package hub

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/clustertest"
	"github.com/sortie-edge/sortie/uplink"
)

// benchMissions is how many finished missions the outcome benchmarks
// store: SORTIE_OUTCOME_MISSIONS, default 20,000 (a million takes
// minutes to ingest).
func benchMissions(b *testing.B) int {
	if v := os.Getenv("SORTIE_OUTCOME_MISSIONS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			b.Fatalf("SORTIE_OUTCOME_MISSIONS=%q", v)
		}
		return n
	}
	return 20000
}

// fillOutcomes stores n finished missions of 1,000 gateways and 5
// scenes, spread over the 29 days before now (within the 30-day chart), in batches of 1,000.
func fillOutcomes(b *testing.B, st Backing, n int, now time.Time) {
	b.Helper()
	states := []driver.State{driver.StateSucceeded, driver.StateSucceeded, driver.StateSucceeded, driver.StateFailed, driver.StateCancelled}
	byGW := map[string][]uplink.Entry{}
	seq := map[string]uint64{}
	flush := func() {
		var in []Inbound
		for gw, es := range byGW {
			in = append(in, Inbound{Gateway: gw, Batch: &uplink.Batch{Gateway: gw, Entries: es}, Received: now})
		}
		if _, err := st.Apply(context.Background(), in); err != nil {
			b.Fatal(err)
		}
		clear(byGW)
	}
	for i := range n {
		gw := fmt.Sprintf("gw%04d", i%1000)
		at := now.Add(-time.Duration(i) * (29 * 24 * time.Hour / time.Duration(n)))
		seq[gw]++
		sum := driver.Summary{Scene: fmt.Sprintf("scene%d", i%5), State: states[i%len(states)], Steps: 3, Created: at.Add(-time.Duration(i%5000) * time.Millisecond), Updated: at, Finished: at}
		byGW[gw] = append(byGW[gw], uplink.Entry{Seq: seq[gw], Event: driver.Event{MissionID: fmt.Sprintf("m%07d", i), Seq: 1, To: sum.State, Step: -1, Time: at}, Mission: sum})
		if (i+1)%1000 == 0 {
			flush()
		}
	}
	if len(byGW) > 0 {
		flush()
	}
}

// benchOutcomes times the 30-day chart of every mission against a
// baseline read over the same window from the missions themselves
// (every page of GET /api/missions in the window): the roll-up's cost
// must not grow with the missions.
func benchOutcomes(b *testing.B, st Backing) {
	now := time.Date(2026, 12, 6, 21, 30, 0, 0, time.UTC)
	n := benchMissions(b)
	fillOutcomes(b, st, n, now)
	ctx := context.Background()
	o, err := BuildOutcomes(ctx, st, "", "", "30d", "", now)
	if err != nil || o.Total.Finished != int64(n) {
		b.Fatalf("outcomes = %+v (%v), want %d missions", o.Total, err, n)
	}
	measure := func(f func()) time.Duration {
		start := time.Now()
		for range 5 {
			f()
		}
		return time.Since(start) / 5
	}
	var rollup, scan time.Duration
	for b.Loop() {
		rollup = measure(func() {
			if _, err := BuildOutcomes(ctx, st, "", "", "30d", "", now); err != nil {
				b.Fatal(err)
			}
		})
		scan = measure(func() {
			q := Query{Since: now.Add(-31 * 24 * time.Hour), Limit: 1000}
			for {
				_, next, err := st.Missions(ctx, q)
				if err != nil {
					b.Fatal(err)
				}
				if next == "" {
					break
				}
				q.Cursor = next
			}
		})
	}
	b.ReportMetric(float64(n), "missions")
	b.ReportMetric(float64(rollup.Microseconds()), "µs/30d-chart")
	b.ReportMetric(float64(scan.Microseconds()), "µs/scan-baseline")
	b.ReportMetric(float64(rollup)/float64(scan), "chart/scan")
}

func BenchmarkOutcomesBolt(b *testing.B) { benchOutcomes(b, testStore(b)) }

func BenchmarkOutcomesPG(b *testing.B) {
	pg := clustertest.StartPostgres(b, clustertest.PostgresOptions{Settings: map[string]string{"fsync": "off"}})
	st, err := OpenPG(context.Background(), pg.DSN())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = st.Close() })
	benchOutcomes(b, st)
}
