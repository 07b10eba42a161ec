package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
)

// A checkpoint applies many logged writes in one bbolt transaction, and
// most of them are saves of missions saved again in the same batch (a
// step's begin, then its end). The applier folds each mission's writes
// into one: its last record, its new events, and the index moves from
// where it was to where it ends, so a mission run from start to finish
// between two checkpoints is written once, already archived, and its
// events never enter the timeline bucket.
type applier struct {
	b      *txBuckets
	byID   map[string]*folded
	order  []*folded // first appearance, which is LSN order
	counts *counts
}

// folded is one mission's writes in a batch.
type folded struct {
	id     string
	create bool   // the batch creates it
	reqKey string // of the create
	last   *write
	seq    uint64 // the highest seq of its writes
	events []eventRec
}

func newApplier(b *txBuckets, c *counts) *applier {
	return &applier{b: b, byID: map[string]*folded{}, counts: c}
}

// add takes the next logged write. The write passed its checks when it
// was logged, so a failed expectation means the file changed behind the
// store's back: it is reported wrapping ErrCorrupt and the write skipped.
func (a *applier) add(w *write) error {
	f := a.byID[w.id]
	switch {
	case w.create && (f != nil || a.b.missions.Get([]byte(w.id)) != nil):
		return fmt.Errorf("%w: logged create of mission %q, which exists", ErrCorrupt, w.id)
	case w.create:
		f = &folded{id: w.id, create: true, reqKey: w.reqKey}
	case f == nil && a.b.missions.Get([]byte(w.id)) == nil:
		return fmt.Errorf("%w: logged save of mission %q, which is missing", ErrCorrupt, w.id)
	case f == nil:
		f = &folded{id: w.id}
	}
	if a.byID[w.id] == nil {
		a.byID[w.id] = f
		a.order = append(a.order, f)
	}
	f.last = w
	f.seq = max(f.seq, w.seq)
	f.events = append(f.events, w.events...)
	return w.putOutbox(a.b)
}

// flush writes every folded mission.
func (a *applier) flush(skip func(id string, err error)) error {
	for i, f := range a.order {
		if i%checkpointYield == checkpointYield-1 {
			runtime.Gosched() // archives are compressed here
		}
		if err := a.apply(f); err != nil {
			if !errors.Is(err, ErrCorrupt) {
				return err
			}
			skip(f.id, err)
		}
	}
	return nil
}

func (a *applier) apply(f *folded) error {
	b, w, id := a.b, f.last, []byte(f.id)
	rec := envelope{form: formJSON, schema: driver.SchemaVersion, state: w.state, version: w.version, finished: w.finished, seq: f.seq}
	var was envelope
	if f.create {
		order, err := b.order.NextSequence()
		if err != nil {
			return err
		}
		rec.order = order
		if err := b.order.Put(be64(order), id); err != nil {
			return err
		}
		if f.reqKey != "" {
			if err := b.requests.Put([]byte(f.reqKey), id); err != nil {
				return err
			}
		}
	} else {
		var err error
		if was, err = parseEnvelope(b.missions.Get(id)); err != nil {
			return fmt.Errorf("logged save of mission %q: %w", f.id, err)
		}
		rec.order, rec.seq = was.order, max(f.seq, was.seq)
	}

	// The events: in the archive once the mission is terminal, in the
	// timeline bucket while it is live (an archived mission retried
	// takes its events back out).
	var val []byte
	if rec.finished != 0 {
		old, err := oldEvents(b, f.id, was)
		if err != nil {
			return err
		}
		evs := append(old, f.events...)
		rec.form = formArchive
		val = make([]byte, headerLen, headerLen+len(w.body)/4)
		val = appendArchive(val, w.body, evs)
		rec.putHeader(val)
	} else {
		if was.form == formArchive {
			old, err := was.events()
			if err != nil {
				return fmt.Errorf("mission %q: %w", f.id, err)
			}
			for _, ev := range old {
				if err := b.timeline.Put(timelineKey(f.id, ev.seq), ev.data); err != nil {
					return err
				}
			}
		}
		for _, ev := range f.events {
			if err := b.timeline.Put(timelineKey(f.id, ev.seq), ev.data); err != nil {
				return err
			}
		}
		rec.form = formLive
		val = rec.encode()
		if err := b.live.Put(id, w.body); err != nil {
			return err
		}
	}
	if err := b.missions.Put(id, val); err != nil {
		return err
	}
	if rec.form != formLive && was.form == formLive {
		if err := b.live.Delete(id); err != nil {
			return err
		}
	}
	if f.create || was.finished != rec.finished {
		if !f.create {
			if err := unindex(b, f.id, was.finished); err != nil {
				return err
			}
		}
		if err := index(b, f.id, rec.finished); err != nil {
			return err
		}
	}
	// Counted once nothing above can skip the write as corrupt.
	if !f.create {
		a.counts.add(was.state, -1)
	}
	a.counts.add(rec.state, 1)
	a.counts.events += int64(len(f.events))
	return nil
}

// oldEvents returns the events stored for a mission before this batch,
// removing them from the timeline bucket: they are about to be archived.
func oldEvents(b *txBuckets, id string, was envelope) ([]eventRec, error) {
	if was.form == formArchive {
		evs, err := was.events()
		if err != nil {
			return nil, fmt.Errorf("mission %q: %w", id, err)
		}
		return evs, nil
	}
	if was.order == 0 { // created in this batch
		return nil, nil
	}
	prefix := timelinePrefix(id)
	var keys [][]byte
	var evs []eventRec
	c := b.timeline.Cursor()
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		keys = append(keys, bytes.Clone(k))
		evs = append(evs, eventRec{seq: binary.BigEndian.Uint64(k[len(k)-8:]), data: bytes.Clone(v)})
	}
	// Deleted after the walk: a bbolt cursor skips entries when the
	// bucket changes under it.
	for _, k := range keys {
		if err := b.timeline.Delete(k); err != nil {
			return nil, err
		}
	}
	return evs, nil
}

// index adds the mission to the active index while it is live and to the
// finished index once it is terminal.
func index(b *txBuckets, id string, finished uint64) error {
	if finished != 0 {
		return b.finished.Put(finishedKey(finished, id), []byte{})
	}
	return b.active.Put([]byte(id), []byte{})
}

// unindex removes the entry the mission had when its finish time was was.
func unindex(b *txBuckets, id string, was uint64) error {
	if was != 0 {
		return b.finished.Delete(finishedKey(was, id))
	}
	return b.active.Delete([]byte(id))
}

// counts are the stored missions by state and the stored events, kept in
// the meta bucket ("counts") by every transaction that changes them, so
// that start-up and a metrics scrape need not walk the missions.
type counts struct {
	states [len(stateCodes)]int64
	events int64
}

var kCounts = []byte("counts")

func (c *counts) add(code byte, n int64) {
	if int(code) >= len(c.states) {
		code = stateUnknown
	}
	c.states[code] += n
}

// encode: uvarint number of states, each state's count (zigzag, so a
// count driven below zero by a damaged file still round-trips), then the
// events.
func (c *counts) encode() []byte {
	b := binary.AppendUvarint(nil, uint64(len(c.states)))
	for _, n := range c.states {
		b = binary.AppendVarint(b, n)
	}
	return binary.AppendVarint(b, c.events)
}

func decodeCounts(v []byte) (counts, error) {
	var c counts
	if v == nil {
		return c, nil
	}
	r := payloadReader{b: v}
	n := r.count()
	for i := range n {
		x, k := binary.Varint(r.b)
		if k <= 0 {
			r.fail()
			break
		}
		r.b = r.b[k:]
		if i < uint64(len(c.states)) {
			c.states[i] = x
		}
	}
	if x, k := binary.Varint(r.b); k > 0 {
		c.events = x
	} else {
		r.fail()
	}
	if r.err != nil {
		return counts{}, fmt.Errorf("%w: meta counts: %w", ErrCorrupt, r.err)
	}
	return c, nil
}

func readCounts(tx *bolt.Tx) (counts, error) {
	return decodeCounts(tx.Bucket(bMeta).Get(kCounts))
}

func writeCounts(tx *bolt.Tx, c *counts) error {
	return tx.Bucket(bMeta).Put(kCounts, c.encode())
}
