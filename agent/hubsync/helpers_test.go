package hubsync

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/store"
	"github.com/sortie-edge/sortie/uplink"
)

const gw = "gw-01"

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// wait bounds every await of a test; nothing here should take it.
const wait = 15 * time.Second

// openStore opens a store with the outbox on at path.
func openStore(tb testing.TB, path string) *store.DB {
	tb.Helper()
	db, err := store.Open(path, store.Options{Timeout: time.Second, Logger: discard, Outbox: true})
	if err != nil {
		tb.Fatalf("open store: %v", err)
	}
	tb.Cleanup(func() {
		if err := db.Close(); err != nil {
			tb.Errorf("close store: %v", err)
		}
	})
	return db
}

// world writes missions to a store and remembers what it wrote.
type world struct {
	tb      testing.TB
	db      *store.DB
	ms      map[string]*driver.Mission
	written []string // "mission/seq" in commit order
}

func newWorld(tb testing.TB) *world {
	return &world{tb: tb, db: openStore(tb, filepath.Join(tb.TempDir(), "sortie.db")), ms: map[string]*driver.Mission{}}
}

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// step creates mission id, or advances it by one event.
func (w *world) step(id string) {
	w.tb.Helper()
	ctx := context.Background()
	m, ok := w.ms[id]
	if !ok {
		m = &driver.Mission{
			ID: id, Type: "go_home", State: driver.StatePending, Version: 1, Seq: 1,
			Steps: []driver.Step{{ID: "lights", Kind: "device.command"}, {ID: "lock", Kind: "device.command"}},
			Meta:  driver.Metadata{Created: t0, Updated: t0, TraceID: "t-" + id},
		}
		ev := driver.Event{MissionID: id, Seq: 1, Type: "created", To: driver.StatePending, Step: -1, Time: t0}
		if _, _, err := w.db.Create(ctx, m, []driver.Event{ev}); err != nil {
			w.tb.Fatalf("create %s: %v", id, err)
		}
	} else {
		n := m.Clone()
		n.Version++
		n.Seq++
		n.State = driver.StateRunning
		n.Meta.Updated = t0.Add(time.Duration(n.Seq) * time.Second)
		ev := driver.Event{MissionID: id, Seq: n.Seq, Type: "transition", From: m.State, To: n.State, Step: -1, Time: n.Meta.Updated}
		if err := w.db.Save(ctx, n, []driver.Event{ev}); err != nil {
			w.tb.Fatalf("save %s: %v", id, err)
		}
		m = n
	}
	w.ms[id] = m
	w.written = append(w.written, fmt.Sprintf("%s/%d", id, m.Seq))
}

// steps interleaves n events over missions m0..m(k-1).
func (w *world) steps(k, n int) {
	w.tb.Helper()
	for i := range n {
		w.step(fmt.Sprintf("m%d", i%k))
	}
}

// hub is a test stand-in for cmd/hub: a paho client on the hub broker
// that records what gateways publish, keeps the first copy of each
// entry (deduplicating by mission and event seq, as the hub does) and
// sends acks and control requests when told.
type hub struct {
	tb     testing.TB
	client mqtt.Client
	topics uplink.Topics

	mu        sync.Mutex
	changed   chan struct{}
	ready     bool
	entries   []uplink.Entry // first copies, in arrival order
	seen      map[string]bool
	received  int // entries received, duplicates included
	maxSeq    uint64
	statuses  []uplink.Status
	beats     []uplink.Heartbeat
	results   []uplink.ControlResult
	traces    []uplink.TraceRecord
	traceQoS  []byte // of each trace batch, in arrival order
	malformed int
	// links are the batches' After (-1 when absent), Acked and last seq;
	// outboxes the outbox each names.
	links    [][3]int64
	outboxes []string
}

func newHub(tb testing.TB, url string) *hub {
	tb.Helper()
	h := &hub{tb: tb, changed: make(chan struct{}), seen: map[string]bool{}}
	opts := mqtt.NewClientOptions().AddBroker(url).SetClientID(fmt.Sprintf("hub-%p", h)).
		SetCleanSession(true).SetResumeSubs(false).
		// In order, so first copies are recorded as they arrived; the
		// handler only records, so it never blocks.
		SetOrderMatters(true).
		SetAutoReconnect(true).SetConnectRetry(true).SetConnectRetryInterval(100 * time.Millisecond).
		SetMaxReconnectInterval(500 * time.Millisecond).
		SetOnConnectHandler(func(c mqtt.Client) {
			filters := map[string]byte{}
			for _, k := range []string{"events", "status", "heartbeat", "control/result", "traces"} {
				filters[h.topics.Wildcard(k)] = 1
			}
			tok := c.SubscribeMultiple(filters, h.onMessage)
			if !tok.WaitTimeout(wait) || tok.Error() != nil {
				tb.Errorf("hub subscribe: %v", tok.Error())
				return
			}
			h.record(func() { h.ready = true })
		}).
		SetConnectionLostHandler(func(mqtt.Client, error) { h.record(func() { h.ready = false }) })
	h.client = mqtt.NewClient(opts)
	h.client.Connect()
	tb.Cleanup(func() { h.client.Disconnect(0) })
	h.waitFor("hub subscribed", func() bool { return h.ready })
	return h
}

func (h *hub) record(f func()) {
	h.mu.Lock()
	f()
	close(h.changed)
	h.changed = make(chan struct{})
	h.mu.Unlock()
}

func (h *hub) onMessage(_ mqtt.Client, m mqtt.Message) {
	topic, p := m.Topic(), m.Payload()
	h.record(func() {
		switch topic {
		case h.topics.Events(gw):
			b, err := uplink.DecodeBatch(p)
			if err != nil {
				h.malformed++
				return
			}
			after := int64(-1)
			if b.After != nil {
				after = int64(*b.After)
			}
			if n := len(b.Entries); n > 0 {
				h.links = append(h.links, [3]int64{after, int64(b.Acked), int64(b.Entries[n-1].Seq)})
				h.outboxes = append(h.outboxes, b.Outbox)
			}
			for _, e := range b.Entries {
				h.received++
				h.maxSeq = max(h.maxSeq, e.Seq)
				k := fmt.Sprintf("%s/%d", e.Event.MissionID, e.Event.Seq)
				if !h.seen[k] {
					h.seen[k] = true
					h.entries = append(h.entries, e)
				}
			}
		case h.topics.Status(gw):
			if s, err := uplink.DecodeStatus(p); err == nil {
				h.statuses = append(h.statuses, s)
			} else if len(p) > 0 {
				h.malformed++
			}
		case h.topics.Heartbeat(gw):
			if b, err := uplink.DecodeHeartbeat(p); err == nil {
				h.beats = append(h.beats, b)
			}
		case h.topics.Traces(gw):
			if b, err := uplink.DecodeTraceBatch(p); err == nil {
				h.traces = append(h.traces, b.Traces...)
				h.traceQoS = append(h.traceQoS, m.Qos())
			} else {
				h.malformed++
			}
		case h.topics.ControlResult(gw):
			if r, err := uplink.DecodeControlResult(p); err == nil {
				h.results = append(h.results, r)
			} else {
				h.malformed++
			}
		}
	})
}

// waitFor waits until cond, read under the hub's lock, holds.
func (h *hub) waitFor(what string, cond func() bool) {
	h.tb.Helper()
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		h.mu.Lock()
		ok, ch := cond(), h.changed
		h.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			h.mu.Lock()
			h.tb.Logf("statuses %+v", h.statuses)
			h.mu.Unlock()
			h.tb.Fatalf("timed out waiting for %s", what)
		}
	}
}

func (h *hub) publish(topic string, v any) {
	h.tb.Helper()
	b, ok := v.([]byte)
	if !ok {
		var err error
		if b, err = json.Marshal(v); err != nil {
			h.tb.Fatal(err)
		}
	}
	tok := h.client.Publish(topic, 1, false, b)
	if !tok.WaitTimeout(wait) || tok.Error() != nil {
		h.tb.Fatalf("hub publish %s: %v", topic, tok.Error())
	}
}

func (h *hub) ack(upto uint64) { h.publish(h.topics.Ack(gw), uplink.Ack{Upto: upto}) }

// got lists the first copies as "mission/seq", in arrival order.
func (h *hub) got() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]string, len(h.entries))
	for i, e := range h.entries {
		out[i] = fmt.Sprintf("%s/%d", e.Event.MissionID, e.Event.Seq)
	}
	return out
}

func (h *hub) has(n int) func() bool { return func() bool { return len(h.entries) >= n } }

// checkDelivered asserts the hub holds exactly what was written, each
// mission's events in order, with no compaction marks.
func (h *hub) checkDelivered(w *world) {
	h.tb.Helper()
	got := h.got()
	if !sameSet(got, w.written) {
		h.tb.Errorf("hub holds %v\nwritten    %v", got, w.written)
	}
	last := map[string]uint64{}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, e := range h.entries {
		if e.Event.Seq != last[e.Event.MissionID]+1 {
			h.tb.Errorf("%s: event %d arrived after %d", e.Event.MissionID, e.Event.Seq, last[e.Event.MissionID])
		}
		last[e.Event.MissionID] = e.Event.Seq
		if e.Compacted {
			h.tb.Errorf("entry %d marked compacted", e.Seq)
		}
	}
	if h.malformed > 0 {
		h.tb.Errorf("%d malformed messages", h.malformed)
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// testOptions are fast options for an uplink on url over w's store.
func testOptions(url string, w *world) Options {
	return Options{
		Broker: url, Gateway: gw, Source: w.db, Logger: discard, Version: "1.2.3",
		HeartbeatInterval: time.Hour, Timeout: 2 * time.Second, MaxReconnectInterval: 500 * time.Millisecond,
		ResendTimeout: time.Hour,
	}
}

// start runs an uplink until the returned stop is called (or the test
// ends) and checks that Run returned nil.
func start(tb testing.TB, opts Options) (*Uplink, func()) {
	tb.Helper()
	u, err := New(opts)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return u, testkit.Go(tb, u.Run)
}

// waitStats waits until cond holds for u's stats.
func waitStats(tb testing.TB, u *Uplink, what string, cond func(Stats) bool) Stats {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	s, err := u.waitStats(ctx, cond)
	if err != nil {
		tb.Fatalf("timed out waiting for %s; stats %+v", what, s)
	}
	return s
}
