package hubsync

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/store"
	"github.com/sortie-edge/sortie/uplink"
)

// TestTraceRecordsAskTheHubAtQoS0: until an ack carries a trace cursor,
// records go as one QoS 0 batch per ResendTimeout (a question a hub from
// before trigger records, whose broker refuses the topic, drops without
// closing the connection); the first ack that carries one, whichever
// message it answers, brings them again at once at QoS 1, and its trace
// ack deletes them from the gateway's log.
func TestTraceRecordsAskTheHubAtQoS0(t *testing.T) {
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

	h.waitFor("the event and the question", func() bool { return len(h.entries) >= 1 && len(h.traces) == 3 })
	h.ack(1) // an old hub's ack
	waitStats(t, u, "1 acked", func(s Stats) bool { return s.Acked == 1 })
	// A round trip through the uplink's loop after the ack: a new event
	// sent and seen means the loop has passed the point where records
	// would have gone again.
	w.steps(1, 1)
	u.Notify()
	h.waitFor("the second event", h.has(2))
	h.mu.Lock()
	if len(h.traceQoS) != 1 || h.traceQoS[0] != 0 {
		t.Errorf("trace batches before an ack with a cursor went at QoS %v, want one at QoS 0 (ResendTimeout is an hour)", h.traceQoS)
	}
	h.mu.Unlock()

	zero := uint64(0)
	h.publish(h.topics.Ack(gw), uplink.Ack{Upto: 2, Traces: &zero})
	h.waitFor("the records again", func() bool { return len(h.traces) == 6 })
	h.mu.Lock()
	if r := h.traces[3]; r.Seq != 1 || r.RequestID != "r-1" || r.Outcome != "rejected" || r.Reason != "unknown_scene" || !r.At.Equal(t0) {
		t.Errorf("first record = %+v", r)
	}
	if h.traceQoS[1] != 1 {
		t.Errorf("records after the hub said it takes them went at QoS %d, want 1", h.traceQoS[1])
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

// TestTraceRecordsAskAgainUntilTheHubAnswers: a hub that takes records
// but whose answers are lost (or who never acked the gateway's coming
// online) is asked again every ResendTimeout, and its first answer
// brings the records.
func TestTraceRecordsAskAgainUntilTheHubAnswers(t *testing.T) {
	b := brokertest.Start(t)
	h := newHub(t, b.URL())
	w := newWorld(t)
	ctx := context.Background()
	if err := w.db.AddTraces(ctx, []store.Evaluation{{RequestID: "r-1", At: t0, Via: "mqtt", Scene: "go_home", Outcome: "accepted"}}, nil); err != nil {
		t.Fatal(err)
	}
	opts := testOptions(b.URL(), w)
	opts.Traces = w.db
	opts.ResendTimeout = 200 * time.Millisecond
	u, _ := start(t, opts)
	h.waitFor("the question asked three times", func() bool { return len(h.traceQoS) >= 3 })
	one := uint64(1)
	h.publish(h.topics.Ack(gw), uplink.Ack{Upto: 0, Traces: &one})
	waitStats(t, u, "the record acked", func(s Stats) bool { return s.TraceAcked == 1 })
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, q := range h.traceQoS[:3] {
		if q != 0 {
			t.Errorf("question %d went at QoS %d, want 0", i, q)
		}
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
