package hub

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/uplink"
)

// bucketTraces keeps each gateway's trigger records: gateway + 0x00 +
// request ID -> TraceRecords (JSON).
var bucketTraces = []byte("traces")

// maxTraceRecords is what the hub keeps per request ID: the first
// evaluation and the latest, as the gateway does.
const maxTraceRecords = 8

// Trace is what the hub knows of one trigger of one gateway: its
// evaluations, oldest first (the first and the latest seven).
type Trace struct {
	Gateway   string               `json:"gateway"`
	RequestID string               `json:"request_id"`
	Records   []uplink.TraceRecord `json:"records"`
	// Updated is the hub's clock when a record last arrived.
	Updated time.Time `json:"updated"`
}

func traceKey(gw, requestID string) []byte {
	k := make([]byte, 0, len(gw)+1+len(requestID))
	k = append(k, gw...)
	k = append(k, 0)
	return append(k, requestID...)
}

// traces stores a batch of trigger records, idempotent by seq, and
// acknowledges up to its highest seq.
func (a *applier) traces(m *Inbound) error {
	g, err := a.gateway(m.Gateway, m.Received)
	if err != nil {
		return err
	}
	g.LastSeen = m.Received
	var upto uint64
	for _, r := range m.Traces.Traces {
		if r.Seq == 0 || driver.ValidateID("request id", r.RequestID) != nil {
			a.reject(m, "trace record without a seq or a valid request id")
			return nil
		}
	}
	for _, r := range m.Traces.Traces {
		upto = max(upto, r.Seq)
		k := string(traceKey(m.Gateway, r.RequestID))
		t := a.changedTraces[k]
		if t == nil {
			if t, err = a.r.trace(m.Gateway, r.RequestID); err != nil {
				return fmt.Errorf("trace %q of %s: %w", r.RequestID, m.Gateway, err)
			}
			if t == nil {
				t = &Trace{}
			}
		}
		if hasSeq(t.Records, r.Seq) {
			continue // sent again
		}
		t.Gateway, t.RequestID, t.Updated = m.Gateway, r.RequestID, m.Received
		t.Records = append(t.Records, r)
		sort.Slice(t.Records, func(i, j int) bool { return t.Records[i].Seq < t.Records[j].Seq })
		if n := len(t.Records); n > maxTraceRecords {
			t.Records = append(t.Records[:1], t.Records[n-maxTraceRecords+1:]...)
		}
		a.changedTraces[k] = t
		a.res.TraceRecords++
	}
	// Records the decoder dropped are acked too: they would never be
	// taken, and must not hold up the ones after them.
	upto = max(upto, m.Traces.Upto)
	g.TraceSeq = max(g.TraceSeq, upto)
	if upto > 0 {
		prev := a.res.TraceAcks[m.Gateway]
		if prev.Outbox != m.Traces.Outbox {
			prev.Upto = 0 // another store's seqs
		}
		a.res.TraceAcks[m.Gateway] = OutboxAck{Outbox: m.Traces.Outbox, Upto: max(prev.Upto, upto)}
	}
	return nil
}

func hasSeq(rs []uplink.TraceRecord, seq uint64) bool {
	for _, r := range rs {
		if r.Seq == seq {
			return true
		}
	}
	return false
}

// Trace returns the trigger records of one request ID of gateway gw, or
// ErrNotFound.
func (s *Store) Trace(ctx context.Context, gw, requestID string) (Trace, error) {
	var t Trace
	err := s.view(ctx, func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketTraces).Get(traceKey(gw, requestID))
		if v == nil {
			return ErrNotFound
		}
		return json.Unmarshal(v, &t)
	})
	return t, err
}

// pruneTraces deletes the records not updated since before cutoff.
func pruneTraces(tx *bolt.Tx, cutoff time.Time) (int, error) {
	b := tx.Bucket(bucketTraces)
	var old [][]byte
	err := b.ForEach(func(k, v []byte) error {
		var t struct {
			Updated time.Time `json:"updated"`
		}
		if json.Unmarshal(v, &t) != nil || t.Updated.Before(cutoff) {
			old = append(old, append([]byte(nil), k...))
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	for _, k := range old {
		if err := b.Delete(k); err != nil {
			return 0, err
		}
	}
	return len(old), nil
}
