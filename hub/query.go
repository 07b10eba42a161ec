package hub

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/driver/waterfall"
)

// Query selects missions for Missions. Zero fields match everything.
type Query struct {
	Gateway string
	States  []driver.State
	Scene   string
	Since   time.Time // created at or after
	Until   time.Time // created before
	// Cursor is the value returned with the previous page.
	Cursor string
	// Limit caps the page: default 50, at most MaxLimit.
	Limit int
}

// MaxLimit caps a page of missions.
const MaxLimit = 500

// page is the page size q asks for: Limit, 50 by default, at most
// MaxLimit.
func (q Query) page() int {
	orDefault(&q.Limit, 50)
	return min(q.Limit, MaxLimit)
}

func (q Query) match(m *Mission) bool {
	if q.Gateway != "" && m.Gateway != q.Gateway {
		return false
	}
	if q.Scene != "" && m.Summary.Scene != q.Scene {
		return false
	}
	return len(q.States) == 0 || slices.Contains(q.States, m.Summary.State)
}

// Missions returns missions matching q, newest first, and the cursor of
// the next page ("" when there is none).
func (s *Store) Missions(ctx context.Context, q Query) ([]Mission, string, error) {
	q.Limit = q.page()
	var start []byte
	if q.Cursor != "" {
		c, err := base64.RawURLEncoding.DecodeString(q.Cursor)
		if err != nil || len(c) < 9 {
			return nil, "", fmt.Errorf("%w: bad cursor", ErrInvalid)
		}
		start = c
	}
	var out []Mission
	var next string
	err := s.view(ctx, func(tx *bolt.Tx) error {
		missions := tx.Bucket(bucketMissions)
		c := tx.Bucket(bucketOrder).Cursor()
		var k []byte
		switch {
		case start != nil:
			// Resume strictly after (older than) the cursor's key.
			k, _ = c.Seek(start)
			if k == nil {
				k, _ = c.Last()
			}
			for k != nil && bytes.Compare(k, start) >= 0 {
				k, _ = c.Prev()
			}
		case !q.Until.IsZero():
			k, _ = c.Seek(timeKey(q.Until, nil))
			if k == nil {
				k, _ = c.Last()
			} else {
				k, _ = c.Prev()
			}
		default:
			k, _ = c.Last()
		}
		var sinceKey []byte
		if !q.Since.IsZero() {
			sinceKey = timeKey(q.Since, nil)
		}
		// A filter that matches few missions may read many: the
		// caller's deadline stops it.
		for n := 1; k != nil; k, _ = c.Prev() {
			if n++; n%scanCheck == 0 && ctx.Err() != nil {
				return ctx.Err()
			}
			if sinceKey != nil && bytes.Compare(k, sinceKey) < 0 {
				break
			}
			if !q.Until.IsZero() && bytes.Compare(k, timeKey(q.Until, nil)) >= 0 {
				continue
			}
			m, err := indexed(missions, k)
			if err != nil {
				return err
			}
			if m == nil || !q.match(m) {
				continue
			}
			if len(out) == q.Limit {
				next = base64.RawURLEncoding.EncodeToString(timeKey(out[len(out)-1].Created, missionKey(out[len(out)-1].Gateway, out[len(out)-1].ID)))
				return nil
			}
			out = append(out, *m)
		}
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	return out, next, nil
}

// Detail is a mission with its timeline and per-step timings.
type Detail struct {
	Mission
	Timeline []driver.Event `json:"timeline"`
	Steps    []StepTiming   `json:"steps"`
	// Waterfall is the timeline drawn as bars, set by the API.
	Waterfall *waterfall.Chart `json:"waterfall,omitempty"`
}

// StepTiming is what the timeline says about one step.
type StepTiming struct {
	Index    int               `json:"index"`
	ID       string            `json:"id,omitempty"`
	Status   driver.StepStatus `json:"status"`
	Attempts int               `json:"attempts"`
	Started  time.Time         `json:"started,omitzero"`
	Finished time.Time         `json:"finished,omitzero"`
	// Duration is Finished - Started, in milliseconds (rounded down)
	// and in microseconds, for steps that take less than a millisecond.
	DurationMS int64  `json:"duration_ms"`
	DurationUS int64  `json:"duration_us"`
	Error      string `json:"error,omitempty"`
	Code       string `json:"code,omitempty"`
}

// Mission returns one mission with its timeline, or ErrNotFound.
func (s *Store) Mission(ctx context.Context, gw, id string) (Detail, error) {
	var d Detail
	err := s.view(ctx, func(tx *bolt.Tx) error {
		mk := missionKey(gw, id)
		v := tx.Bucket(bucketMissions).Get(mk)
		if v == nil {
			return fmt.Errorf("%w: mission %s/%s", ErrNotFound, gw, id)
		}
		if err := json.Unmarshal(v, &d.Mission); err != nil {
			return fmt.Errorf("decode mission: %w", err)
		}
		prefix := append(mk, 0)
		c := tx.Bucket(bucketTimeline).Cursor()
		for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			if err := d.add(v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return Detail{}, err
	}
	d.Steps = Timings(d.Summary, d.Timeline)
	return d, nil
}

// add appends a stored event to the timeline.
func (d *Detail) add(v []byte) error {
	var ev driver.Event
	if err := json.Unmarshal(v, &ev); err != nil {
		return fmt.Errorf("decode event: %w", err)
	}
	d.Timeline = append(d.Timeline, ev)
	return nil
}

// Timings derives per-step status and timing from a timeline: a step
// starts at its first attempt and finishes at its last result.
func Timings(sum driver.Summary, events []driver.Event) []StepTiming {
	n := max(sum.Steps, len(sum.StepIDs))
	for _, ev := range events {
		n = max(n, ev.Step+1)
	}
	steps := make([]StepTiming, n)
	for i := range steps {
		steps[i] = StepTiming{Index: i, Status: driver.StepPending}
		if i < len(sum.StepIDs) {
			steps[i].ID = sum.StepIDs[i]
		}
	}
	for _, ev := range events {
		if ev.Step < 0 || ev.Step >= n {
			continue
		}
		st := &steps[ev.Step]
		if ev.StepID != "" {
			st.ID = ev.StepID
		}
		st.Attempts = max(st.Attempts, ev.Attempt)
		switch ev.Input {
		case driver.InBeginStep, driver.InRecover:
			if st.Started.IsZero() {
				st.Started = ev.Time
			}
			// A group's recovery names its first branch, which may be done.
			if ev.Input == driver.InBeginStep || st.Status != driver.StepSucceeded && st.Status != driver.StepFailed {
				st.Status = driver.StepRunning
			}
		case driver.InStepOK:
			st.Status, st.Finished, st.Error, st.Code = driver.StepSucceeded, ev.Time, "", ""
		case driver.InStepWait:
			// Not ready (offline device, delay): waiting, not failed.
			st.Status, st.Error, st.Code = driver.StepWaiting, ev.Error, ev.Code
		case driver.InStepError:
			// A later begin_step (a retry) sets it running again.
			st.Status, st.Finished, st.Error, st.Code = driver.StepFailed, ev.Time, ev.Error, ev.Code
			switch ev.Code {
			case driver.CodeSuperseded:
				st.Status = driver.StepSuperseded // gave way to a newer mission: not a failure
			case driver.CodeSkipped:
				st.Status = driver.StepSkipped
			}
		case driver.InCompResult:
			switch {
			case ev.Code == driver.CodeSuperseded:
				st.Status = driver.StepSuperseded // undo left alone: a newer mission changed the device
			case ev.Error == "":
				st.Status = driver.StepCompensated
			}
		}
		if st.Started.IsZero() && ev.Input != driver.InNext {
			st.Started = ev.Time
		}
	}
	for i := range steps {
		st := &steps[i]
		if !st.Started.IsZero() && !st.Finished.IsZero() && st.Finished.After(st.Started) {
			d := st.Finished.Sub(st.Started)
			st.DurationMS, st.DurationUS = d.Milliseconds(), d.Microseconds()
		}
		if (st.Status == driver.StepPending || st.Status == driver.StepWaiting) && sum.State.Terminal() && !st.Started.IsZero() {
			st.Status = driver.StepSkipped
		}
	}
	return steps
}

// indexed reads the mission a time-index key (timeKey) points to; nil
// when it is gone.
func indexed(missions *bolt.Bucket, k []byte) (*Mission, error) {
	v := missions.Get(k[8:])
	if v == nil {
		return nil, nil
	}
	var m Mission
	if err := json.Unmarshal(v, &m); err != nil {
		return nil, fmt.Errorf("decode mission %q: %w", k[8:], err)
	}
	return &m, nil
}

// Retention says which finished missions Prune removes: those finished
// more than MaxAge ago, and the oldest beyond MaxCount. Zero disables a
// limit. Missions still running are never removed.
type Retention struct {
	MaxAge   time.Duration
	MaxCount int
}

// Prune removes finished missions and their timelines per r and returns
// how many it removed. An event re-delivered for a pruned mission would
// create it again with a gap; gateways drop entries once acknowledged,
// so that takes a retention shorter than a gateway's outage.
func (s *Store) Prune(ctx context.Context, now time.Time, r Retention) (int, error) {
	removed := 0
	err := s.update(ctx, func(tx *bolt.Tx) error {
		removed = 0
		if err := pruneOutcomes(tx, now); err != nil {
			return err
		}
		fin := tx.Bucket(bucketFinished)
		total := fin.Stats().KeyN
		var cutoff []byte
		if r.MaxAge > 0 {
			cutoff = timeKey(now.Add(-r.MaxAge), nil)
		}
		var doomed [][]byte
		c := fin.Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			old := cutoff != nil && bytes.Compare(k, cutoff) < 0
			over := r.MaxCount > 0 && total-len(doomed) > r.MaxCount
			if !old && !over {
				break
			}
			doomed = append(doomed, bytes.Clone(k))
		}
		for i, fk := range doomed {
			if i%scanCheck == scanCheck-1 && ctx.Err() != nil {
				return ctx.Err() // rolled back: nothing removed
			}
			if err := deleteMission(tx, fk); err != nil {
				return err
			}
			removed++
		}
		// Trigger records go by age alone: MaxAge, else traceMaxAge.
		age := r.MaxAge
		if age <= 0 {
			age = traceMaxAge
		}
		_, err := pruneTraces(tx, now.Add(-age))
		return err
	})
	return removed, err
}

// traceMaxAge keeps trigger records when the retention has no age.
const traceMaxAge = 30 * 24 * time.Hour

func deleteMission(tx *bolt.Tx, fk []byte) error {
	mk := fk[8:]
	missions := tx.Bucket(bucketMissions)
	if v := missions.Get(mk); v != nil {
		var m Mission
		if err := json.Unmarshal(v, &m); err != nil {
			return fmt.Errorf("decode mission %q: %w", mk, err)
		}
		if err := tx.Bucket(bucketOrder).Delete(timeKey(m.Created, mk)); err != nil {
			return err
		}
		if err := tx.Bucket(bucketFailed).Delete(failedKey(m.Gateway, fk[:8], m.ID)); err != nil {
			return err
		}
	}
	if err := missions.Delete(mk); err != nil {
		return err
	}
	if err := deletePrefix(tx.Bucket(bucketTimeline), append(bytes.Clone(mk), 0)); err != nil {
		return err
	}
	return tx.Bucket(bucketFinished).Delete(fk)
}

// deletePrefix deletes the keys of b that begin with prefix.
func deletePrefix(b *bolt.Bucket, prefix []byte) error {
	c := b.Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Seek(prefix) {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return nil
}
