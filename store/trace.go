package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
)

// Trace buckets: traces keeps one record per request ID (every
// evaluation of a trigger with that ID), traceage orders them for
// retention, and schedules keeps each schedule's cursor.
var (
	bTraces    = []byte("traces")
	bTraceAge  = []byte("traceage")
	bSchedules = []byte("schedules")
	kTraceSize = []byte("trace_bytes")
	// bTraceLog holds each evaluation until the hub has it (with
	// Options.Outbox), keyed by its trace seq; kTraceLogN counts them.
	bTraceLog  = []byte("tracelog")
	kTraceLogN = []byte("tracelog_n")
)

// MaxTraceLog bounds the evaluations waiting for the hub: past it the
// oldest are dropped (the gateway's own records keep them). Records are
// diagnostics; an outage of the hub must not grow the file without end.
const MaxTraceLog = 10000

// TraceLogEntry is an evaluation waiting for the hub, with its trace seq.
type TraceLogEntry struct {
	Seq uint64
	Evaluation
}

// Trace limits: a record is what one request ID's evaluations cost, so
// a sender that resends one ID forever, or sends long messages, costs a
// bounded record.
const (
	// MaxEvaluations is how many evaluations a record keeps: the first,
	// which explains what happened, and the latest ones.
	MaxEvaluations = 8
	// maxTraceText bounds each text field of an evaluation.
	maxTraceText = 512
	traceFormat  = 1
)

// Evaluation is one decision on a trigger: its outcome and why. The agent
// records one for every trigger it answers, whatever it came through.
type Evaluation struct {
	RequestID string
	At        time.Time
	// Via is the way in: "mqtt", "api", "hub" or "schedule".
	Via    string
	Scene  string
	Source string
	// Outcome is "accepted", "duplicate", "rejected" or "skipped" (a
	// schedule's firing that was not run).
	Outcome string
	// Reason is the machine-readable reason of a rejection or skip;
	// Message says it in words.
	Reason    string
	Message   string
	MissionID string
}

// Failed reports whether the evaluation started nothing: a rejection or
// a skipped firing. Failures are kept longest.
func (e Evaluation) Failed() bool { return e.Outcome == "rejected" || e.Outcome == "skipped" }

// Trace is every evaluation kept for one request ID, oldest first.
type Trace struct {
	RequestID   string
	Evaluations []Evaluation
	// Dropped counts evaluations left out between the first and the
	// ones kept (MaxEvaluations).
	Dropped uint64
}

// Cursor is how far a schedule has been handled: every firing at or
// before At was run, or decided against.
type Cursor struct {
	Schedule string
	At       time.Time
	// Reset moves the cursor even back: the agent found it ahead of a
	// clock that had been wrong.
	Reset bool
}

// AddTraces merges evaluations into their request IDs' records and
// stores schedule cursors, in one write transaction: the agent batches
// them, so that a trigger costs flash once per batch rather than once
// each. A cursor never moves back unless it says Reset.
func (db *DB) AddTraces(ctx context.Context, evs []Evaluation, cursors []Cursor) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(evs) == 0 && len(cursors) == 0 {
		return nil
	}
	err := db.update(func(tx *bolt.Tx) error {
		tb, ab, meta := tx.Bucket(bTraces), tx.Bucket(bTraceAge), tx.Bucket(bMeta)
		size := int64(beUint(meta.Get(kTraceSize)))
		for _, e := range evs {
			if driver.CheckID("request_id", e.RequestID) != nil {
				continue // not a key anyone can ask about; the agent logs it
			}
			key := []byte(e.RequestID)
			var t Trace
			old := tb.Get(key)
			if old != nil {
				size -= traceCost(key, old)
				prev, err := decodeTrace(key, old)
				if err != nil {
					// One damaged record must not stop every later one (and
					// the schedules' cursors) from being written: it starts
					// afresh. Its age key, if any, is left to retention.
					db.log.Warn("trace record unreadable; starting it afresh", "request", e.RequestID, "err", err)
				} else {
					t = prev
					if err := ab.Delete(traceAgeKey(t)); err != nil {
						return err
					}
				}
			}
			t.RequestID = e.RequestID
			t.add(e)
			v := encodeTrace(nil, t)
			if err := tb.Put(key, v); err != nil {
				return err
			}
			if err := ab.Put(traceAgeKey(t), nil); err != nil {
				return err
			}
			size += traceCost(key, v)
		}
		if err := meta.Put(kTraceSize, be64(uint64(max(size, 0)))); err != nil {
			return err
		}
		if db.ob.enabled {
			if err := logTraces(tx, evs); err != nil {
				return err
			}
		}
		sb := tx.Bucket(bSchedules)
		for _, c := range cursors {
			k := []byte(c.Schedule)
			if old := sb.Get(k); !c.Reset && len(old) == 8 && int64(binary.BigEndian.Uint64(old)) >= c.At.Unix() {
				continue
			}
			if err := sb.Put(k, be64(uint64(c.At.Unix()))); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("add traces: %w", err)
	}
	return nil
}

// logTraces appends evaluations to the trace log for the hub, dropping
// the oldest beyond MaxTraceLog.
func logTraces(tx *bolt.Tx, evs []Evaluation) error {
	tl, meta := tx.Bucket(bTraceLog), tx.Bucket(bMeta)
	n := beUint(meta.Get(kTraceLogN))
	for _, e := range evs {
		if driver.CheckID("request_id", e.RequestID) != nil {
			continue
		}
		seq, err := tl.NextSequence()
		if err != nil {
			return err
		}
		e.clip()
		if err := tl.Put(be64(seq), encodeLogEntry(e)); err != nil {
			return err
		}
		n++
	}
	c := tl.Cursor()
	for k, _ := c.First(); k != nil && n > MaxTraceLog; k, _ = c.First() {
		if err := c.Delete(); err != nil {
			return err
		}
		n--
	}
	return meta.Put(kTraceLogN, be64(n))
}

func encodeLogEntry(e Evaluation) []byte {
	b := binary.AppendUvarint(nil, uint64(len(e.RequestID)))
	b = append(b, e.RequestID...)
	return encodeTrace(b, Trace{RequestID: e.RequestID, Evaluations: []Evaluation{e}})
}

func decodeLogEntry(seq uint64, v []byte) (TraceLogEntry, error) {
	r := payloadReader{b: v}
	id := r.bytes()
	if r.err != nil {
		return TraceLogEntry{}, fmt.Errorf("%w: trace log entry %d: truncated", ErrCorrupt, seq)
	}
	t, err := decodeTrace(id, r.b)
	if err != nil {
		return TraceLogEntry{}, err
	}
	if len(t.Evaluations) != 1 {
		return TraceLogEntry{}, fmt.Errorf("%w: trace log entry %d has %d evaluations", ErrCorrupt, seq, len(t.Evaluations))
	}
	return TraceLogEntry{Seq: seq, Evaluation: t.Evaluations[0]}, nil
}

// TraceLog returns up to limit evaluations waiting for the hub with
// trace seq greater than after, in seq order.
func (db *DB) TraceLog(ctx context.Context, after uint64, limit int) ([]TraceLogEntry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if limit <= 0 || limit > MaxOutboxLimit {
		limit = MaxOutboxLimit
	}
	var out []TraceLogEntry
	err := db.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bTraceLog).Cursor()
		for k, v := c.Seek(be64(after + 1)); k != nil && len(out) < limit; k, v = c.Next() {
			if len(k) != 8 {
				return fmt.Errorf("%w: trace log key %x", ErrCorrupt, k)
			}
			e, err := decodeLogEntry(binary.BigEndian.Uint64(k), v)
			if err != nil {
				// Skipped, not fatal: one damaged entry must not stop the
				// sync; the hub's ack of a later one deletes it.
				db.log.Warn("trace log entry unreadable; skipped", "seq", binary.BigEndian.Uint64(k), "err", err)
				continue
			}
			out = append(out, e)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read trace log: %w", err)
	}
	return out, nil
}

// AckTraceLog deletes the evaluations up to and including upto, which
// the hub has stored, and returns how many.
func (db *DB) AckTraceLog(ctx context.Context, upto uint64) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	n := 0
	err := db.update(func(tx *bolt.Tx) error {
		tl, meta := tx.Bucket(bTraceLog), tx.Bucket(bMeta)
		c := tl.Cursor()
		for k, _ := c.First(); k != nil && binary.BigEndian.Uint64(k) <= upto; k, _ = c.First() {
			if err := c.Delete(); err != nil {
				return err
			}
			n++
		}
		left := beUint(meta.Get(kTraceLogN))
		return meta.Put(kTraceLogN, be64(left-min(left, uint64(n))))
	})
	if err != nil {
		return 0, fmt.Errorf("ack trace log: %w", err)
	}
	return n, nil
}

// Add appends e, keeping the first evaluation and the latest ones, as
// the store does; the agent merges evaluations not yet written with it.
func (t *Trace) Add(e Evaluation) { t.add(e) }

// add appends e, keeping the first evaluation and the latest ones.
func (t *Trace) add(e Evaluation) {
	e.clip()
	t.Evaluations = append(t.Evaluations, e)
	if n := len(t.Evaluations); n > MaxEvaluations {
		t.Evaluations = append(t.Evaluations[:1], t.Evaluations[n-MaxEvaluations+1:]...)
		t.Dropped++
	}
}

// clip bounds every text field, so that no sender makes a record big.
func (e *Evaluation) clip() {
	for _, f := range [...]*string{&e.Via, &e.Scene, &e.Source, &e.Outcome, &e.Reason, &e.MissionID} {
		*f = clipTo(*f, driver.MaxIDLen)
	}
	e.Message = clip(e.Message)
}

func clip(s string) string { return clipTo(s, maxTraceText) }

// clipTo cuts s to at most n bytes and a mark, on a rune boundary.
func clipTo(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && s[len(s)-1]&0xc0 == 0x80 { // do not cut a rune in two
		s = s[:len(s)-1]
	}
	if len(s) > 0 && s[len(s)-1] >= 0xc0 {
		s = s[:len(s)-1]
	}
	return s + "…"
}

// traceCost is what a record takes: its key and value in traces and its
// key in traceage.
func traceCost(key, v []byte) int64 { return int64(2*len(key) + len(v) + 9) }

// traceAgeKey orders records for retention: failures apart from the
// rest, then by their latest evaluation.
func traceAgeKey(t Trace) []byte {
	last := t.Evaluations[len(t.Evaluations)-1]
	k := make([]byte, 0, 9+len(t.RequestID))
	class := byte(0)
	if last.Failed() {
		class = 1
	}
	k = append(k, class)
	k = binary.BigEndian.AppendUint64(k, uint64(last.At.UnixMilli()))
	return append(k, t.RequestID...)
}

// Trace returns the record of a request ID, or an error wrapping
// driver.ErrNotFound.
func (db *DB) Trace(ctx context.Context, requestID string) (Trace, error) {
	if err := ctx.Err(); err != nil {
		return Trace{}, err
	}
	var t Trace
	err := db.view(func(tx *bolt.Tx) error {
		v := tx.Bucket(bTraces).Get([]byte(requestID))
		if v == nil {
			return driver.ErrNotFound
		}
		var err error
		t, err = decodeTrace([]byte(requestID), v)
		return err
	})
	if err != nil {
		return Trace{}, fmt.Errorf("trace %q: %w", requestID, err)
	}
	return t, nil
}

// RecentTraces returns up to limit records, newest first: failed ones
// (whose latest evaluation was a rejection or a skip) when failed is
// set, else the others.
func (db *DB) RecentTraces(ctx context.Context, failed bool, limit int) ([]Trace, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	class := byte(0)
	if failed {
		class = 1
	}
	var out []Trace
	err := db.view(func(tx *bolt.Tx) error {
		tb := tx.Bucket(bTraces)
		c := tx.Bucket(bTraceAge).Cursor()
		k, _ := c.Seek([]byte{class + 1})
		if k == nil {
			k, _ = c.Last()
		} else {
			k, _ = c.Prev()
		}
		for ; k != nil && k[0] == class && len(out) < limit; k, _ = c.Prev() {
			id := k[9:]
			v := tb.Get(id)
			if v == nil || !ageKeyOf(id, v, k) {
				continue // a key left by a record that began afresh
			}
			t, err := decodeTrace(id, v)
			if err != nil {
				db.log.Warn("trace record unreadable", "request", string(id), "err", err)
				continue
			}
			out = append(out, t)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("recent traces: %w", err)
	}
	return out, nil
}

// Cursors returns every schedule's cursor.
func (db *DB) Cursors(ctx context.Context) (map[string]time.Time, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := map[string]time.Time{}
	err := db.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bSchedules).ForEach(func(k, v []byte) error {
			if len(v) != 8 {
				return fmt.Errorf("%w: schedule %q has a cursor of %d bytes", ErrCorrupt, k, len(v))
			}
			out[string(k)] = time.Unix(int64(binary.BigEndian.Uint64(v)), 0)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("schedule cursors: %w", err)
	}
	return out, nil
}

// TraceLimits bound the trace records PruneTraces keeps.
type TraceLimits struct {
	// MaxAge drops records whose latest evaluation is older, and
	// FailedMaxAge failed ones (kept longer: they are what people ask
	// about). Zero keeps them.
	MaxAge, FailedMaxAge time.Duration
	// MaxBytes bounds the records' bytes: the oldest go first, records
	// that did not fail before those that did. Zero is no bound.
	MaxBytes int64
}

// TraceStats reports the trace records kept and their bytes.
func (db *DB) TraceStats() (records int, bytes int64, err error) {
	err = db.view(func(tx *bolt.Tx) error {
		records = tx.Bucket(bTraces).Stats().KeyN
		bytes = int64(beUint(tx.Bucket(bMeta).Get(kTraceSize)))
		return nil
	})
	return records, bytes, err
}

// PruneTraces deletes trace records beyond the limits, as of now, in
// small transactions, and returns how many it deleted.
func (db *DB) PruneTraces(ctx context.Context, l TraceLimits, now time.Time) (int, error) {
	deleted := 0
	for class := byte(0); class <= 1; class++ {
		age := l.MaxAge
		if class == 1 {
			age = l.FailedMaxAge
		}
		// A clock before 1970 (a gateway booting without one) would wrap
		// the cutoff and make every record old.
		if age <= 0 || now.Add(-age).UnixMilli() <= 0 {
			continue
		}
		cutoff := uint64(now.Add(-age).UnixMilli())
		for {
			n, err := db.pruneTraces(ctx, []byte{class}, func(k []byte, _ int64) bool {
				return k[0] == class && binary.BigEndian.Uint64(k[1:9]) < cutoff
			})
			deleted += n
			if err != nil || n < pruneBatch {
				if err != nil {
					return deleted, err
				}
				break
			}
		}
	}
	if l.MaxBytes <= 0 {
		return deleted, nil
	}
	for {
		// Records that did not fail go first: the age keys sort them
		// before failed ones, so the oldest key is always the next victim.
		n, err := db.pruneTraces(ctx, nil, func(_ []byte, size int64) bool { return size > l.MaxBytes })
		deleted += n
		if err != nil || n < pruneBatch {
			return deleted, err
		}
	}
}

// pruneTraces deletes up to pruneBatch records in age-key order from
// start while victim says so, in one transaction.
func (db *DB) pruneTraces(ctx context.Context, start []byte, victim func(ageKey []byte, size int64) bool) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	n := 0
	err := db.update(func(tx *bolt.Tx) error {
		tb, ab, meta := tx.Bucket(bTraces), tx.Bucket(bTraceAge), tx.Bucket(bMeta)
		size := int64(beUint(meta.Get(kTraceSize)))
		c := ab.Cursor()
		var keys [][]byte
		for k, _ := c.Seek(start); k != nil && len(keys) < pruneBatch; k, _ = c.Next() {
			if len(k) < 9 || !victim(k, size) {
				break
			}
			keys = append(keys, bytes.Clone(k))
		}
		for _, k := range keys {
			// An age key left by a record that was unreadable and began
			// afresh is not its successor's: only the key goes.
			id := k[9:]
			if v := tb.Get(id); v != nil && ageKeyOf(id, v, k) {
				size -= traceCost(id, v)
				if err := tb.Delete(id); err != nil {
					return err
				}
			}
			if err := ab.Delete(k); err != nil {
				return err
			}
		}
		n = len(keys)
		return meta.Put(kTraceSize, be64(uint64(max(size, 0))))
	})
	if err != nil {
		return 0, fmt.Errorf("prune traces: %w", err)
	}
	return n, nil
}

// ageKeyOf reports whether k is the age key of the record v of id.
func ageKeyOf(id, v, k []byte) bool {
	t, err := decodeTrace(id, v)
	return err == nil && bytes.Equal(traceAgeKey(t), k)
}

func beUint(b []byte) uint64 {
	if len(b) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

// encodeTrace writes a record: a format byte, the dropped count, the
// evaluation count, then per evaluation its time (Unix ms, varint), and
// its text fields as length-prefixed strings. The request ID is the key.
func encodeTrace(dst []byte, t Trace) []byte {
	dst = append(dst, traceFormat)
	dst = binary.AppendUvarint(dst, t.Dropped)
	dst = binary.AppendUvarint(dst, uint64(len(t.Evaluations)))
	for _, e := range t.Evaluations {
		dst = binary.AppendVarint(dst, e.At.UnixMilli())
		for _, s := range [...]string{e.Via, e.Scene, e.Source, e.Outcome, e.Reason, e.Message, e.MissionID} {
			dst = binary.AppendUvarint(dst, uint64(len(s)))
			dst = append(dst, s...)
		}
	}
	return dst
}

// decodeTrace reads a record encodeTrace wrote; damage is ErrCorrupt,
// never a panic.
func decodeTrace(key, v []byte) (Trace, error) {
	bad := func(what string) (Trace, error) {
		return Trace{}, fmt.Errorf("%w: trace %q: %s", ErrCorrupt, key, what)
	}
	if len(v) == 0 || v[0] != traceFormat {
		return bad("unknown format")
	}
	r := payloadReader{b: v[1:]}
	t := Trace{RequestID: string(key), Dropped: r.uvarint()}
	n := r.uvarint()
	if r.err != nil || n > MaxEvaluations {
		return bad("bad evaluation count")
	}
	t.Evaluations = make([]Evaluation, 0, n)
	for range n {
		ms, k := binary.Varint(r.b)
		if k <= 0 {
			return bad("bad time")
		}
		r.b = r.b[k:]
		e := Evaluation{RequestID: t.RequestID, At: time.UnixMilli(ms)}
		for _, f := range [...]*string{&e.Via, &e.Scene, &e.Source, &e.Outcome, &e.Reason, &e.Message, &e.MissionID} {
			*f = string(r.bytes())
		}
		if r.err != nil {
			return bad("truncated")
		}
		t.Evaluations = append(t.Evaluations, e)
	}
	if len(r.b) != 0 {
		return bad("trailing bytes")
	}
	if len(t.Evaluations) == 0 {
		return bad("no evaluations")
	}
	return t, nil
}
