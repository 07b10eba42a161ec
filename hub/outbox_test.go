package hub

import (
	"fmt"
	"testing"
	"time"
)

// TestReplacedGatewayStartsANewChain: a gateway whose store is replaced
// under the same ID sends outbox seqs from 1 again. The hub's cursor
// follows the new outbox rather than staying at the old one's end (from
// where its acks would cover the new store's batches it never stored),
// and every event of both stores is kept.
func TestReplacedGatewayStartsANewChain(t *testing.T) {
	e := newEnv(t, "gw")
	old := startSimGateway(t, "gw", e.broker.URL(), "")
	for n := range 40 {
		old.step(t, fmt.Sprintf("old-%d", n/4))
	}
	old.drain(t, time.Now().Add(wait), "(old store)")
	old.stopUplink()
	g, err := e.st.Gateway(t.Context(), "gw")
	if err != nil {
		t.Fatal(err)
	}
	if g.Acked != 40 || g.Outbox != old.db.OutboxID() {
		t.Fatalf("after the old store: cursor %d of outbox %q, want 40 of %q", g.Acked, g.Outbox, old.db.OutboxID())
	}

	fresh := startSimGateway(t, "gw", e.broker.URL(), "")
	for n := range 12 {
		fresh.step(t, fmt.Sprintf("new-%d", n/4))
	}
	fresh.drain(t, time.Now().Add(wait), "(new store)")
	if g, err = e.st.Gateway(t.Context(), "gw"); err != nil {
		t.Fatal(err)
	}
	if g.Acked != 12 || g.Outbox != fresh.db.OutboxID() {
		t.Errorf("after the new store: cursor %d of outbox %q, want 12 of %q", g.Acked, g.Outbox, fresh.db.OutboxID())
	}
	if g.Events != 52 {
		t.Errorf("the hub stored %d events, want 52 (40 of the old store, 12 of the new)", g.Events)
	}
}

// TestPendingAcksCountOneOutbox pins how acks waiting to be published
// merge: an ack about another outbox replaces, never raises, what waits
// (40 of the old store must not become 40 of the new one), and the
// online ack that says the hub takes records changes no count.
func TestPendingAcksCountOneOutbox(t *testing.T) {
	s := NewService(testStore(t), ServiceOptions{Broker: "tcp://127.0.0.1:1"})
	s.report(Result{TraceAcks: map[string]OutboxAck{"gw": {}}}) // online: the hub takes records
	s.report(Result{Acks: map[string]OutboxAck{"gw": {Outbox: "old", Upto: 40}}, TraceAcks: map[string]OutboxAck{"gw": {Outbox: "old", Upto: 7}}})
	s.report(Result{Acks: map[string]OutboxAck{"gw": {Outbox: "new", Upto: 3}}})
	want := pendingAck{outbox: "new", upto: 3}
	for _, step := range []string{"the new store's ack", "an online ack naming the old store"} {
		s.ackMu.Lock()
		got := s.acks["gw"]
		s.ackMu.Unlock()
		if got != want {
			t.Errorf("after %s: pending ack %+v, want %+v", step, got, want)
		}
		s.report(Result{TraceAcks: map[string]OutboxAck{"gw": {Outbox: "old"}}})
	}
}
