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

// Inbound is one decoded message from a gateway. Exactly one of Batch,
// Status, Heartbeat and Traces is set. Gateway is the ID from the topic, which
// the broker's ACL ties to the sender's credentials; a message naming
// another gateway in its body is rejected.
type Inbound struct {
	Gateway   string
	Batch     *uplink.Batch
	Status    *uplink.Status
	Heartbeat *uplink.Heartbeat
	Traces    *uplink.TraceBatch
	// Silent, set by the hub itself (not a message), marks the gateway
	// offline (OfflineSilent) if it is online and nothing has been heard
	// from it since then.
	Silent *time.Time
	// Received is when the hub got the message (hub clock).
	Received time.Time
	// rawEvents, when set by the service's decoder, holds each entry's
	// event as received, so it is stored without encoding it again.
	rawEvents []json.RawMessage
}

// GapReport is a gap found while ingesting.
type GapReport struct {
	Gateway   string `json:"gateway"`
	MissionID string `json:"mission_id"`
	Gap
}

// Result says what Apply changed.
type Result struct {
	// Stored counts new events; Duplicates counts events already stored.
	Stored, Duplicates int
	// Late counts stored events that filled an earlier gap, GapsFilled
	// the gaps they completed.
	Late, GapsFilled int
	// Gaps are the gaps detected by this call.
	Gaps []GapReport
	// Acks maps each gateway that sent batches to what its ack says:
	// everything it sent up to there is now durable.
	Acks map[string]OutboxAck
	// TraceAcks maps each gateway that sent trigger records to the
	// highest trace seq of those records, of the store their batch
	// named, and each gateway that came online to 0 (the ack that only
	// tells it the hub takes records).
	TraceAcks map[string]OutboxAck
	// TraceRecords counts the trigger records stored.
	TraceRecords int
	// Unchained counts batches without After (gateways before protocol
	// 2) stored but not acked, on a store that needs the chain.
	Unchained int
	// NewOutboxes lists gateways whose batches named another outbox than
	// the one their cursor was about (a store replaced or restored, or an
	// agent upgraded), the cursor starting again.
	NewOutboxes []string
	// Gateways and Missions are the records changed, after the change.
	Gateways []Gateway
	Missions []Mission
	// Rejected lists messages refused (with the reason), which change
	// nothing and are not acknowledged.
	Rejected []error
}

// OutboxAck is what an ack tells a gateway of its outbox: entries up to
// Upto of the outbox named Outbox ("" when the gateway names none) are
// stored.
type OutboxAck struct {
	Outbox string
	Upto   uint64
}

// Ingest stores one batch from gateway gw. It is Apply for a single
// message.
func (s *Store) Ingest(ctx context.Context, now time.Time, gw string, b uplink.Batch) (Result, error) {
	return s.Apply(ctx, []Inbound{{Gateway: gw, Batch: &b, Received: now}})
}

// Apply folds messages into the store in one transaction, in order. A
// message that fails validation is skipped and listed in
// Result.Rejected; an error from the store fails the whole call and
// changes nothing, so nothing is acknowledged.
func (s *Store) Apply(ctx context.Context, in []Inbound) (Result, error) {
	var res Result
	err := s.update(ctx, func(tx *bolt.Tx) error {
		a := newApplier(boltReader{tx})
		for i := range in {
			if err := a.apply(&in[i]); err != nil {
				return err
			}
		}
		if err := boltFlush(tx, a); err != nil {
			return err
		}
		res = a.res
		return nil
	})
	if err != nil {
		return Result{}, fmt.Errorf("ingest: %w", err)
	}
	return res, nil
}

// txReader is what an applier reads in its transaction; each store
// reads its own way (bbolt by key, PostgreSQL in bulk up front). A
// record that does not exist is nil, not an error.
type txReader interface {
	gateway(id string) (*Gateway, error)
	mission(gw, id string) (*Mission, error)
	hasEvent(gw, mission string, seq uint64) (bool, error)
	trace(gw, requestID string) (*Trace, error)
}

// applier folds messages into records in memory; the store then writes
// what it changed (Changes) in the same transaction. It holds the
// records touched so that each is read and written once however many
// messages concern it; the rules (duplicates, gaps, the ack chain) are
// the same for every store.
type applier struct {
	r        txReader
	gws      map[string]*Gateway
	missions map[string]*Mission // by missionKey
	// created marks missions first seen in this transaction;
	// finishedOld remembers when each mission had finished (zero: not)
	// when the transaction first read it.
	created     map[string]bool
	finishedOld map[string]time.Time
	// before is each mission's summary when the transaction first read
	// it (none for a mission it created), for the outcome roll-up.
	before map[string]driver.Summary
	// dirty marks missions with a new event; others are not rewritten.
	dirty map[string]bool
	// events are the new events in order; stored marks them by key.
	events []NewEvent
	stored map[string]bool
	// changedTraces are the trigger records changed, by traceKey.
	changedTraces map[string]*Trace
	// chainOnly acks only along the chain (protocol 2): set by a store
	// that several replicas share.
	chainOnly bool
	res       Result
}

// NewEvent is an event to store: raw is its JSON as received, or nil to
// encode Event.
type NewEvent struct {
	Gateway string
	Event   *driver.Event
	raw     json.RawMessage
}

// JSON is the event as stored.
func (e NewEvent) JSON() ([]byte, error) {
	if e.raw != nil {
		return e.raw, nil
	}
	return json.Marshal(e.Event)
}

func newApplier(r txReader) *applier {
	return &applier{
		r: r, gws: map[string]*Gateway{}, missions: map[string]*Mission{}, created: map[string]bool{},
		finishedOld: map[string]time.Time{}, before: map[string]driver.Summary{}, dirty: map[string]bool{}, stored: map[string]bool{},
		changedTraces: map[string]*Trace{},
		res:           Result{Acks: map[string]OutboxAck{}, TraceAcks: map[string]OutboxAck{}},
	}
}

func (a *applier) reject(m *Inbound, format string, args ...any) {
	a.res.Rejected = append(a.res.Rejected, fmt.Errorf("%w: gateway %q: %s", ErrInvalid, m.Gateway, fmt.Sprintf(format, args...)))
}

func (a *applier) apply(m *Inbound) error {
	if err := driver.ValidateID("gateway", m.Gateway); err != nil {
		a.reject(m, "%v", err)
		return nil
	}
	switch {
	case m.Batch != nil:
		if m.Batch.Gateway != m.Gateway {
			a.reject(m, "batch names gateway %q", m.Batch.Gateway)
			return nil
		}
		return a.batch(m)
	case m.Status != nil:
		if m.Status.Gateway != "" && m.Status.Gateway != m.Gateway {
			a.reject(m, "status names gateway %q", m.Status.Gateway)
			return nil
		}
		g, err := a.gateway(m.Gateway, m.Received)
		if err != nil {
			return err
		}
		// What only a status says (the gateway's protocol, start and the
		// address it is on) comes from the newest status, even when a
		// heartbeat sent after it was applied first (replicas apply out
		// of order); its state only when it is the newest presence news.
		if !m.Received.Before(g.StatusAt) {
			g.StatusAt = m.Received
			g.Protocol = m.Status.Protocol
			if !m.Status.Started.IsZero() {
				g.Started = m.Status.Started
			}
			if m.Status.State == StateOnline {
				g.Broker = m.Status.Broker
			}
		}
		if m.Received.Before(g.PresenceAt) {
			return nil // older news than the record's state
		}
		g.PresenceAt = m.Received
		if g.State != m.Status.State {
			g.State, g.Since = m.Status.State, m.Received
		}
		g.Why = ""
		if m.Status.State == StateOffline {
			// The agent's will is encoded before it connects, with no
			// time; its goodbye has one.
			g.Why = OfflineGoodbye
			if m.Status.Time.IsZero() {
				g.Why = OfflineWill
			}
		}
		if m.Status.Version != "" {
			g.Version = m.Status.Version
		}
		// A retained "offline" replayed to a restarted hub says nothing
		// about when the gateway was last heard from.
		if m.Status.State == StateOnline {
			g.LastSeen = m.Received
			// Only that the hub takes records: a cursor from before would
			// delete records of a gateway whose seqs began again (a store
			// restored or replaced), in flight and never stored.
			if _, ok := a.res.TraceAcks[m.Gateway]; !ok {
				a.res.TraceAcks[m.Gateway] = OutboxAck{Outbox: g.Outbox}
			}
		}
	case m.Heartbeat != nil:
		if m.Heartbeat.Gateway != "" && m.Heartbeat.Gateway != m.Gateway {
			a.reject(m, "heartbeat names gateway %q", m.Heartbeat.Gateway)
			return nil
		}
		g, err := a.gateway(m.Gateway, m.Received)
		if err != nil {
			return err
		}
		if m.Received.Before(g.PresenceAt) {
			return nil // sent before the last status stored (its will, say)
		}
		g.PresenceAt = m.Received
		hb := *m.Heartbeat
		g.Heartbeat = &hb
		g.LastHeartbeat, g.LastSeen = m.Received, m.Received
		if hb.Version != "" {
			g.Version = hb.Version
		}
		if hb.Broker != "" {
			g.Broker = hb.Broker
		}
		// A heartbeat proves the gateway is up even if its retained
		// status was lost (an external broker restarted without state).
		if g.State != StateOnline {
			g.State, g.Since, g.Why = StateOnline, m.Received, ""
		}
	case m.Traces != nil:
		if m.Traces.Gateway != m.Gateway {
			a.reject(m, "trace batch names gateway %q", m.Traces.Gateway)
			return nil
		}
		return a.traces(m)
	case m.Silent != nil:
		return a.silent(m.Gateway, *m.Silent, m.Received)
	default:
		a.reject(m, "empty message")
	}
	return nil
}

// silent marks gateway gw offline if it is online and was last heard
// from before cutoff; otherwise it changes (and writes) nothing, so that
// every replica may ask it of every gateway it thinks silent.
func (a *applier) silent(gw string, cutoff, now time.Time) error {
	g := a.gws[gw]
	if g == nil {
		var err error
		if g, err = a.r.gateway(gw); err != nil || g == nil {
			return err
		}
	}
	if g.State != StateOnline || !g.LastSeen.Before(cutoff) {
		return nil
	}
	a.gws[gw] = g
	g.State, g.Since, g.Why = StateOffline, now, OfflineSilent
	return nil
}

func (a *applier) batch(m *Inbound) error {
	g, err := a.gateway(m.Gateway, m.Received)
	if err != nil {
		return err
	}
	g.LastSeen = m.Received
	// Check every entry first: a bad batch changes nothing at all.
	for i, e := range m.Batch.Entries {
		if e.Seq == 0 || e.Event.Seq == 0 || driver.ValidateID("mission id", e.Event.MissionID) != nil {
			a.reject(m, "entry %d: bad sequence or mission id", i)
			return nil
		}
	}
	var upto uint64
	for i := range m.Batch.Entries {
		e := &m.Batch.Entries[i]
		upto = max(upto, e.Seq)
		ms, err := a.mission(m.Gateway, e.Event.MissionID, e.Mission, m.Received)
		if err != nil {
			return err
		}
		mk := missionKey(m.Gateway, e.Event.MissionID)
		ek := string(eventKey(mk, e.Event.Seq))
		dup := a.stored[ek]
		if !dup {
			if dup, err = a.r.hasEvent(m.Gateway, e.Event.MissionID, e.Event.Seq); err != nil {
				return err
			}
		}
		if dup {
			a.res.Duplicates++
			g.Duplicates++
			continue
		}
		ne := NewEvent{Gateway: m.Gateway, Event: &e.Event}
		if m.rawEvents != nil {
			ne.raw = m.rawEvents[i]
		}
		a.stored[ek] = true
		a.events = append(a.events, ne)
		a.res.Stored++
		a.dirty[string(mk)] = true
		g.Events++
		ms.Events++
		ms.Updated = m.Received
		seq := e.Event.Seq
		switch {
		case seq > ms.Seq:
			if seq > ms.Seq+1 {
				gap := Gap{From: ms.Seq + 1, To: seq - 1, Compacted: e.Compacted, Detected: m.Received}
				ms.Gaps = append(ms.Gaps, gap)
				a.res.Gaps = append(a.res.Gaps, GapReport{Gateway: m.Gateway, MissionID: ms.ID, Gap: gap})
				g.Gaps++
			}
			ms.Seq = seq
			ms.Summary = withStepTable(e.Mission, ms.Summary)
		default:
			// A late event fills (part of) a gap; the summary stays with
			// the newest event, and takes the late one's step table if
			// it has none.
			ms.Summary = withStepTable(ms.Summary, e.Mission)
			var filled bool
			if ms.Gaps, filled = fillGap(ms.Gaps, seq); filled {
				g.GapsFilled++
				a.res.GapsFilled++
			}
			a.res.Late++
		}
	}
	switch {
	case upto == 0:
	case m.Batch.After == nil && a.chainOnly:
		// Before protocol 2, on a store shared by replicas: a cumulative
		// ack could cover a batch another replica has not stored yet.
		// Stored, never acked: the gateway keeps its entries (compacting
		// past its bound) until it speaks protocol 2.
		a.res.Unchained++
	case m.Batch.After == nil:
		// Before protocol 2: cumulative, trusting that nothing before the
		// batch was lost.
		g.Acked = max(g.Acked, upto)
		a.res.Acks[m.Gateway] = OutboxAck{Upto: max(a.res.Acks[m.Gateway].Upto, upto)}
	default:
		if o := m.Batch.Outbox; o != g.Outbox {
			// Another outbox (the gateway's store replaced or restored,
			// or a gateway that did not name its outbox): its seqs are
			// not those the cursor counts, and the chain starts again
			// from what the gateway holds acknowledged. A gateway naming
			// its outbox for the first time (upgraded) loses nothing by
			// it: it resends from its oldest entry after a restart.
			if g.Acked > 0 || len(g.Pending) > 0 {
				a.res.NewOutboxes = append(a.res.NewOutboxes, m.Gateway)
			}
			g.Acked, g.Pending, g.Outbox = 0, nil, o
		}
		// Entries the gateway has deleted were stored once, or are gone
		// for good: the chain may start from there.
		if m.Batch.Acked > g.Acked {
			g.advance(g.Acked, m.Batch.Acked)
		}
		g.advance(*m.Batch.After, upto)
		// Acked even when it did not move: the gateway needs an answer,
		// and takes no harm from one below what it has.
		a.res.Acks[m.Gateway] = OutboxAck{Outbox: g.Outbox, Upto: g.Acked}
	}
	return nil
}

// withStepTable is sum with the step table of from when it has none of
// its own: a gateway sends the table with a mission's first and last
// entries only (docs/protocol.md, "The step table"), and the hub keeps
// it in between. A table of another length (a mission retried with
// other steps cannot be, but a gateway can send anything) is not taken.
func withStepTable(sum, from driver.Summary) driver.Summary {
	if len(sum.StepIDs) > 0 || len(from.StepIDs) == 0 || sum.Steps != len(from.StepIDs) {
		return sum
	}
	sum.StepIDs, sum.StepNames, sum.StepTargets = from.StepIDs, from.StepNames, from.StepTargets
	if sum.State.Terminal() {
		sum.StepStatus = from.StepStatus
	}
	return sum
}

// fillGap removes seq from the gaps, splitting the one it falls in, and
// says whether that completed a gap as it was detected: its last missing
// event arrived (the pieces a split leaves keep the gap's Origin).
func fillGap(gaps []Gap, seq uint64) ([]Gap, bool) {
	out := gaps[:0:0]
	found, origin := false, uint64(0)
	for _, g := range gaps {
		if seq < g.From || seq > g.To {
			out = append(out, g)
			continue
		}
		found, origin = true, g.origin()
		if g.From < seq {
			l := g
			l.To, l.Origin = seq-1, origin
			out = append(out, l)
		}
		if seq < g.To {
			r := g
			r.From, r.Origin = seq+1, origin
			out = append(out, r)
		}
	}
	if !found {
		return out, false
	}
	for _, g := range out {
		if g.origin() == origin {
			return out, false
		}
	}
	return out, true
}

func (a *applier) gateway(id string, now time.Time) (*Gateway, error) {
	if g, ok := a.gws[id]; ok {
		return g, nil
	}
	g, err := a.r.gateway(id)
	if err != nil {
		return nil, fmt.Errorf("gateway %q: %w", id, err)
	}
	if g == nil {
		g = &Gateway{ID: id, State: StateUnknown, Since: now}
	}
	a.gws[id] = g
	return g, nil
}

func (a *applier) mission(gw, id string, sum driver.Summary, now time.Time) (*Mission, error) {
	mk := string(missionKey(gw, id))
	if m, ok := a.missions[mk]; ok {
		return m, nil
	}
	m, err := a.r.mission(gw, id)
	if err != nil {
		return nil, fmt.Errorf("mission %s/%s: %w", gw, id, err)
	}
	if m == nil {
		m = &Mission{Gateway: gw, ID: id, Created: sum.Created, FirstSeen: now}
		if m.Created.IsZero() {
			m.Created = now
		}
		a.created[mk] = true
	}
	a.finishedOld[mk] = finishedAt(m)
	a.before[mk] = m.Summary
	a.missions[mk] = m
	return m, nil
}

// finishedAt is when the mission finished, or zero while it is not
// terminal: the key of the finished index.
func finishedAt(m *Mission) time.Time {
	if !m.Summary.State.Terminal() {
		return time.Time{}
	}
	if t := m.Summary.Finished; !t.IsZero() {
		return t
	}
	return m.Updated
}

// changes lists what the transaction changed, in key order (so every
// store writes in the same order and reports the same Result), and
// fills in Result.Gateways and Result.Missions.
func (a *applier) changes() (gws []*Gateway, missions []*Mission) {
	ids := make([]string, 0, len(a.gws))
	for id := range a.gws {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		gws = append(gws, a.gws[id])
		a.res.Gateways = append(a.res.Gateways, *a.gws[id])
	}
	keys := make([]string, 0, len(a.dirty))
	for k := range a.dirty {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		missions = append(missions, a.missions[k])
		a.res.Missions = append(a.res.Missions, *a.missions[k])
	}
	return gws, missions
}

// boltReader reads an applier's records from a bbolt transaction.
type boltReader struct{ tx *bolt.Tx }

func getJSON[T any](b *bolt.Bucket, k []byte) (*T, error) {
	v := b.Get(k)
	if v == nil {
		return nil, nil
	}
	var out T
	if err := json.Unmarshal(v, &out); err != nil {
		return nil, fmt.Errorf("decode %q: %w", k, err)
	}
	return &out, nil
}

func (r boltReader) gateway(id string) (*Gateway, error) {
	return getJSON[Gateway](r.tx.Bucket(bucketGateways), []byte(id))
}

func (r boltReader) mission(gw, id string) (*Mission, error) {
	return getJSON[Mission](r.tx.Bucket(bucketMissions), missionKey(gw, id))
}

func (r boltReader) hasEvent(gw, mission string, seq uint64) (bool, error) {
	return r.tx.Bucket(bucketTimeline).Get(eventKey(missionKey(gw, mission), seq)) != nil, nil
}

func (r boltReader) trace(gw, requestID string) (*Trace, error) {
	return getJSON[Trace](r.tx.Bucket(bucketTraces), traceKey(gw, requestID))
}

// boltFlush writes what a did to the bbolt transaction.
func boltFlush(tx *bolt.Tx, a *applier) error {
	timeline := tx.Bucket(bucketTimeline)
	for _, e := range a.events {
		v, err := e.JSON()
		if err != nil {
			return fmt.Errorf("encode event: %w", err)
		}
		if err := timeline.Put(eventKey(missionKey(e.Gateway, e.Event.MissionID), e.Event.Seq), v); err != nil {
			return err
		}
	}
	traces := tx.Bucket(bucketTraces)
	for k, t := range a.changedTraces {
		if err := putJSON(traces, []byte(k), t); err != nil {
			return err
		}
	}
	gws, missions := a.changes()
	for _, g := range gws {
		if err := putGateway(tx, g); err != nil {
			return err
		}
	}
	order, finished := tx.Bucket(bucketOrder), tx.Bucket(bucketFinished)
	for _, m := range missions {
		mk := missionKey(m.Gateway, m.ID)
		if err := putJSON(tx.Bucket(bucketMissions), mk, m); err != nil {
			return err
		}
		if a.created[string(mk)] {
			if err := order.Put(timeKey(m.Created, mk), nil); err != nil {
				return err
			}
		}
		if old := a.finishedOld[string(mk)]; !old.Equal(finishedAt(m)) || a.before[string(mk)].State != m.Summary.State {
			if err := noteFailed(tx, a.before[string(mk)], old, m); err != nil {
				return err
			}
		}
		if old, cur := a.finishedOld[string(mk)], finishedAt(m); !old.Equal(cur) {
			if !old.IsZero() {
				if err := finished.Delete(timeKey(old, mk)); err != nil {
					return err
				}
			}
			if !cur.IsZero() {
				if err := finished.Put(timeKey(cur, mk), nil); err != nil {
					return err
				}
			}
		}
	}
	return boltOutcomes(tx, a.outcomeDeltas())
}
