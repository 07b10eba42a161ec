package hubsync

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/store"
	"github.com/sortie-edge/sortie/uplink"
)

// TestTraceRecordsGoOnlyToAHubThatTakesThem: an ack without a trace
// cursor (a hub from before trigger records, whose broker would refuse
// the topic) brings no records; one with it brings them all, and its
// trace ack deletes them from the gateway's log.
func TestTraceRecordsGoOnlyToAHubThatTakesThem(t *testing.T) {
	b := brokertest.Start(t)
	h := newHub(t, b.URL())
	w := newWorld(t)
	ctx := context.Background()
	var evs []store.Evaluation
	for _, id := range []string{"r-1", "r-2", "r-3"} {
		evs = append(evs, store.Evaluation{RequestID: id, At: t0, Via: "mqtt", Scene: "go_home", Outcome: "rejected", Reason: "unknown_scene"})
	}
	if err := w.db.AddTraces(ctx, evs, nil); err != nil {
		t.Fatal(err)
	}
	w.steps(1, 1)
	opts := testOptions(b.URL(), w)
	opts.Traces = w.db
	u, _ := start(t, opts)

	h.waitFor("the event", h.has(1))
	h.ack(1) // an old hub's ack
	waitStats(t, u, "1 acked", func(s Stats) bool { return s.Acked == 1 })
	// A round trip through the uplink's loop after the ack: a new event
	// sent and seen means the loop has passed the point where records
	// would have gone.
	w.steps(1, 1)
	u.Notify()
	h.waitFor("the second event", h.has(2))
	h.mu.Lock()
	if len(h.traces) != 0 {
		t.Errorf("%d trace records sent to a hub whose acks carry no trace cursor", len(h.traces))
	}
	h.mu.Unlock()

	zero := uint64(0)
	h.publish(h.topics.Ack(gw), uplink.Ack{Upto: 2, Traces: &zero})
	h.waitFor("3 records", func() bool { return len(h.traces) == 3 })
	h.mu.Lock()
	if r := h.traces[0]; r.Seq != 1 || r.RequestID != "r-1" || r.Outcome != "rejected" || r.Reason != "unknown_scene" || !r.At.Equal(t0) {
		t.Errorf("first record = %+v", r)
	}
	h.mu.Unlock()
	three := uint64(3)
	h.publish(h.topics.Ack(gw), uplink.Ack{Upto: 2, Traces: &three})
	waitStats(t, u, "3 records acked", func(s Stats) bool { return s.TraceAcked == 3 })
	if left, err := w.db.TraceLog(ctx, 0, 10); err != nil || len(left) != 0 {
		t.Fatalf("after the hub's trace ack the log holds %+v (%v)", left, err)
	}
	if rec, err := w.db.Trace(ctx, "r-2"); err != nil || rec.Evaluations[0].Reason != "unknown_scene" {
		t.Errorf("the gateway's own record after the ack: %+v, %v", rec, err)
	}
}

// TestATraceBatchFitsInAMessage: records whose text JSON escapes (each
// '<' is six bytes) are sent in batches under MaxMessage, which the hub
// decodes.
func TestATraceBatchFitsInAMessage(t *testing.T) {
	b := brokertest.Start(t)
	h := newHub(t, b.URL())
	w := newWorld(t)
	ctx := context.Background()
	var evs []store.Evaluation
	for i := range 256 {
		evs = append(evs, store.Evaluation{RequestID: fmt.Sprintf("r-%03d<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<", i),
			At: t0, Via: "mqtt", Scene: strings.Repeat("<", 128), Source: strings.Repeat("&", 128), Outcome: "rejected",
			Reason: strings.Repeat(">", 128), Message: strings.Repeat("<", 512), MissionID: strings.Repeat(">", 128)})
	}
	if err := w.db.AddTraces(ctx, evs, nil); err != nil {
		t.Fatal(err)
	}
	w.steps(1, 1)
	opts := testOptions(b.URL(), w)
	opts.Traces = w.db
	start(t, opts)
	h.waitFor("the event", h.has(1))
	zero := uint64(0)
	h.publish(h.topics.Ack(gw), uplink.Ack{Upto: 1, Traces: &zero})
	h.waitFor("a batch of records", func() bool { return len(h.traces) > 0 })
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.malformed != 0 {
		t.Errorf("%d malformed messages: a batch over MaxMessage", h.malformed)
	}
}
