package hub

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/bundle"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/uplink"
)

// BenchmarkFleetRollout measures the rollout engine alone: a rollout to
// n gateways (1% canary, then doubling waves), each offer answered at
// once (received, applied, healthy) at the Send seam, the bbolt file
// fsynced, the clock stepped past each soak. One op is a whole rollout.
//
// The baseline, measured first in the same run on the same disk, is one
// fsynced bbolt transaction per gateway writing a record of the same
// size: what a store that wrote each gateway's change on its own would
// pay. The engine writes once per step, whatever arrived.
//
//	us/gateway        wall time of the rollout per gateway
//	cpu-us/gateway    the process's CPU (user + system) per gateway
//	baseline-us/gw    one fsynced transaction per gateway
//	x-baseline        us/gateway ÷ baseline-us/gw
//	writes            bbolt transactions of the engine per rollout
func BenchmarkFleetRollout(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("gateways=%d", n), func(b *testing.B) {
			base := baselineWrites(b, min(n, 2000))
			var wall, cpu time.Duration
			writes := 0
			for range b.N {
				w, c, tx := rolloutOnce(b, n)
				wall, cpu, writes = wall+w, cpu+c, writes+tx
			}
			per := float64(wall.Microseconds()) / float64(b.N*n)
			b.ReportMetric(per, "us/gateway")
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N*n), "cpu-us/gateway")
			b.ReportMetric(base, "baseline-us/gw")
			b.ReportMetric(per/base, "x-baseline")
			b.ReportMetric(float64(writes)/float64(b.N), "writes")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// baselineWrites is the cost of one fsynced transaction per gateway.
func baselineWrites(b *testing.B, n int) float64 {
	db, err := bolt.Open(filepath.Join(b.TempDir(), "base.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	rec := make([]byte, 400) // a RolloutGateway's JSON is about this size
	start := time.Now()
	for i := range n {
		if err := db.Update(func(tx *bolt.Tx) error {
			bk, err := tx.CreateBucketIfNotExists([]byte("t"))
			if err != nil {
				return err
			}
			return bk.Put(fmt.Appendf(nil, "gw-%05d", i), rec)
		}); err != nil {
			b.Fatal(err)
		}
	}
	return float64(time.Since(start).Microseconds()) / float64(n)
}

// countingStore counts the engine's writes.
type countingStore struct {
	*Store
	saves int
}

func (c *countingStore) SaveFleet(ctx context.Context, s FleetState) error {
	c.saves++
	return c.Store.SaveFleet(ctx, s)
}

func rolloutOnce(b *testing.B, n int) (wall, cpu time.Duration, writes int) {
	b.StopTimer()
	st, err := Open(filepath.Join(b.TempDir(), "hub.db"), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = st.Close() }()
	clock := &testClock{now: time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)}
	cs := &countingStore{Store: st}
	var f *Fleet
	f = NewFleet(cs, FleetOptions{Now: clock.Now, Send: func(gw string, c uplink.Control) error {
		o := c.Bundle
		for _, s := range []string{uplink.BundleReceived, uplink.BundleApplied, uplink.BundleHealthy} {
			f.NoteStatus(gw, uplink.BundleStatus{Gateway: gw, Hash: o.Hash, Version: o.Version, Rollout: o.Rollout, Status: s, Current: o.Hash, At: clock.Now()})
		}
		f.NoteResult(gw, uplink.ControlResult{ID: c.ID, OK: true})
		return nil
	}})
	ctx := context.Background()
	if err := f.Load(ctx); err != nil {
		b.Fatal(err)
	}
	v1, v2 := testBundle(b, "", ""), testBundle(b, "v2", "")
	for _, bb := range []*bundle.Bundle{v1, v2} {
		enc, _ := bb.Encode()
		if _, _, err := f.PushBundle(ctx, "", enc); err != nil {
			b.Fatal(err)
		}
	}
	h1 := v1.Hash()
	for i := range n {
		gw := fmt.Sprintf("gw-%05d", i)
		f.NoteGateway(Gateway{ID: gw, State: StateOnline, Heartbeat: &uplink.Heartbeat{Gateway: gw, Version: "v1.0.0", Time: clock.Now(),
			Config: &uplink.ConfigState{Hash: h1, Source: uplink.SourceFiles}}})
	}
	if err := f.Step(ctx); err != nil {
		b.Fatal(err)
	}
	cs.saves = 0
	cpu0 := cpuTime()
	b.StartTimer()
	start := time.Now()
	r, err := f.StartRollout(ctx, RolloutSpec{CanaryPercent: 1, Soak: driver.Duration(time.Minute)})
	if err != nil {
		b.Fatal(err)
	}
	for {
		if err := f.Step(ctx); err != nil {
			b.Fatal(err)
		}
		if err := f.Step(ctx); err != nil { // the answers the offers drew
			b.Fatal(err)
		}
		v, _ := f.Rollout(r.ID)
		if v.State == RolloutCompleted {
			if v.Counts[TargetHealthy] != n {
				b.Fatalf("counts %v", v.Counts)
			}
			break
		}
		clock.add(time.Minute)
	}
	wall = time.Since(start)
	b.StopTimer()
	return wall, cpuTime() - cpu0, cs.saves
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru) // Linux: never fails for RUSAGE_SELF
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
