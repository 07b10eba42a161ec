package hub

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"sort"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
)

// Outcomes over time (docs/hub.md, "Outcomes over time") come from a
// roll-up, not from the missions: each store keeps, per scope (all
// gateways, one gateway, one scene, one gateway's device) and hour, the missions that finished
// in it by outcome, the steps that gave way, and a histogram of the
// missions' durations. The applier computes what a transaction changes
// (outcomeDeltas), so both stores count alike; a page of 30 days reads at
// most 720 rows of one scope however many missions there were.

// Counters of a roll-up row, then the duration histogram.
const (
	oSucceeded  = iota // SUCCEEDED
	oFailed            // FAILED, nothing undone
	oUndone            // FAILED or CANCELLED, with steps undone
	oCancelled         // CANCELLED, nothing undone
	oSuperseded        // steps (and undos) that gave way to a newer mission
	oHist              // first histogram bucket
)

// histBuckets are the duration histogram's buckets: bucket k holds
// durations from 2^(k/2) ms to 2^((k+1)/2) ms (the first also shorter
// ones, the last also longer), so a percentile read from it is within
// 19% of the true one, from a millisecond to three days.
const histBuckets = 56

// rollupLen is the length of a roll-up row.
const rollupLen = oHist + histBuckets

// outcomeRetention is how long hourly rows are kept: the longest range
// shown (30 days) and a margin.
const outcomeRetention = 35 * 24 * time.Hour

// OutcomeRow is one roll-up row: the counters (succeeded, failed,
// undone, cancelled, superseded steps) then the duration histogram.
type OutcomeRow [rollupLen]int64

// bucketOutcomes is the bbolt store's roll-up: scope + 0x00 + hour (8
// bytes big-endian, hours since 1970 UTC) -> rollupLen big-endian int64.
var bucketOutcomes = []byte("outcomes")

// Scopes of a roll-up row. A gateway's ID has no "/"; a scene's name
// loses its NULs, which PostgreSQL's text refuses, in both stores alike.
// A device is one gateway's: "d/" + gateway + "/" + device, whose ID has
// no "/" either (devices.toml's rule; a step table's target that breaks
// it is not counted).
func scopeAll() string                  { return "*" }
func scopeGateway(gw string) string     { return "g/" + gw }
func scopeScene(sc string) string       { return "s/" + pgText(sc) }
func scopeDevice(gw, dev string) string { return "d/" + gw + "/" + dev }

// outcomeDelta is what a transaction adds to one roll-up row.
type outcomeDelta struct {
	scope string
	hour  int64
	v     OutcomeRow
}

// outcomeOf classifies a finished mission; -1 while it is not finished.
func outcomeOf(s driver.Summary) int {
	switch {
	case !s.State.Terminal():
		return -1
	case s.State == driver.StateSucceeded:
		return oSucceeded
	case s.Undone > 0:
		return oUndone
	case s.State == driver.StateCancelled:
		return oCancelled
	}
	return oFailed
}

// deviceOutcomes classifies a finished mission of outcome o for each
// device a step of it commanded (docs/hub.md, "Devices"): the devices
// are the targets, in the step table of the mission's last summary, of
// the steps that began (succeeded, failed, gave way or were undone
// since). A mission that failed counts as failed (or undone) for a device
// a failed step commanded; a cancelled one as cancelled; any other as
// succeeded, the device having done its part. Without a step table
// (gateways before it, or one cut from the message) no device counts.
func deviceOutcomes(s driver.Summary, o int) map[string]int {
	if o < 0 || len(s.StepStatus) != len(s.StepTargets) {
		return nil
	}
	out := map[string]int{}
	var order []string // the devices in step order, first seen
	for i, dev := range s.StepTargets {
		_, had := out[dev]
		switch st := s.StepStatus[i]; {
		case dev == "" || driver.CheckID("device", dev) != nil:
		case st == driver.StepFailed && (o == oFailed || o == oUndone):
			out[dev] = o
		case st == driver.StepSucceeded || st == driver.StepCompensated || st == driver.StepFailed || st == driver.StepSuperseded:
			if _, seen := out[dev]; seen {
				continue
			}
			out[dev] = oSucceeded
			if s.State == driver.StateCancelled {
				out[dev] = oCancelled
			}
		}
		if _, ok := out[dev]; ok && !had {
			order = append(order, dev)
		}
	}
	if len(out) <= maxMissionDevices {
		return out
	}
	// Over the cap: the devices a failed step commanded first, then the
	// others, each in step order; the same summary always keeps the same
	// ones, so a retried mission's correction (counted -1 then +1) takes
	// back what it added.
	kept := make(map[string]int, maxMissionDevices)
	for _, failed := range []bool{true, false} {
		for _, dev := range order {
			if d := out[dev]; len(kept) < maxMissionDevices && (d == oFailed || d == oUndone) == failed {
				kept[dev] = d
			}
		}
	}
	return kept
}

// maxMissionDevices caps the device rows one mission adds to the
// roll-up (docs/hub.md, "Devices"): a step table naming a million
// device IDs, a gateway's bug or malice, costs at most this many row
// writes per mission, not one per ID. A scene commanding more devices
// than this counts the first it commanded, those that failed first.
const maxMissionDevices = 128

// histBucket is the histogram bucket of a duration.
func histBucket(d time.Duration) int {
	ms := float64(d) / float64(time.Millisecond)
	if ms <= 1 {
		return 0
	}
	return min(histBuckets-1, int(2*math.Log2(ms)))
}

// outcomeDeltas lists what the transaction's changes add to (or, for a
// mission an operator retried, take from) the roll-up, one delta per
// row, in key order so that concurrent writers lock rows alike.
func (a *applier) outcomeDeltas() []outcomeDelta {
	rows := map[[2]any]*outcomeDelta{}
	addTo := func(scope string, at time.Time, idx int, n int64) {
		hour := at.Unix() / 3600
		k := [2]any{scope, hour}
		d := rows[k]
		if d == nil {
			d = &outcomeDelta{scope: scope, hour: hour}
			rows[k] = d
		}
		d.v[idx] += n
	}
	add := func(gw, scene string, at time.Time, idx int, n int64) {
		for _, scope := range []string{scopeAll(), scopeGateway(gw), scopeScene(scene)} {
			addTo(scope, at, idx, n)
		}
	}
	count := func(m *Mission, s driver.Summary, fin time.Time, n int64) {
		o := outcomeOf(s)
		if o < 0 || fin.IsZero() {
			return
		}
		hist := oHist + histBucket(fin.Sub(s.Created))
		add(m.Gateway, s.Scene, fin, o, n)
		add(m.Gateway, s.Scene, fin, hist, n)
		for dev, do := range deviceOutcomes(s, o) {
			addTo(scopeDevice(m.Gateway, dev), fin, do, n)
			addTo(scopeDevice(m.Gateway, dev), fin, hist, n)
		}
	}
	for mk, m := range a.missions {
		before, after := a.before[mk], m.Summary
		old, cur := a.finishedOld[mk], finishedAt(m)
		if outcomeOf(before) == outcomeOf(after) && old.Equal(cur) && before.Scene == after.Scene && before.Created.Equal(after.Created) {
			continue
		}
		count(m, before, old, -1)
		count(m, after, cur, 1)
	}
	for _, e := range a.events {
		if e.Event.Code != driver.CodeSuperseded || e.Event.Input != driver.InStepError && e.Event.Input != driver.InCompResult {
			continue
		}
		scene, dev := e.Event.Type, ""
		if m := a.missions[string(missionKey(e.Gateway, e.Event.MissionID))]; m != nil {
			if m.Summary.Scene != "" {
				scene = m.Summary.Scene
			}
			if k := e.Event.Step; k >= 0 && k < len(m.Summary.StepTargets) {
				dev = m.Summary.StepTargets[k]
			}
		}
		add(e.Gateway, scene, e.Event.Time, oSuperseded, 1)
		if dev != "" && driver.CheckID("device", dev) == nil {
			addTo(scopeDevice(e.Gateway, dev), e.Event.Time, oSuperseded, 1)
		}
	}
	out := make([]outcomeDelta, 0, len(rows))
	for _, d := range rows {
		if d.v != (OutcomeRow{}) {
			out = append(out, *d)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].scope != out[j].scope {
			return out[i].scope < out[j].scope
		}
		return out[i].hour < out[j].hour
	})
	return out
}

func outcomeKey(scope string, hour int64) []byte {
	k := make([]byte, 0, len(scope)+9)
	k = append(k, scope...)
	k = append(k, 0)
	return binary.BigEndian.AppendUint64(k, uint64(hour))
}

func decodeRollup(v []byte) (OutcomeRow, error) {
	var r OutcomeRow
	if len(v) != 8*rollupLen {
		return r, fmt.Errorf("outcome row of %d bytes, want %d", len(v), 8*rollupLen)
	}
	for i := range r {
		r[i] = int64(binary.BigEndian.Uint64(v[8*i:]))
	}
	return r, nil
}

func encodeRollup(r OutcomeRow) []byte {
	b := make([]byte, 0, 8*rollupLen)
	for _, n := range r {
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	return b
}

// boltOutcomes adds the transaction's deltas to the bbolt roll-up.
func boltOutcomes(tx *bolt.Tx, ds []outcomeDelta) error {
	if len(ds) == 0 {
		return nil
	}
	b, err := tx.CreateBucketIfNotExists(bucketOutcomes)
	if err != nil {
		return err
	}
	for _, d := range ds {
		k := outcomeKey(d.scope, d.hour)
		var r OutcomeRow
		if v := b.Get(k); v != nil {
			if r, err = decodeRollup(v); err != nil {
				return err
			}
		}
		for i := range r {
			r[i] += d.v[i]
		}
		if err := b.Put(k, encodeRollup(r)); err != nil {
			return err
		}
	}
	return nil
}

// OutcomeHours returns the roll-up rows of scope from hour from to hour
// to (hours since 1970 UTC, to excluded).
func (s *Store) OutcomeHours(ctx context.Context, scope string, from, to int64) (map[int64]OutcomeRow, error) {
	out := map[int64]OutcomeRow{}
	err := s.view(ctx, func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketOutcomes)
		if b == nil {
			return nil
		}
		end := outcomeKey(scope, to)
		c := b.Cursor()
		for k, v := c.Seek(outcomeKey(scope, from)); k != nil && string(k) < string(end); k, v = c.Next() {
			r, err := decodeRollup(v)
			if err != nil {
				return err
			}
			out[int64(binary.BigEndian.Uint64(k[len(k)-8:]))] = r
		}
		return nil
	})
	return out, err
}

// pruneOutcomes drops the bbolt roll-up's rows older than the retention.
func pruneOutcomes(tx *bolt.Tx, now time.Time) error {
	b := tx.Bucket(bucketOutcomes)
	if b == nil {
		return nil
	}
	cutoff := now.Add(-outcomeRetention).Unix() / 3600
	var doomed [][]byte
	c := b.Cursor()
	// Each scope's rows are in hour order: take its old ones, then seek
	// past the rest of it, so the rows kept are not walked.
	for k, _ := c.First(); k != nil; {
		if len(k) < 9 {
			k, _ = c.Next()
			continue
		}
		scope := k[:len(k)-9]
		if int64(binary.BigEndian.Uint64(k[len(k)-8:])) < cutoff {
			doomed = append(doomed, append([]byte(nil), k...))
			k, _ = c.Next()
			continue
		}
		k, _ = c.Seek(append(append([]byte(nil), scope...), 1))
	}
	for _, k := range doomed {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return nil
}
