package store

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
)

// BenchmarkSaveOutbox measures saves (three events each, as in
// BenchmarkSave) with the outbox on against the same saves with it off,
// alternating rounds between the two files so both see the same disk.
// "x-off" is the on/off rate ratio: 1 means the outbox is free. The
// third file has an acker draining the outbox meanwhile, 256 entries a
// transaction, as the uplink does while the hub keeps up ("x-off-acked").
func BenchmarkSaveOutbox(b *testing.B) {
	const rounds = 10
	for _, writers := range []int{1, 64} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			ctx := context.Background()
			type side struct {
				db    *DB
				ms    []*driver.Mission
				took  time.Duration
				acker bool
			}
			var sides [3]*side // off, on, on with an acker
			for i := range sides {
				opts := testOptions()
				opts.Outbox, opts.OutboxMax = i > 0, -1 // no compaction: measure the write alone
				db, err := Open(filepath.Join(benchDir(b), fmt.Sprintf("s%d.db", i)), opts)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { mustClose(b, db) })
				s := &side{db: db, ms: make([]*driver.Mission, writers), acker: i == 2}
				for w := range s.ms {
					s.ms[w] = newMission(mid(w))
					if _, _, err := db.Create(ctx, s.ms[w], nil); err != nil {
						b.Fatal(err)
					}
				}
				sides[i] = s
			}
			states := []driver.State{driver.StateRunning, driver.StateStepRunning, driver.StateStepSucceeded}
			plan := func(s *side, w, n int) [][2]any {
				out := make([][2]any, n)
				m := s.ms[w]
				for i := range out {
					next := m.Clone()
					next.Version++
					evs := make([]driver.Event, len(states))
					for j, to := range states {
						evs[j] = event(next, m.Seq+uint64(j)+1, to)
						next.State = to
					}
					next.Seq += uint64(len(states))
					out[i] = [2]any{next, evs}
					m = next
				}
				s.ms[w] = m
				return out
			}
			b.ResetTimer()
			done := 0
			for r := range rounds {
				b.StopTimer()
				chunk := b.N*(r+1)/rounds - done
				done += chunk
				for _, s := range sides {
					plans := make([][][2]any, writers)
					for w := range writers {
						plans[w] = plan(s, w, chunk/writers+btoi(w < chunk%writers))
					}
					b.StartTimer()
					start := time.Now()
					var wg sync.WaitGroup
					stop := make(chan struct{})
					var acks sync.WaitGroup
					if s.acker {
						acks.Go(func() { drain(b, s.db, stop) })
					}
					for _, p := range plans {
						wg.Go(func() {
							for _, a := range p {
								if err := s.db.Save(ctx, a[0].(*driver.Mission), a[1].([]driver.Event)); err != nil {
									b.Error(err)
									return
								}
							}
						})
					}
					wg.Wait()
					close(stop)
					acks.Wait()
					s.took += time.Since(start)
					b.StopTimer()
				}
			}
			off := float64(b.N) / sides[0].took.Seconds()
			on := float64(b.N) / sides[1].took.Seconds()
			b.ReportMetric(off, "saves/s-off")
			b.ReportMetric(on, "saves/s-on")
			b.ReportMetric(on/off, "x-off")
			b.ReportMetric(float64(b.N)/sides[2].took.Seconds()/off, "x-off-acked")
			if n := sides[1].db.OutboxLen(); n != 3*b.N {
				b.Errorf("outbox holds %d entries, want %d", n, 3*b.N)
			}
		})
	}
}

// drain reads and acknowledges the outbox until stop, then empties it.
func drain(b *testing.B, db *DB, stop <-chan struct{}) {
	ctx := context.Background()
	for {
		es, err := db.Outbox(ctx, 0, 256)
		if err != nil {
			b.Error(err)
			return
		}
		if len(es) == 0 {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond): // the uplink idles until notified
				continue
			}
		}
		if _, err := db.AckOutbox(ctx, es[len(es)-1].Seq); err != nil {
			b.Error(err)
			return
		}
	}
}

func btoi(v bool) int {
	if v {
		return 1
	}
	return 0
}
