package store

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
)

// benchDir is where benchmark files live: SORTIE_BENCH_DIR, to measure
// the disk a gateway really writes to, or a temporary directory.
func benchDir(b testing.TB) string {
	if dir := os.Getenv("SORTIE_BENCH_DIR"); dir != "" {
		dir, err := os.MkdirTemp(dir, "bench")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			if err := os.RemoveAll(dir); err != nil {
				b.Error(err)
			}
		})
		return dir
	}
	return b.TempDir()
}

// rawDB is the baseline: a bbolt file taking one small put per Update,
// each commit with its fsyncs.
type rawDB struct {
	bdb *bolt.DB
	n   uint64
}

func openRaw(b testing.TB) *rawDB {
	b.Helper()
	bdb, err := bolt.Open(filepath.Join(benchDir(b), "raw.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { mustClose(b, bdb) })
	if err := bdb.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("raw")); return err }); err != nil {
		b.Fatal(err)
	}
	return &rawDB{bdb: bdb}
}

// puts commits n puts one by one and returns the time they took.
func (r *rawDB) puts(b testing.TB, n int) time.Duration {
	val := make([]byte, 64)
	start := time.Now()
	for range n {
		r.n++
		err := r.bdb.Update(func(tx *bolt.Tx) error {
			return tx.Bucket([]byte("raw")).Put(be64(r.n), val)
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(start)
}

func BenchmarkRawPut(b *testing.B) {
	r := openRaw(b)
	b.ResetTimer()
	b.ReportMetric(float64(b.N)/r.puts(b, b.N).Seconds(), "commits/s")
}

// BenchmarkSave measures saves of three-step missions, each carrying
// three events, by 1 and 64 concurrent writers (each advancing its own
// mission), against the raw single-put commit rate. The two alternate in
// rounds within the run, so that both see the same disk: a virtual disk's
// fsync latency drifts by several times within seconds. The lone writer
// is also compared with the same saves committed straight through
// bbolt, bypassing the group-commit queue ("x-direct" ≈ 1: no added
// delay).
func BenchmarkSave(b *testing.B) {
	const rounds = 10
	for _, writers := range []int{1, 64} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			db, err := Open(filepath.Join(benchDir(b), "sortie.db"), testOptions())
			if err != nil {
				b.Fatal(err)
			}
			defer mustClose(b, db)
			raw := openRaw(b)
			ctx := context.Background()
			ms := make([]*driver.Mission, writers+1) // the last for direct commits
			for w := range ms {
				ms[w] = newMission(mid(w))
				if _, _, err := db.Create(ctx, ms[w], nil); err != nil {
					b.Fatal(err)
				}
			}
			before, _ := db.Stats()
			states := []driver.State{driver.StateRunning, driver.StateStepRunning, driver.StateStepSucceeded}
			type saveArgs struct {
				m   *driver.Mission
				evs []driver.Event
			}
			// plan builds writer w's next n saves, each advancing its mission
			// by three events. Building them is the driver's work, so it
			// happens outside the timed part.
			plan := func(w, n int) []saveArgs {
				out := make([]saveArgs, n)
				m := ms[w]
				for i := range out {
					next := m.Clone()
					next.Version++
					next.Progress.Step = int(next.Version) % len(m.Steps)
					evs := make([]driver.Event, len(states))
					for j, to := range states {
						evs[j] = event(next, m.Seq+uint64(j)+1, to)
						next.State = to
					}
					next.Seq += uint64(len(states))
					out[i] = saveArgs{next, evs}
					m = next
				}
				ms[w] = m
				return out
			}

			b.ResetTimer()
			var saveTime, rawTime, directTime time.Duration
			rawN, done := 0, 0
			for r := range rounds {
				b.StopTimer()
				chunk := b.N*(r+1)/rounds - done
				done += chunk
				plans := make([][]saveArgs, writers)
				for w := range writers {
					n := chunk / writers
					if w < chunk%writers {
						n++
					}
					plans[w] = plan(w, n)
				}
				b.StartTimer()
				start := time.Now()
				var wg sync.WaitGroup
				for _, p := range plans {
					wg.Go(func() {
						for _, s := range p {
							if err := db.Save(ctx, s.m, s.evs); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				saveTime += time.Since(start)
				b.StopTimer()
				// The baseline gets as many commits, within bounds that
				// keep a large b.N from spending minutes on it.
				n := min(max(chunk, 20), 200)
				rawTime += raw.puts(b, n)
				rawN += n
				if writers == 1 {
					direct := plan(writers, chunk)
					start := time.Now()
					for _, s := range direct {
						w, err := newWrite(false, s.m, s.evs)
						if err == nil {
							db.commitBatch([]*write{w})
							err = w.err
						}
						if err != nil {
							b.Fatal(err)
						}
					}
					directTime += time.Since(start)
				}
				b.StartTimer()
			}
			b.StopTimer()

			after, _ := db.Stats()
			saves := float64(b.N) / saveTime.Seconds()
			rawRate := float64(rawN) / rawTime.Seconds()
			b.ReportMetric(saves, "saves/s")
			b.ReportMetric(rawRate, "raw-commits/s")
			b.ReportMetric(saves/rawRate, "x-raw")
			if writers == 1 {
				b.ReportMetric(directTime.Seconds()/saveTime.Seconds(), "x-direct")
			} else {
				b.ReportMetric(float64(after.Writes-before.Writes)/float64(after.Commits-before.Commits), "saves/commit")
			}
		})
	}
}
