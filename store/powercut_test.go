package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/store/internal/crashfs"
	"github.com/sortie-edge/sortie/store/internal/wal"
)

// Power-cut runs: SORTIE_POWERCUTS sets how many (default
// defaultPowerCuts, about 30 s of CPU under -race, so 15 s on two idle
// cores), and SORTIE_POWERCUT_SEED replays one run, as a failure names
// it: the choices replay exactly, the interleaving of its writers and
// checkpoints only roughly.
const defaultPowerCuts = 200

// powerCutRounds is how many times a run cuts the power.
const powerCutRounds = 4

// TestPowerCutKeepsAcknowledgedWrites cuts the power at a random
// operation of the log's file system (crashfs), over and over, while
// writers create and save missions, checkpoints run and the store opens
// and closes, and boots the machine each time from what the disk kept:
// writes not yet synced dropped (the last one torn) or, in the other
// mode, partly written back, directory entries not yet synced lost. Each
// boot must open the store and find every write whose call returned,
// each mission at a version some call wrote (acknowledged, or in flight
// at the cut), its timeline and outbox entries exactly that version's,
// and bbolt's pages, indexes and counts consistent.
//
// bbolt's own file is copied as a read transaction sees it at the cut:
// a commit is atomic on disk, which bbolt's robustness tests check, and
// it returns only once durable, which the store's ordering relies on
// (the log is rewound only after the checkpoint that applied it). So the
// model is exact for the log and the ordering between the two, and
// trusts bbolt for its own pages.
func TestPowerCutKeepsAcknowledgedWrites(t *testing.T) {
	runs, base := defaultPowerCuts, uint64(time.Now().UnixNano())
	if v := os.Getenv("SORTIE_POWERCUTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("SORTIE_POWERCUTS=%q: %v", v, err)
		}
		runs = n
	}
	if v := os.Getenv("SORTIE_POWERCUT_SEED"); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("SORTIE_POWERCUT_SEED=%q: %v", v, err)
		}
		runs, base = 1, seed
	}
	if testing.Short() {
		runs = min(runs, 100)
	}
	t.Logf("%d runs, seeds %d to %d", runs, base, base+uint64(runs)-1)
	var next atomic.Uint64
	var cuts, inOpen, idle, found, lost atomic.Int64
	workers := min(runtime.GOMAXPROCS(0), runs)
	for w := range workers {
		t.Run(fmt.Sprintf("worker%d", w), func(t *testing.T) {
			t.Parallel()
			for {
				i := next.Add(1) - 1
				if i >= uint64(runs) {
					return
				}
				seed := base + i
				st := powerCutRun(t, seed)
				if t.Failed() {
					t.Fatalf("seed %d failed; replay it with SORTIE_POWERCUT_SEED=%d", seed, seed)
				}
				cuts.Add(int64(st.cuts))
				inOpen.Add(int64(st.inOpen))
				idle.Add(int64(st.idle))
				found.Add(int64(st.inflightFound))
				lost.Add(int64(st.inflightLost))
			}
		})
	}
	t.Cleanup(func() {
		t.Logf("%d power cuts (%d in Open, %d with the store idle or closed); writes in flight at a cut: %d kept, %d lost",
			cuts.Load(), inOpen.Load(), idle.Load(), found.Load(), lost.Load())
	})
}

type powerCutStats struct {
	cuts, inOpen, idle          int
	inflightFound, inflightLost int
}

// tracked is what the test wrote of one mission: every version, and
// which of them a call acknowledged.
type tracked struct {
	versions []*driver.Mission // versions[v-1] is version v as written
	events   []driver.Event    // in seq order, every version's
	acked    int               // highest version a call returned nil for
	tried    int               // highest version a call was made for
}

func (tr *tracked) at(v int) *driver.Mission { return tr.versions[v-1] }

// powerCutRun is one seeded run: a few rounds of open, write, cut,
// reboot and check.
func powerCutRun(t *testing.T, seed uint64) (st powerCutStats) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	path := filepath.Join(t.TempDir(), "sortie.db")
	mode := crashfs.Mode(rng.IntN(2))
	fsys := crashfs.New(crashfs.Options{Seed: rng.Uint64(), Mode: mode, NoDirect: rng.IntN(3) == 0})
	opts := Options{
		Timeout: time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Outbox:          rng.IntN(2) == 0,
		CheckpointDelay: []time.Duration{time.Millisecond, 5 * time.Millisecond, time.Hour}[rng.IntN(3)],
		boltNoSync:      true,
		boltNoGrowSync:  true,
		// Small enough that the log often grows past it, and that a run
		// is not spent writing megabytes of zeros.
		logPrealloc: []int{wal.Block, 4 * wal.Block, 16 * wal.Block}[rng.IntN(3)],
	}
	missions := map[string]*tracked{}
	var bolted []byte // the bbolt file as of the last cut
	for round := range powerCutRounds {
		var cur atomic.Pointer[DB]
		writers := 1 + rng.IntN(3)
		perWriter := 2 + rng.IntN(12)
		// A round's operations: an open (five), a commit per write (one
		// direct, two buffered) and a close; a cut past them comes after
		// the round, with the store idle or closed.
		fsys.CutAt(1+rng.IntN(6+3*writers*perWriter/2), func() {
			bolted = boltImage(t, path, cur.Load())
		})
		opts.logFS = fsys
		db, err := Open(path, opts)
		if err == nil {
			cur.Store(db)
			checkRecovered(t, db, missions, &st)
			if t.Failed() {
				return st
			}
			powerCutWrites(db, rng.Uint64(), writers, perWriter, missions, round)
			if rng.IntN(4) == 0 {
				_ = db.Close() // the cut may come in it
				cur.Store(nil)
			}
		} else if !errors.Is(err, crashfs.ErrPowerCut) {
			t.Errorf("round %d: Open: %v", round, err)
			return st
		} else {
			st.inOpen++
		}
		if fsys.Cut() { // it had not come yet
			st.idle++
		}
		st.cuts++
		if db != nil {
			_ = db.Close() // the process is gone: only its lock and handles matter
		}
		writeFile(t, path, bolted)
		fsys = fsys.Restart(rng.Uint64())
	}
	opts.logFS = fsys
	db, err := Open(path, opts)
	if err != nil {
		t.Errorf("last Open: %v", err)
		return st
	}
	checkRecovered(t, db, missions, &st)
	if err := db.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	return st
}

// boltImage is the bbolt file as a power cut now would leave it: its
// last committed transaction. db is nil while Open runs, when nothing
// else writes the file.
func boltImage(t *testing.T, path string, db *DB) []byte {
	if db == nil {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Errorf("copy bbolt file: %v", err)
		}
		return b
	}
	var buf bytes.Buffer
	if err := db.bolt.View(func(tx *bolt.Tx) error {
		_, err := tx.WriteTo(&buf)
		return err
	}); err != nil {
		t.Errorf("copy bbolt file: %v", err)
	}
	return buf.Bytes()
}

// powerCutWrites runs writers goroutines, each creating and saving its
// own missions until it has made n calls or one fails (the power is
// cut: the process is dying), and scanning now and then, which
// checkpoints.
func powerCutWrites(db *DB, seed uint64, writers, n int, missions map[string]*tracked, round int) {
	owned := make([][]string, writers)
	for id, tr := range missions {
		if w := int(id[1] - '0'); w < writers && !tr.at(tr.acked).State.Terminal() {
			owned[w] = append(owned[w], id)
		}
	}
	for _, own := range owned {
		slices.Sort(own) // map order would make a seed's run differ
	}
	var mu sync.Mutex // guards missions
	var wg sync.WaitGroup
	for w, own := range owned {
		rng := rand.New(rand.NewPCG(seed, uint64(w)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			for i := range n {
				if rng.IntN(8) == 0 {
					_, _ = db.Stats() // a scan: it checkpoints first
				}
				if len(own) == 0 || rng.IntN(3) == 0 {
					id := fmt.Sprintf("m%d-%d-%03d", w, round, i)
					m := newMission(id)
					evs := []driver.Event{event(m, 1, driver.StatePending)}
					tr := &tracked{versions: []*driver.Mission{m}, events: evs, tried: 1}
					mu.Lock()
					missions[id] = tr
					mu.Unlock()
					_, _, err := db.Create(ctx, m, evs)
					if err != nil {
						return
					}
					mu.Lock()
					tr.acked = 1
					mu.Unlock()
					own = append(own, id)
					continue
				}
				k := rng.IntN(len(own))
				mu.Lock()
				tr := missions[own[k]]
				m := tr.at(tr.acked)
				mu.Unlock()
				to := driver.StateRunning
				switch rng.IntN(6) {
				case 0:
					to = driver.StateSucceeded
				case 1:
					to = driver.StateFailed
				}
				next, evs := advanceBy(m, to, 1+rng.IntN(2))
				mu.Lock()
				tr.versions = append(tr.versions[:tr.acked], next)
				tr.events = append(tr.events, evs...)
				tr.tried = tr.acked + 1
				mu.Unlock()
				if err := db.Save(ctx, next, evs); err != nil {
					return
				}
				mu.Lock()
				tr.acked = tr.tried
				mu.Unlock()
				if to.Terminal() && rng.IntN(4) != 0 {
					own = append(own[:k], own[k+1:]...) // finished; the rest are retried later
				}
			}
		}()
	}
	wg.Wait()
}

// advanceBy is advance with k events.
func advanceBy(m *driver.Mission, to driver.State, k int) (*driver.Mission, []driver.Event) {
	n := m.Clone()
	var evs []driver.Event
	for i := range k {
		evs = append(evs, event(m, m.Seq+1+uint64(i), to))
	}
	last := evs[k-1]
	n.State, n.Seq, n.Version = to, last.Seq, m.Version+1
	n.Meta.Updated = last.Time
	n.Meta.Finished = time.Time{}
	if to.Terminal() {
		n.Meta.Finished = last.Time
	}
	return n, evs
}

// checkRecovered checks a store just opened after a cut against what
// was written, then takes what it found as acknowledged: the next round
// writes on from there.
func checkRecovered(t *testing.T, db *DB, missions map[string]*tracked, st *powerCutStats) {
	t.Helper()
	ctx := context.Background()
	seen := map[string]uint64{} // mission → highest event seq it has
	for id, tr := range missions {
		v := 0
		m, err := db.Get(ctx, id)
		switch {
		case errors.Is(err, driver.ErrNotFound):
		case err != nil:
			t.Errorf("Get(%s): %v", id, err)
			return
		default:
			v = int(m.Version)
		}
		if v < tr.acked || v > tr.tried {
			t.Errorf("mission %s at version %d after the cut; acknowledged %d, written up to %d", id, v, tr.acked, tr.tried)
			return
		}
		if tr.tried > tr.acked {
			if v == tr.tried {
				st.inflightFound++
			} else {
				st.inflightLost++
			}
		}
		if v == 0 {
			delete(missions, id)
			continue
		}
		want := tr.at(v)
		if !sameEncoding(m, want) {
			t.Errorf("mission %s version %d differs from what was written:\n got  %s\n want %s", id, v, js(m), js(want))
			return
		}
		evs, err := db.Timeline(ctx, id)
		if err != nil {
			t.Errorf("Timeline(%s): %v", id, err)
			return
		}
		var wantEvs []driver.Event
		for _, ev := range tr.events {
			if ev.Seq <= want.Seq {
				wantEvs = append(wantEvs, ev)
			}
		}
		if !sameEncoding(evs, wantEvs) {
			t.Errorf("mission %s version %d timeline:\n got  %s\n want %s", id, v, js(evs), js(wantEvs))
			return
		}
		seen[id] = want.Seq
		tr.versions, tr.acked, tr.tried = tr.versions[:v], v, v
		tr.events = wantEvs
	}
	if db.ob.enabled {
		checkOutboxRecovered(t, db, seen)
	}
	if _, err := db.Stats(); err != nil { // checkpoints
		t.Errorf("Stats: %v", err)
	}
	checkInvariants(t, db)
}

// checkOutboxRecovered: the outbox holds one entry per recovered event,
// in increasing seqs, and none for an event that was not recovered.
func checkOutboxRecovered(t *testing.T, db *DB, seen map[string]uint64) {
	t.Helper()
	entries, err := db.Outbox(context.Background(), 0, 1<<20)
	if err != nil {
		t.Errorf("Outbox: %v", err)
		return
	}
	type key struct {
		id  string
		seq uint64
	}
	got := map[key]bool{}
	var last uint64
	for _, e := range entries {
		k := key{e.Event.MissionID, e.Event.Seq}
		if e.Seq <= last || got[k] {
			t.Errorf("outbox entry %d (mission %s event %d) out of order or repeated", e.Seq, k.id, k.seq)
			return
		}
		last, got[k] = e.Seq, true
		if k.seq > seen[k.id] {
			t.Errorf("outbox entry %d: mission %s event %d, which was not recovered (it has up to %d)", e.Seq, k.id, k.seq, seen[k.id])
			return
		}
	}
	for id, top := range seen {
		for seq := uint64(1); seq <= top; seq++ {
			if !got[key{id, seq}] {
				t.Errorf("outbox lacks mission %s event %d", id, seq)
				return
			}
		}
	}
}

func sameEncoding(a, b any) bool { return js(a) == js(b) }

func js(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
