package store_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/store"
)

// rawCommitRate measures the baseline: one small put per fsync'd bbolt
// transaction, in commits per second.
func rawCommitRate(b *testing.B, n int) float64 {
	b.Helper()
	db, err := bolt.Open(filepath.Join(b.TempDir(), "raw.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := db.Close(); err != nil {
			b.Error(err)
		}
	}()
	key := make([]byte, 8)
	start := time.Now()
	for i := range n {
		binary.BigEndian.PutUint64(key, uint64(i))
		if err := db.Update(func(tx *bolt.Tx) error {
			bk, err := tx.CreateBucketIfNotExists([]byte("raw"))
			if err != nil {
				return err
			}
			return bk.Put(key, []byte("0123456789abcdef"))
		}); err != nil {
			b.Fatal(err)
		}
	}
	return float64(n) / time.Since(start).Seconds()
}

// BenchmarkDriverSteps measures durable steps per second through the
// driver and the bbolt store with a no-op handler and 3-step missions,
// with 1 and 64 missions in flight (each in-flight slot is a client
// submitting a mission and waiting for it to finish, back to back),
// beside the raw commit rate measured in the same run. Submits are
// included: they are durable writes too.
func BenchmarkDriverSteps(b *testing.B) {
	noop := driver.HandlerFunc(func(context.Context, driver.StepRequest) (map[string]any, error) { return nil, nil })
	for _, conc := range []int{1, 64} {
		b.Run(fmt.Sprintf("missions=%d", conc), func(b *testing.B) {
			raw := rawCommitRate(b, 400)
			db, err := store.Open(filepath.Join(b.TempDir(), "missions.db"), store.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer func() {
				if err := db.Close(); err != nil {
					b.Error(err)
				}
			}()
			var mu sync.Mutex
			done := map[string]chan struct{}{}
			waiter := func(id string) chan struct{} {
				mu.Lock()
				defer mu.Unlock()
				ch := done[id]
				if ch == nil {
					ch = make(chan struct{}, 1)
					done[id] = ch
				}
				return ch
			}
			d, err := driver.New(driver.Options{
				Store: db, Handlers: map[string]driver.Handler{"noop": noop}, Workers: 64,
				Observers: []driver.Observer{driver.ObserverFunc(func(ev driver.Event, m *driver.Mission) {
					if ev.To.Terminal() {
						waiter(m.ID) <- struct{}{}
					}
				})},
			})
			if err != nil {
				b.Fatal(err)
			}
			if err := d.Start(context.Background()); err != nil {
				b.Fatal(err)
			}
			steps := []driver.Step{{ID: "a", Kind: "noop"}, {ID: "b", Kind: "noop"}, {ID: "c", Kind: "noop"}}
			var next atomic.Int64
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for range conc {
				wg.Go(func() {
					for next.Add(1) <= int64(b.N) {
						m, _, err := d.Submit(context.Background(), driver.Spec{Type: "bench", Steps: steps})
						if err != nil {
							b.Error(err)
							return
						}
						<-waiter(m.ID)
						mu.Lock()
						delete(done, m.ID)
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			if err := d.Stop(context.Background()); err != nil {
				b.Fatal(err)
			}
			raw = (raw + rawCommitRate(b, 400)) / 2
			rate := float64(3*b.N) / elapsed.Seconds()
			b.ReportMetric(rate, "steps/s")
			b.ReportMetric(raw, "raw-commits/s")
			b.ReportMetric(rate/raw, "ratio")
		})
	}
}
