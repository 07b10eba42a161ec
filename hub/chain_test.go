package hub

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/uplink"
)

// chained is a protocol-2 batch of entries seq from+1..to (one mission
// per entry, so each is stored once by its own key), continuing from
// after, sent while the gateway held acked acknowledged.
func chained(gw string, after, to, acked uint64) uplink.Batch {
	b := uplink.Batch{Gateway: gw, After: &after, Acked: acked}
	for seq := after + 1; seq <= to; seq++ {
		b.Entries = append(b.Entries, entry(seq, fmt.Sprintf("m%d", seq), 1, driver.StateRunning))
	}
	return b
}

// TestChainAcksOnlyWhatIsStored pins the protocol-2 ack: the hub acks the
// end of the chain of batches it stored, never a batch it did not
// receive, and joins batches that arrived early once the missing one
// comes.
func TestChainAcksOnlyWhatIsStored(t *testing.T) {
	cases := []struct {
		name    string
		batches []uplink.Batch
		acks    []uint64
	}{
		{"in order", []uplink.Batch{chained("gw", 0, 3, 0), chained("gw", 3, 5, 0)}, []uint64{3, 5}},
		{"a batch lost in between", []uplink.Batch{chained("gw", 0, 3, 0), chained("gw", 5, 8, 0)}, []uint64{3, 3}},
		{"the lost batch resent joins the early one", []uplink.Batch{chained("gw", 0, 3, 0), chained("gw", 5, 8, 0), chained("gw", 3, 5, 0)}, []uint64{3, 3, 8}},
		{"out of order", []uplink.Batch{chained("gw", 2, 4, 0), chained("gw", 4, 6, 0), chained("gw", 0, 2, 0)}, []uint64{0, 0, 6}},
		{"a resend overlapping the cursor", []uplink.Batch{chained("gw", 0, 4, 0), chained("gw", 2, 6, 0)}, []uint64{4, 6}},
		{"a gateway acked beyond the hub's cursor starts there", []uplink.Batch{chained("gw", 100, 103, 100)}, []uint64{103}},
		{"a stale batch changes nothing", []uplink.Batch{chained("gw", 0, 6, 0), chained("gw", 2, 3, 0)}, []uint64{6, 6}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := testStore(t)
			for i, b := range tc.batches {
				res, err := ingest(st, t0, "gw", b)
				if err != nil {
					t.Fatal(err)
				}
				if got := res.Acks["gw"].Upto; got != tc.acks[i] {
					t.Errorf("batch %d (after %d): ack %d, want %d", i, *b.After, got, tc.acks[i])
				}
			}
		})
	}
}

// named is b sent from the outbox called outbox.
func named(b uplink.Batch, outbox string) uplink.Batch {
	b.Outbox = outbox
	return b
}

// TestChainStartsAgainForAnotherOutbox pins the cursor per outbox: a
// gateway whose store was replaced sends seqs from 1 again, and the ack
// must count them, not the old store's, even when a late batch of the
// old store comes in between, and also when the old store named no
// outbox (an agent before names) or the new one names none.
func TestChainStartsAgainForAnotherOutbox(t *testing.T) {
	steps := []struct {
		b    uplink.Batch
		want OutboxAck
	}{
		{named(chained("gw", 0, 100, 0), "old"), OutboxAck{"old", 100}},
		{named(chained("gw", 0, 3, 0), "new"), OutboxAck{"new", 3}},
		{named(chained("gw", 5, 8, 3), "new"), OutboxAck{"new", 3}}, // 4..5 lost: not acked
		{named(chained("gw", 100, 103, 100), "old"), OutboxAck{"old", 103}},
		{named(chained("gw", 3, 5, 3), "new"), OutboxAck{"new", 5}},
		{named(chained("gw", 5, 8, 5), "new"), OutboxAck{"new", 8}},
	}
	st := testStore(t)
	for i, s := range steps {
		res, err := ingest(st, t0, "gw", s.b)
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Acks["gw"]; got != s.want {
			t.Errorf("step %d (%s after %d): ack %+v, want %+v", i, s.b.Outbox, *s.b.After, got, s.want)
		}
	}

	st = testStore(t)
	for i, s := range []struct {
		b    uplink.Batch
		want OutboxAck
	}{
		{chained("gw", 0, 100, 0), OutboxAck{"", 100}},
		{named(chained("gw", 3, 6, 0), "new"), OutboxAck{"new", 0}}, // its first batch lost
		{named(chained("gw", 0, 3, 0), "new"), OutboxAck{"new", 6}},
		{chained("gw", 100, 103, 100), OutboxAck{"", 103}}, // late, from the unnamed one
		{named(chained("gw", 6, 8, 6), "new"), OutboxAck{"new", 8}},
	} {
		res, err := ingest(st, t0, "gw", s.b)
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Acks["gw"]; got != s.want {
			t.Errorf("unnamed step %d: ack %+v, want %+v", i, got, s.want)
		}
	}
}

// TestChainNeverAcksBeyondStoredUnderLossAndReorder sends a gateway's
// batches through a channel that loses, repeats and reorders them, with
// the gateway resending from its acknowledged point as it does, and
// checks after every delivery that every entry up to the hub's ack is
// stored; in the end everything is stored and acknowledged.
func TestChainNeverAcksBeyondStoredUnderLossAndReorder(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			st := testStore(t)
			const total = 120
			var acked uint64 // the gateway's
			stored := map[uint64]bool{}
			for round := 0; acked < total; round++ {
				if round > 200 {
					t.Fatalf("not done after %d rounds: acked %d", round, acked)
				}
				// The gateway sends its window from its acknowledged point.
				var flight []uplink.Batch
				for after := acked; after < total && len(flight) < 4; {
					to := min(after+uint64(1+rng.IntN(6)), total)
					flight = append(flight, chained("gw", after, to, acked))
					after = to
				}
				// The channel loses some, repeats some, and shuffles.
				var out []uplink.Batch
				for _, b := range flight {
					if rng.IntN(4) == 0 {
						continue
					}
					out = append(out, b)
					if rng.IntN(5) == 0 {
						out = append(out, b)
					}
				}
				rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
				for _, b := range out {
					res, err := ingest(st, t0, "gw", b)
					if err != nil {
						t.Fatal(err)
					}
					for _, e := range b.Entries {
						stored[e.Seq] = true
					}
					ack := res.Acks["gw"].Upto
					for seq := uint64(1); seq <= ack; seq++ {
						if !stored[seq] {
							t.Fatalf("ack %d covers entry %d, which the hub never received", ack, seq)
						}
					}
					if rng.IntN(3) > 0 { // acks are lost too (QoS 0)
						acked = max(acked, ack)
					}
				}
			}
			g, err := st.Gateway(t.Context(), "gw")
			if err != nil {
				t.Fatal(err)
			}
			if g.Acked != total || len(g.Pending) != 0 {
				t.Fatalf("cursor %d with %d pending, want %d and none", g.Acked, len(g.Pending), total)
			}
		})
	}
}

// TestControlRepeatedUntilAnsweredToProtocol2 pins the hub's side of
// protocol 2: a gateway that takes control requests at QoS 0 gets the
// same request (same ID) again until its result arrives.
func TestControlRepeatedUntilAnsweredToProtocol2(t *testing.T) {
	e := newEnvWith(t, func(o *ServiceOptions) { o.ControlResend = 20 * time.Millisecond }, "home")
	g := newGateway(t, e.broker.URL(), "home")
	g.publish(t, g.topics.Status("home"), true, uplink.Status{Gateway: "home", State: uplink.StateOnline, Protocol: uplink.Protocol})
	e.waitOnline(t, "home")
	type answer struct {
		r   uplink.ControlResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		r, err := e.svc.Control(context.Background(), "home", uplink.Control{Action: uplink.ActionCancel, MissionID: "m1"})
		done <- answer{r, err}
	}()
	first, again := g.waitControl(t), g.waitControl(t)
	if first.ID != again.ID || again.Action != uplink.ActionCancel {
		t.Fatalf("repeat %+v of %+v, want the same request", again, first)
	}
	g.publish(t, g.topics.ControlResult("home"), false, uplink.ControlResult{ID: first.ID, OK: true, MissionID: "m1", State: driver.StateCancelled})
	if a := <-done; a.err != nil || !a.r.OK {
		t.Fatalf("control = %+v, %v; want ok", a.r, a.err)
	}
}

// TestControlSentOnceToOlderGateway: a gateway before protocol 2 would
// carry out a repeat, so it gets the request once however long the hub
// waits.
func TestControlSentOnceToOlderGateway(t *testing.T) {
	e := newEnvWith(t, func(o *ServiceOptions) {
		o.ControlResend, o.ControlTimeout = 10*time.Millisecond, 300*time.Millisecond
	}, "home")
	g := newGateway(t, e.broker.URL(), "home")
	g.online(t) // no protocol: an older gateway
	e.waitOnline(t, "home")
	_, err := e.svc.Control(context.Background(), "home", uplink.Control{Action: uplink.ActionRetry, MissionID: "m1"})
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("control without an answer: %v, want a timeout", err)
	}
	g.waitControl(t)
	if n := testutil.ToFloat64(e.svc.metrics.controlResends); n != 0 {
		t.Fatalf("the hub sent an older gateway the request %v more times", n)
	}
}

// TestBatchFromOlderGatewayAckedCumulatively: a batch without After (a
// gateway before protocol 2) is acked up to its highest seq, as before.
//
// On PostgreSQL (the cluster mode), where replicas share the store and a
// cumulative ack could cover a batch another replica has not stored, it
// is stored and not acked.
func TestBatchFromOlderGatewayAckedCumulatively(t *testing.T) {
	st := testStore(t)
	b := chained("gw", 5, 8, 0)
	b.After = nil
	res, err := ingest(st, t0, "gw", b)
	if err != nil {
		t.Fatal(err)
	}
	_, shared := st.(*PGStore)
	switch got := res.Acks["gw"].Upto; {
	case shared && (got != 0 || res.Unchained != 1 || res.Stored != 3):
		t.Fatalf("cluster store: ack %d, unchained %d, stored %d; want no ack, 1, 3", got, res.Unchained, res.Stored)
	case !shared && got != 8:
		t.Fatalf("ack = %d, want 8", got)
	}
}

// unreadable is a store whose gateway records cannot be read (a
// database restarting) once down is set.
type unreadable struct {
	Backing
	down atomic.Bool
}

func (u *unreadable) Gateway(ctx context.Context, id string) (Gateway, error) {
	if u.down.Load() {
		return Gateway{}, errors.New("connection refused")
	}
	return u.Backing.Gateway(ctx, id)
}

// TestControlWhileTheStoreIsDownRepeatsOnlyToProtocol2: the hub sends a
// control even when it cannot read the gateway's record, and repeats it
// only if the gateway last spoke protocol 2; an older gateway would run
// every copy.
func TestControlWhileTheStoreIsDownRepeatsOnlyToProtocol2(t *testing.T) {
	for _, proto := range []int{0, uplink.Protocol} {
		t.Run(fmt.Sprint("protocol ", proto), func(t *testing.T) {
			var st *unreadable
			wrapStore = func(b Backing) Backing { st = &unreadable{Backing: b}; return st }
			defer func() { wrapStore = nil }()
			// The timeout also bounds the first copy's PUBACK: a short
			// one, on a loaded machine, can end before any repeat.
			e := newEnvWith(t, func(o *ServiceOptions) {
				o.ControlResend, o.ControlTimeout = 10*time.Millisecond, 2*time.Second
			}, "home")
			g := newGateway(t, e.broker.URL(), "home")
			g.publish(t, g.topics.Status("home"), true, uplink.Status{Gateway: "home", State: uplink.StateOnline, Protocol: proto})
			e.waitOnline(t, "home")
			st.down.Store(true)
			_, err := e.svc.Control(context.Background(), "home", uplink.Control{Action: uplink.ActionRetry, MissionID: "m1"})
			if !errors.Is(err, ErrTimeout) {
				t.Fatalf("control without an answer: %v, want a timeout", err)
			}
			g.waitControl(t)
			resent := testutil.ToFloat64(e.svc.metrics.controlResends)
			if proto < 2 && resent != 0 || proto >= 2 && resent == 0 {
				t.Fatalf("protocol %d: %v repeats", proto, resent)
			}
		})
	}
}

// poisoned refuses, as invalid, any group holding a batch of mission
// "poison" (what PostgreSQL does with data it cannot take).
type poisoned struct{ Backing }

func (p poisoned) Apply(ctx context.Context, in []Inbound) (Result, error) {
	for _, m := range in {
		if m.Batch != nil && len(m.Batch.Entries) > 0 && m.Batch.Entries[0].Event.MissionID == "poison" {
			return Result{}, fmt.Errorf("%w: refused", ErrInvalid)
		}
	}
	return p.Backing.Apply(ctx, in)
}

// TestAMessageTheStoreRefusesHoldsUpNoOther: a batch the store refuses
// as invalid is dropped alone and counted; batches around it are stored
// and acked.
func TestAMessageTheStoreRefusesHoldsUpNoOther(t *testing.T) {
	wrapStore = func(b Backing) Backing { return poisoned{b} }
	defer func() { wrapStore = nil }()
	e := newEnv(t, "home")
	g := newGateway(t, e.broker.URL(), "home")
	g.online(t)
	e.waitOnline(t, "home")
	for i := range uint64(20) {
		id := fmt.Sprintf("m%d", i)
		if i == 7 {
			id = "poison"
		}
		g.send(t, entry(i+1, id, 1, driver.StateRunning))
	}
	g.waitAck(t, 20)
	if _, err := e.st.Mission(t.Context(), "home", "poison"); !errors.Is(err, ErrNotFound) {
		t.Errorf("the refused batch: %v, want not stored", err)
	}
	if _, err := e.st.Mission(t.Context(), "home", "m19"); err != nil {
		t.Errorf("a batch after the refused one: %v", err)
	}
	if n := testutil.ToFloat64(e.svc.metrics.rejected); n < 1 {
		t.Errorf("rejected = %v, want the refused batch counted", n)
	}
}
