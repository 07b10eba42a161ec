package hub

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/uplink"
)

func TestTraceRecordsAreKeptOncePerSeqAndAcked(t *testing.T) {
	st := testStore(t)
	now := time.Date(2026, 12, 2, 7, 0, 0, 0, time.UTC)
	rec := func(seq uint64, id, outcome string) uplink.TraceRecord {
		return uplink.TraceRecord{Seq: seq, RequestID: id, At: now, Via: "mqtt", Scene: "go_home", Outcome: outcome}
	}
	batch := &uplink.TraceBatch{Gateway: "gw1", Traces: []uplink.TraceRecord{rec(1, "r-1", "rejected"), rec(2, "r-2", "accepted"), rec(3, "r-1", "accepted")}}
	for range 2 { // sent again: stored once
		res, err := st.Apply(t.Context(), []Inbound{{Gateway: "gw1", Traces: batch, Received: now}})
		if err != nil {
			t.Fatal(err)
		}
		if res.TraceAcks["gw1"].Upto != 3 || len(res.Rejected) != 0 {
			t.Fatalf("result = %+v", res)
		}
	}
	tr, err := st.Trace(t.Context(), "gw1", "r-1")
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Records) != 2 || tr.Records[0].Outcome != "rejected" || tr.Records[1].Outcome != "accepted" {
		t.Fatalf("r-1 = %+v", tr)
	}
	if _, err := st.Trace(t.Context(), "gw2", "r-1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("another gateway's request: %v, want ErrNotFound", err)
	}
	// Many evaluations of one request ID: the first and the latest.
	var many []uplink.TraceRecord
	for i := range 20 {
		many = append(many, rec(uint64(10+i), "r-9", "duplicate"))
	}
	if _, err := st.Apply(t.Context(), []Inbound{{Gateway: "gw1", Traces: &uplink.TraceBatch{Gateway: "gw1", Traces: many}, Received: now}}); err != nil {
		t.Fatal(err)
	}
	tr, _ = st.Trace(t.Context(), "gw1", "r-9")
	if len(tr.Records) != maxTraceRecords || tr.Records[0].Seq != 10 || tr.Records[maxTraceRecords-1].Seq != 29 {
		t.Errorf("r-9 keeps %d records, %d..%d", len(tr.Records), tr.Records[0].Seq, tr.Records[len(tr.Records)-1].Seq)
	}
	// Coming online is answered with an ack that says the hub takes
	// records, without a cursor: one from before would delete records of
	// a gateway whose seqs began again.
	res, err := st.Apply(t.Context(), []Inbound{{Gateway: "gw1", Status: &uplink.Status{Gateway: "gw1", State: uplink.StateOnline}, Received: now}})
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := res.TraceAcks["gw1"]; !ok || got.Upto != 0 {
		t.Errorf("online: trace ack %+v (%v), want 0: that the hub takes records, and no cursor", got, ok)
	}
	// A record naming another gateway's batch is refused.
	res, _ = st.Apply(t.Context(), []Inbound{{Gateway: "gw1", Traces: &uplink.TraceBatch{Gateway: "gw2", Traces: many}, Received: now}})
	if len(res.Rejected) != 1 {
		t.Errorf("a batch naming another gateway: %v", res.Rejected)
	}
	// Pruned by age with the missions.
	if _, err := st.Prune(t.Context(), now.Add(31*24*time.Hour), Retention{}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Trace(t.Context(), "gw1", "r-1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("after 31 days: %v, want pruned", fmt.Sprint(err))
	}
}
