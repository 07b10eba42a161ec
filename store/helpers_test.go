package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/store/internal/wal"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func testOptions() Options {
	return Options{Timeout: 100 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), CheckpointDelay: 50 * time.Millisecond}
}

// openUnsynced opens a store at path whose log and file are written
// without waiting for the disk (unsyncedFS, bbolt's NoSync), for the
// tests that commit thousands of missions to see what the store keeps
// and how big its file grows; what survives a power cut is the business
// of powercut_test.go. The log's blocks and the file's pages are laid
// out as on a gateway.
func openUnsynced(tb testing.TB, path string) *DB {
	tb.Helper()
	opts := testOptions()
	opts.logFS, opts.boltNoSync = unsyncedFS{}, true
	return openWith(tb, path, opts)
}

// unsyncedFS is the operating system's file system without syncs: the
// log's O_DIRECT|O_DSYNC are dropped (its writes still cover whole
// blocks, as on a disk that takes O_DIRECT), and Sync does nothing.
type unsyncedFS struct{}

func (unsyncedFS) OpenFile(name string, flag int, perm os.FileMode) (wal.File, error) {
	f, err := wal.OS.OpenFile(name, flag&^wal.DirectFlags, perm)
	if err != nil {
		return nil, err
	}
	return unsyncedFile{f}, nil
}
func (unsyncedFS) ReadFile(name string) ([]byte, error)           { return wal.OS.ReadFile(name) }
func (unsyncedFS) Head(name string, n int) ([]byte, int64, error) { return wal.OS.Head(name, n) }
func (unsyncedFS) Remove(name string) error                       { return wal.OS.Remove(name) }
func (unsyncedFS) SyncDir(string) error                           { return nil }

type unsyncedFile struct{ wal.File }

func (unsyncedFile) Sync() error { return nil }

// openTest opens a store in a fresh directory. Cleanup checks the
// store's invariants, then closes it.
func openTest(tb testing.TB) *DB {
	tb.Helper()
	return openAt(tb, filepath.Join(tb.TempDir(), "sortie.db"))
}

func openAt(tb testing.TB, path string) *DB {
	tb.Helper()
	return openWith(tb, path, testOptions())
}

// openWith opens a store at path with opts; Cleanup checks its
// invariants, then closes it.
func openWith(tb testing.TB, path string, opts Options) *DB {
	tb.Helper()
	db, err := Open(path, opts)
	if err != nil {
		tb.Fatalf("Open: %v", err)
	}
	tb.Cleanup(func() {
		checkInvariants(tb, db)
		if err := db.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return db
}

// checkInvariants verifies that every index agrees with the missions
// bucket, and runs bbolt's own page check. It checks bbolt as it is,
// without applying the log first.
func checkInvariants(tb testing.TB, db *DB) {
	tb.Helper()
	// bbolt's Check reads the freelist unlocked, so no checkpoint may
	// commit meanwhile: ckMu, taken after gate as lockorder.go says.
	if err := db.enter(); err != nil {
		if !errors.Is(err, driver.ErrClosed) {
			tb.Errorf("store invariants: %v", err)
		}
		return
	}
	defer db.leave()
	db.ckMu.Lock()
	defer db.ckMu.Unlock()
	err := db.bolt.View(func(tx *bolt.Tx) error {
		var problems []error
		for err := range tx.Check() {
			problems = append(problems, err) // drain: Check's goroutine blocks otherwise
		}
		if len(problems) > 0 {
			return fmt.Errorf("bbolt check: %w", errors.Join(problems...))
		}
		b := bucketsOf(tx)
		orders := map[string]int{}
		if err := b.order.ForEach(func(k, id []byte) error {
			h, err := parseEnvelope(b.missions.Get(id))
			if err != nil {
				return fmt.Errorf("order %x names %q: %w", k, id, err)
			}
			if h.order != binary.BigEndian.Uint64(k) {
				return fmt.Errorf("order %x names %q, whose header says %d", k, id, h.order)
			}
			orders[string(id)]++
			return nil
		}); err != nil {
			return err
		}
		if err := b.missions.ForEach(func(id, rec []byte) error {
			e, _, err := record(b.missions, b.live, id)
			var m *driver.Mission
			if err == nil {
				m, err = e.mission()
			}
			if err != nil {
				return fmt.Errorf("mission %q: %w", id, err)
			}
			if orders[string(id)] != 1 {
				return fmt.Errorf("mission %q has %d order entries", id, orders[string(id)])
			}
			active := b.active.Get(id) != nil
			finished := b.finished.Get(finishedKey(finishedAt(m), m.ID)) != nil
			if active == m.State.Terminal() || finished != m.State.Terminal() {
				return fmt.Errorf("mission %q in %s: active=%v finished=%v", id, m.State, active, finished)
			}
			if rk := m.Meta.RequestKey; rk != "" && b.requests.Get([]byte(rk)) == nil {
				return fmt.Errorf("mission %q: request key %q not indexed", id, rk)
			}
			// A finished mission is an archive holding its timeline; a
			// live one keeps its events in the timeline bucket.
			h, _ := parseEnvelope(rec)
			if archived := h.form == formArchive; archived != m.State.Terminal() || !archived && h.form != formLive {
				return fmt.Errorf("mission %q in %s: record form %#x", id, m.State, h.form)
			}
			if h.state != stateCode(m.State) {
				return fmt.Errorf("mission %q in %s: header state %d", id, m.State, h.state)
			}
			if h.form == formArchive {
				if k, _ := b.timeline.Cursor().Seek(timelinePrefix(m.ID)); k != nil && bytes.HasPrefix(k, timelinePrefix(m.ID)) {
					return fmt.Errorf("archived mission %q has events in the timeline bucket", id)
				}
			}
			return nil
		}); err != nil {
			return err
		}
		kept, err := readCounts(tx)
		if err != nil {
			return err
		}
		if real, _ := recount(tx); kept != real {
			return fmt.Errorf("meta counts %+v, counted %+v", kept, real)
		}
		for _, idx := range []struct {
			name string
			b    *bolt.Bucket
			id   func(k, v []byte) []byte
		}{
			{"active", b.active, func(k, _ []byte) []byte { return k }},
			{"finished", b.finished, func(k, _ []byte) []byte { return k[8:] }},
			{"requests", b.requests, func(_, v []byte) []byte { return v }},
			{"timeline", b.timeline, func(k, _ []byte) []byte { return k[:bytes.IndexByte(k, 0)] }},
			{"live", b.live, func(k, _ []byte) []byte { return k }},
		} {
			if err := idx.b.ForEach(func(k, v []byte) error {
				if b.missions.Get(idx.id(k, v)) == nil {
					return fmt.Errorf("%s entry %q names a missing mission", idx.name, k)
				}
				return nil
			}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, driver.ErrClosed) {
		tb.Errorf("store invariants: %v", err)
	}
}

// newMission is a realistic three-step mission at version 1, PENDING.
func newMission(id string) *driver.Mission {
	steps := []driver.Step{
		{ID: "lock", Kind: "device.command", Params: json.RawMessage(`{"device":"door-1","cmd":"lock"}`),
			Timeout: driver.Duration(5 * time.Second), Retry: driver.RetryPolicy{MaxAttempts: 3},
			Compensate: &driver.Compensation{Kind: "device.command", Params: json.RawMessage(`{"device":"door-1","cmd":"unlock"}`)}},
		{ID: "lights", Kind: "device.command", Params: json.RawMessage(`{"device":"lamp-7","cmd":"set","value":{"on":false}}`),
			Retry: driver.RetryPolicy{MaxAttempts: 5}},
		{ID: "arm", Kind: "device.command", Params: json.RawMessage(`{"device":"alarm-1","cmd":"arm","value":{"mode":"away"}}`),
			Retry: driver.RetryPolicy{MaxAttempts: 2}},
	}
	return &driver.Mission{
		ID:       id,
		Type:     "leave_home",
		Priority: 5,
		Context:  driver.Context{Schema: driver.ContextSchema, Values: map[string]any{"trigger": "geofence", "user": "ana"}},
		Steps:    steps,
		State:    driver.StatePending,
		Results:  make([]driver.StepResult, len(steps)),
		Meta: driver.Metadata{Created: t0, Updated: t0, TraceID: "trace-" + id,
			Labels: map[string]string{"gateway": "gw-01"}},
		Version: 1,
		Seq:     1,
	}
}

// event is the event with the given seq moving m to state to.
func event(m *driver.Mission, seq uint64, to driver.State) driver.Event {
	return driver.Event{MissionID: m.ID, Seq: seq, Type: "transition", Input: driver.InStart,
		From: m.State, To: to, Step: -1, Time: t0.Add(time.Duration(seq) * time.Second)}
}

// advance returns the next version of m in state to, with its event.
func advance(m *driver.Mission, to driver.State) (*driver.Mission, []driver.Event) {
	n := m.Clone()
	ev := event(m, m.Seq+1, to)
	n.State, n.Seq, n.Version = to, m.Seq+1, m.Version+1
	n.Meta.Updated = ev.Time
	if to.Terminal() {
		n.Meta.Finished = ev.Time
	}
	return n, []driver.Event{ev}
}

func mustCreate(tb testing.TB, db *DB, m *driver.Mission) {
	tb.Helper()
	if _, created, err := db.Create(context.Background(), m, []driver.Event{event(m, 1, driver.StatePending)}); err != nil || !created {
		tb.Fatalf("Create(%s) = created %v, %v", m.ID, created, err)
	}
}

func mustSave(tb testing.TB, db *DB, m *driver.Mission, to driver.State) *driver.Mission {
	tb.Helper()
	n, evs := advance(m, to)
	if err := db.Save(context.Background(), n, evs); err != nil {
		tb.Fatalf("Save(%s v%d): %v", n.ID, n.Version, err)
	}
	return n
}

func mustGet(tb testing.TB, db *DB, id string) *driver.Mission {
	tb.Helper()
	m, err := db.Get(context.Background(), id)
	if err != nil {
		tb.Fatalf("Get(%s): %v", id, err)
	}
	return m
}

// sameJSON compares missions by their encoding, which is what the store
// promises to keep.
func sameJSON(tb testing.TB, got, want any) {
	tb.Helper()
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want)
	if !bytes.Equal(g, w) {
		tb.Errorf("got  %s\nwant %s", g, w)
	}
}

func ids(ms []*driver.Mission) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

func mid(i int) string { return fmt.Sprintf("m%08d", i) }

// mustClose closes c (a DB, a bbolt file, a reader), failing the test if
// that fails: a Close error is a store error like any other.
func mustClose(tb testing.TB, c io.Closer) {
	tb.Helper()
	if err := c.Close(); err != nil {
		tb.Fatalf("close: %v", err)
	}
}

// writeFile writes data to the file at path, failing the test if that
// fails.
func writeFile(tb testing.TB, path string, data []byte) {
	tb.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		tb.Fatal(err)
	}
}
