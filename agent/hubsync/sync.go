package hubsync

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/sortie-edge/sortie/store"
	"github.com/sortie-edge/sortie/uplink"
)

// sender is Run's loop: it owns the connection's subscriptions, presence,
// heartbeats and the store-and-forward window. Only it touches these
// fields; the connection's handlers reach it through the Uplink's
// channels.
type sender struct {
	u *Uplink

	gen     uint64 // connection generation served; 0 before the first
	up      bool   // connected, subscribed and announced
	acked   uint64 // entries up to here are acknowledged and deleted
	sent    uint64 // entries up to here are published on this pass
	window  []flight
	stalled bool // a read or publish failed: wait for the retry, resend or reconnect

	resend *time.Timer
	retry  *time.Timer
	retryN int

	tr       traceSender
	trResend *time.Timer // the trace batch in flight is overdue
}

// flight is a published batch waiting for the hub's ack.
type flight struct {
	last  uint64    // seq of its last entry
	first time.Time // event time of its first entry, for lag
	at    time.Time // when it was published
}

func (s *sender) run(ctx context.Context) {
	u := s.u
	hb := time.NewTicker(u.opts.HeartbeatInterval)
	defer hb.Stop()
	s.resend = stoppedTimer()
	s.retry = stoppedTimer()
	s.trResend = stoppedTimer()
	defer s.trResend.Stop()
	defer s.resend.Stop()
	defer s.retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-u.connEv:
			s.connection(ctx)
		case <-u.ackEv:
			s.ack(ctx)
		case <-u.wake:
		case <-hb.C:
			s.heartbeat(ctx)
		case <-s.resend.C:
			s.resendWindow()
		case <-s.trResend.C: // fillTraces below sends it again
		case <-s.retry.C:
			s.stalled = false
			if !s.up {
				s.connection(ctx)
			}
			s.ack(ctx)
		}
		s.fill(ctx)
		s.ackTraces(ctx)
		s.fillTraces(ctx)
	}
}

func stoppedTimer() *time.Timer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}

// connection reacts to the connection going up or down. A new connection
// (subscribed by the client before it says so) is announced, and
// everything unacknowledged is sent again on it: batches in flight on
// the old one may be lost.
func (s *sender) connection(ctx context.Context) {
	u := s.u
	gen := u.connGen.Load()
	if c := u.conn.Load(); c == nil || !c.Connected() {
		if s.up {
			s.up = false
			u.update(func(st *Stats) { st.Connected, st.Broker = false, "" })
		}
		return
	}
	if s.up && gen == s.gen {
		return
	}
	s.up = false
	s.gen = gen
	// Whether the hub takes trigger records is learnt again on each
	// connection (the hub behind it may have changed), from any ack that
	// comes after this: forgotten before the status goes out, since the
	// hub may answer it before its PUBACK arrives.
	u.tracesOK.Store(false)
	gw := u.opts.Gateway
	broker := u.broker()
	st := uplink.Status{Gateway: gw, State: uplink.StateOnline, Protocol: uplink.Protocol, Version: u.opts.Version, Started: u.started, Time: u.opts.Now(), Broker: broker}
	if err := u.publish(ctx, u.topics.Status(gw), !u.opts.NoRetain, st); err != nil {
		u.log.Warn("hub connection setup failed; retrying", "err", err)
		s.backoff()
		return
	}
	s.up, s.retryN = true, 0
	u.log.Info("connected to hub", "broker", broker, "backlog", u.opts.Source.OutboxLen())
	u.update(func(st *Stats) { st.Connected, st.Broker = true, broker; st.Connects++ })
	s.restart()
	s.heartbeat(ctx)
	if u.opts.OnConnect != nil {
		u.opts.OnConnect()
	}
}

// restart forgets the window so that fill sends from the oldest
// unacknowledged entry again.
func (s *sender) restart() {
	s.sent, s.window, s.stalled = s.acked, nil, false
	s.tr.sent = s.tr.acked
	s.resend.Stop()
}

func (s *sender) resendWindow() {
	if len(s.window) == 0 || s.u.opts.Now().Sub(s.window[0].at) < s.u.opts.ResendTimeout {
		s.armResend()
		return
	}
	s.u.log.Info("no ack from hub; resending", "from", s.acked+1, "batches", len(s.window))
	s.u.update(func(st *Stats) { st.Resends++ })
	s.restart()
}

func (s *sender) armResend() {
	s.resend.Stop()
	if len(s.window) > 0 {
		s.resend.Reset(max(s.window[0].at.Add(s.u.opts.ResendTimeout).Sub(s.u.opts.Now()), 0))
	}
}

// backoff schedules a retry after a failure, doubling up to 30s.
func (s *sender) backoff() {
	s.stalled = true
	d := min(time.Second<<min(s.retryN, 5), 30*time.Second)
	s.retryN++
	s.retry.Stop()
	s.retry.Reset(d)
}

// ack deletes what the hub acknowledged (onAck has capped it).
func (s *sender) ack(ctx context.Context) {
	u := s.u
	upto := u.ackUpto.Load()
	if upto <= s.acked {
		return
	}
	n, err := u.opts.Source.AckOutbox(ctx, upto)
	if err != nil {
		u.log.Warn("delete acknowledged entries", "upto", upto, "err", err)
		s.backoff()
		return
	}
	s.acked = upto
	s.sent = max(s.sent, upto)
	i := 0
	for i < len(s.window) && s.window[i].last <= upto {
		i++
	}
	s.window = s.window[i:]
	s.armResend()
	now := u.opts.Now()
	u.mu.Lock()
	u.oldest = time.Time{}
	if len(s.window) > 0 {
		u.oldest = s.window[0].first
	}
	u.mu.Unlock()
	u.update(func(st *Stats) { st.Acked += uint64(n); st.LastAck = now })
}

// fill publishes batches until the window is full or the outbox has no
// more to send.
func (s *sender) fill(ctx context.Context) {
	u := s.u
	for s.up && !s.stalled && len(s.window) < u.opts.Window && ctx.Err() == nil {
		es, err := u.opts.Source.Outbox(ctx, s.sent, u.opts.BatchSize)
		if err != nil {
			u.log.Warn("read outbox", "err", err)
			s.backoff()
			return
		}
		if len(es) == 0 {
			return
		}
		payload, n, err := u.encodeBatch(es, s.sent, s.acked)
		if err != nil {
			// Nothing but a pathological mission makes an entry this big;
			// stop here rather than skip it, and say so.
			u.log.Error("outbox entry cannot be sent", "err", err)
			s.backoff()
			return
		}
		// Raised before publishing: the hub's ack may beat our PUBACK.
		if last := es[n-1].Seq; last > u.maxSent.Load() {
			u.maxSent.Store(last)
		}
		if err := u.publishRaw(ctx, u.topics.Events(u.opts.Gateway), false, 1, payload); err != nil {
			u.log.Warn("publish batch", "err", err)
			// The connection is probably going; a reconnect resends, and
			// a retry covers the case where it is not.
			s.backoff()
			return
		}
		now := u.opts.Now()
		s.sent = es[n-1].Seq
		s.window = append(s.window, flight{last: s.sent, first: es[0].Event.Time, at: now})
		if len(s.window) == 1 {
			s.armResend()
			u.mu.Lock()
			u.oldest = es[0].Event.Time
			u.mu.Unlock()
		}
		u.update(func(st *Stats) { st.Batches++; st.Sent += uint64(n) })
	}
}

// encodeBatch encodes as many of es as fit in MaxMessage (at least one)
// and says how many that is. es are the entries after seq after; acked
// is what the hub has acknowledged so far.
func (u *Uplink) encodeBatch(es []store.OutboxEntry, after, acked uint64) ([]byte, int, error) {
	for n := len(es); ; n /= 2 {
		b := uplink.Batch{Gateway: u.opts.Gateway, Entries: make([]uplink.Entry, n), After: &after, Acked: acked, Outbox: u.outbox}
		for i, e := range es[:n] {
			b.Entries[i] = uplink.Entry(e)
		}
		p, err := json.Marshal(b)
		if err != nil {
			return nil, 0, fmt.Errorf("encode batch: %w", err)
		}
		if len(p) <= uplink.MaxMessage {
			return p, n, nil
		}
		if n == 1 {
			// The step table is a convenience the hub can do without.
			sum := &b.Entries[0].Mission
			sum.StepIDs, sum.StepNames, sum.StepTargets, sum.StepStatus = nil, nil, nil, nil
			p, err := json.Marshal(b)
			if err != nil || len(p) > uplink.MaxMessage {
				return nil, 0, fmt.Errorf("encode batch: entry %d is %d bytes, over %d", es[0].Seq, len(p), uplink.MaxMessage)
			}
			return p, 1, nil
		}
	}
}

// heartbeat publishes the gateway's health.
func (s *sender) heartbeat(ctx context.Context) {
	u := s.u
	if !s.up {
		return
	}
	var h uplink.Heartbeat
	if u.opts.Heartbeat != nil {
		h = u.opts.Heartbeat.Heartbeat(ctx)
	}
	now := u.opts.Now()
	h.Gateway = u.opts.Gateway
	if h.Version == "" {
		h.Version = u.opts.Version
	}
	h.Uptime = now.Sub(u.started).Seconds()
	h.Backlog = u.opts.Source.OutboxLen()
	h.Time, h.Broker = now, u.broker()
	if h.Devices == nil {
		h.Devices = []uplink.DeviceState{}
	}
	if err := u.publish(ctx, u.topics.Heartbeat(u.opts.Gateway), false, h); err != nil {
		u.log.Warn("publish heartbeat", "err", err)
	}
}
