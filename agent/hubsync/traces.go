package hubsync

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/sortie-edge/sortie/store"
	"github.com/sortie-edge/sortie/uplink"
)

// TraceSource is the log of trigger records the uplink forwards and
// trims. *store.DB implements it (with store.Options.Outbox set).
type TraceSource interface {
	// TraceLog returns up to limit records with seq greater than after,
	// in seq order.
	TraceLog(ctx context.Context, after uint64, limit int) ([]store.TraceLogEntry, error)
	// AckTraceLog deletes the records up to and including upto.
	AckTraceLog(ctx context.Context, upto uint64) (int, error)
}

// traceSender is the sender's state for trigger records: one batch in
// flight at a time, sent again after ResendTimeout or a reconnect. It is
// simpler than the events' window because records are few and a delay
// costs nothing but a late answer at the hub.
type traceSender struct {
	acked, sent uint64
	at          time.Time // when the batch in flight was published
	// probe: the batch in flight went at QoS 0, before an ack said the
	// hub takes records.
	probe bool
}

// encodeTraces encodes as many of rs as fit in MaxMessage (at least
// one: records are bounded far below it) and says how many that is.
func (u *Uplink) encodeTraces(rs []store.TraceLogEntry) ([]byte, int, error) {
	for n := len(rs); ; n /= 2 {
		b := uplink.TraceBatch{Gateway: u.opts.Gateway, Traces: make([]uplink.TraceRecord, n), Outbox: u.outbox}
		for i, r := range rs[:n] {
			b.Traces[i] = uplink.TraceRecord{
				Seq: r.Seq, RequestID: r.RequestID, At: r.At, Via: r.Via, Scene: r.Scene, Source: r.Source,
				Outcome: r.Outcome, Reason: r.Reason, Message: r.Message, MissionID: r.MissionID,
			}
		}
		p, err := json.Marshal(b)
		if err != nil {
			return nil, 0, fmt.Errorf("encode trigger records: %w", err)
		}
		if len(p) <= uplink.MaxMessage || n == 1 {
			return p, n, nil
		}
	}
}

// onTraceAck records the hub's trace ack (capped by what was sent, as
// for events).
func (u *Uplink) onTraceAck(upto uint64) {
	upto = min(upto, u.maxTraceSent.Load())
	for {
		cur := u.traceAckUpto.Load()
		if upto <= cur || u.traceAckUpto.CompareAndSwap(cur, upto) {
			return
		}
	}
}

// ackTraces deletes the records the hub acknowledged.
func (s *sender) ackTraces(ctx context.Context) {
	u := s.u
	upto := u.traceAckUpto.Load()
	if u.opts.Traces == nil || upto <= s.tr.acked {
		return
	}
	n, err := u.opts.Traces.AckTraceLog(ctx, upto)
	if err != nil {
		u.log.Warn("delete acknowledged trigger records", "upto", upto, "err", err)
		return
	}
	s.tr.acked = upto
	u.update(func(st *Stats) { st.TraceAcked += uint64(n) })
	s.tr.sent = max(s.tr.sent, upto)
}

// fillTraces publishes the next batch of records when none is in flight
// (or the one in flight is overdue). Until an ack of this connection
// says the hub takes records, the batch goes at QoS 0, once per
// ResendTimeout: it asks the hub, which stores it and answers with an
// ack that says so, and a broker that refuses the topic (an older hub's)
// drops it, where a refused QoS 1 publish would cost the connection.
// Learning it sends the batch again at once, at QoS 1: a lost answer, a
// lost probe or an ack that came before the gateway listened (all QoS 0)
// cost at most one ResendTimeout, on every connection.
func (s *sender) fillTraces(ctx context.Context) {
	u := s.u
	if u.opts.Traces == nil || !s.up || s.stalled || ctx.Err() != nil {
		return
	}
	now := u.opts.Now()
	ok := u.tracesOK.Load()
	if s.tr.sent > s.tr.acked && now.Sub(s.tr.at) < u.opts.ResendTimeout && (!s.tr.probe || !ok) {
		return
	}
	rs, err := u.opts.Traces.TraceLog(ctx, s.tr.acked, u.opts.BatchSize)
	if err != nil || len(rs) == 0 {
		if err != nil {
			u.log.Warn("read trigger records", "err", err)
		}
		return
	}
	payload, n, err := u.encodeTraces(rs)
	if err != nil {
		u.log.Error("encode trigger records", "err", err)
		return
	}
	rs = rs[:n]
	last := rs[len(rs)-1].Seq
	if last > u.maxTraceSent.Load() {
		u.maxTraceSent.Store(last)
	}
	qos := byte(1)
	if !ok {
		qos = 0
	}
	if err := u.publishRaw(ctx, u.topics.Traces(u.opts.Gateway), false, qos, payload); err != nil {
		u.log.Warn("publish trigger records", "err", err)
		s.backoff()
		return
	}
	s.tr.sent, s.tr.at, s.tr.probe = last, now, !ok
	s.trResend.Stop()
	s.trResend.Reset(u.opts.ResendTimeout)
	u.update(func(st *Stats) { st.TraceRecords += uint64(len(rs)) })
}
