package hub

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	bolt "go.etcd.io/bbolt"
)

// The worst gateways, scenes (and, once the roll-up keeps them,
// devices) by failure rate come from the outcome roll-up (outcomes.go):
// one aggregate over the rows of a scope kind in the range, never a
// scan of missions.

// rankScopes maps GET /api/fleet/worst's by= to the roll-up's scope
// prefix: a scope kind the roll-up keeps is ranked by adding it here.
var rankScopes = map[string]string{
	"gateway": "g/",
	"scene":   "s/",
	// A device is one gateway's (d/{gateway}/{device}); gateways
	// before the step table send none, and the dashboard then says
	// "no device data yet".
	"device": "d/",
}

// OutcomeTotal is a scope's counters summed over a range: missions by
// outcome and the steps that gave way (the roll-up's counters, without
// the duration histogram).
type OutcomeTotal [oHist]int64

// totalsReader sums the roll-up's counters per scope: both stores
// implement it.
type totalsReader interface {
	// OutcomeTotals sums, for every scope starting with prefix, the
	// roll-up's counters from hour from to hour to (to excluded), keyed
	// by the scope without the prefix.
	OutcomeTotals(ctx context.Context, prefix string, from, to int64) (map[string]OutcomeTotal, error)
}

var (
	_ totalsReader = (*Store)(nil)
	_ totalsReader = (*PGStore)(nil)
)

// OutcomeTotals implements totalsReader: the rows of each scope are in
// hour order, so each scope is entered at hour from and left at hour to
// with a seek; the rows outside the range are not read.
func (s *Store) OutcomeTotals(ctx context.Context, prefix string, from, to int64) (map[string]OutcomeTotal, error) {
	out := map[string]OutcomeTotal{}
	p := []byte(prefix)
	err := s.view(ctx, func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketOutcomes)
		if b == nil {
			return nil
		}
		c := b.Cursor()
		n := 0
		for k, v := c.Seek(p); k != nil && bytes.HasPrefix(k, p); {
			if n++; n%scanCheck == 0 && ctx.Err() != nil {
				return ctx.Err()
			}
			if len(k) < len(p)+9 || k[len(k)-9] != 0 {
				k, v = c.Next()
				continue
			}
			scope := k[:len(k)-9]
			switch hour := int64(binary.BigEndian.Uint64(k[len(k)-8:])); {
			case hour < from:
				k, v = c.Seek(outcomeKey(string(scope), from))
				continue
			case hour >= to:
				k, v = c.Seek(append(append([]byte(nil), scope...), 1))
				continue
			}
			if len(v) != 8*rollupLen {
				return fmt.Errorf("outcome row of %d bytes, want %d", len(v), 8*rollupLen)
			}
			name := string(scope[len(p):])
			t := out[name]
			for i := range t {
				t[i] += int64(binary.BigEndian.Uint64(v[8*i:]))
			}
			out[name] = t
			k, v = c.Next()
		}
		return nil
	})
	return out, err
}

// OutcomeTotals implements totalsReader with one aggregate query. A
// prefix of a scope kind (two bytes: "g/", "s/", "d/", and longer ones
// within a kind) reads the range's rows alone through the index on the
// kind and the hour (schema version 4); a shorter one reads every row.
func (s *PGStore) OutcomeTotals(ctx context.Context, prefix string, from, to int64) (_ map[string]OutcomeTotal, err error) {
	defer unavailable(&err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	kind := ""
	if utf8.RuneCountInString(prefix) >= 2 {
		kind = `left(scope, 2) = left($1, 2) AND `
	}
	out := map[string]OutcomeTotal{}
	err = pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		// One group per scope (10,000 gateways: some 7 MB): with the
		// default 4 MB the aggregate sorted its rows, whole roll-up rows
		// of 500 bytes, on disk, a third of its time at 1,000,000
		// missions.
		if _, err := tx.Exec(ctx, `SET LOCAL work_mem = '32MB'`); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT substr(scope, $4), sum(v[1]), sum(v[2]), sum(v[3]), sum(v[4]), sum(v[5])
			FROM sortie_outcomes WHERE `+kind+`starts_with(scope, $1) AND hour >= $2 AND hour < $3 GROUP BY scope`,
			prefix, from, to, len(prefix)+1)
		if err != nil {
			return err
		}
		var name string
		var t OutcomeTotal
		_, err = pgx.ForEachRow(rows, []any{&name, &t[0], &t[1], &t[2], &t[3], &t[4]}, func() error {
			out[name] = t
			return nil
		})
		return err
	})
	return out, err
}

// WorstEntry is one ranked scope: its missions by outcome in the range,
// its failure rate (failed and undone of finished) and the rate's
// lower bound that ranks it.
type WorstEntry struct {
	Name       string  `json:"name"`
	Finished   int64   `json:"finished"`
	Failures   int64   `json:"failures"` // failed + undone
	Succeeded  int64   `json:"succeeded"`
	Failed     int64   `json:"failed"`
	Undone     int64   `json:"undone"`
	Cancelled  int64   `json:"cancelled"`
	Superseded int64   `json:"superseded"`
	Rate       float64 `json:"rate"`
	RateLow    float64 `json:"rate_low"`
}

// Worst is the body of GET /api/fleet/worst.
type Worst struct {
	By    string    `json:"by"`
	Range string    `json:"range"`
	From  time.Time `json:"from"`
	To    time.Time `json:"to"`
	// Min is the fewest finished missions a scope needs to be ranked.
	Min int64 `json:"min"`
	// Scopes counts the scopes with a finished mission in the range;
	// Failing those with a failure; BelowMin those with a failure but
	// fewer than Min finished (not ranked).
	Scopes   int          `json:"scopes"`
	Failing  int          `json:"failing"`
	BelowMin int          `json:"below_min"`
	Entries  []WorstEntry `json:"entries"`
}

// Defaults of the ranking.
const (
	worstMin      = 10
	worstLimit    = 10
	worstMaxLimit = 500
)

// wilsonLow is the lower bound of the 95% Wilson score interval of k
// failures in n: a rate from few missions gets a low bound far under
// it, so 1 failed of 1 (0.21) ranks below 300 of 1,000 (0.27).
func wilsonLow(k, n int64) float64 {
	if n <= 0 {
		return 0
	}
	const z = 1.959964
	p, nf := float64(k)/float64(n), float64(n)
	den := 1 + z*z/nf
	mid := p + z*z/(2*nf)
	half := z * math.Sqrt(p*(1-p)/nf+z*z/(4*nf*nf))
	return max(0, (mid-half)/den)
}

// BuildWorst ranks the scopes of kind by (a rankScopes key) by failure
// rate over the range ending now: those with at least min finished
// missions and a failure, by the rate's Wilson lower bound, then by
// failures, then by name; at most limit.
func BuildWorst(ctx context.Context, st totalsReader, by, rng string, min int64, limit int, now time.Time) (Worst, error) {
	prefix, ok := rankScopes[by]
	if !ok {
		return Worst{}, fmt.Errorf("%w: by %q is not one of %s", ErrInvalid, by, strings.Join(slices.Sorted(maps.Keys(rankScopes)), ", "))
	}
	r, ok := outcomeRanges[rng]
	if !ok {
		return Worst{}, fmt.Errorf("%w: range %q is not 24h, 7d or 30d", ErrInvalid, rng)
	}
	to := now.Unix()/3600 + 1
	from := to - int64(r.span/time.Hour)
	totals, err := st.OutcomeTotals(ctx, prefix, from, to)
	if err != nil {
		return Worst{}, err
	}
	w := Worst{By: by, Range: rng, Min: min, From: time.Unix(from*3600, 0).UTC(), To: time.Unix(to*3600, 0).UTC(), Entries: []WorstEntry{}}
	for name, t := range totals {
		e := WorstEntry{Name: name, Succeeded: t[oSucceeded], Failed: t[oFailed], Undone: t[oUndone], Cancelled: t[oCancelled], Superseded: t[oSuperseded]}
		e.Finished = e.Succeeded + e.Failed + e.Undone + e.Cancelled
		e.Failures = e.Failed + e.Undone
		if e.Finished <= 0 {
			continue
		}
		w.Scopes++
		if e.Failures <= 0 {
			continue
		}
		w.Failing++
		if e.Finished < min {
			w.BelowMin++
			continue
		}
		e.Rate = math.Round(float64(e.Failures)/float64(e.Finished)*1e4) / 1e4
		e.RateLow = math.Round(wilsonLow(e.Failures, e.Finished)*1e4) / 1e4
		w.Entries = append(w.Entries, e)
	}
	slices.SortFunc(w.Entries, func(a, b WorstEntry) int {
		switch {
		case a.RateLow != b.RateLow:
			return cmp.Compare(b.RateLow, a.RateLow)
		case a.Failures != b.Failures:
			return cmp.Compare(b.Failures, a.Failures)
		}
		return strings.Compare(a.Name, b.Name)
	})
	if len(w.Entries) > limit {
		w.Entries = w.Entries[:limit]
	}
	return w, nil
}

// ttlCache keeps answers a short while: the worst rankings (the
// roll-up is by hour and the panel is about the week) and the fleet's
// counts, which every open dashboard asks for again at each refresh
// and a 10,000-gateway fleet makes costly (docs/hub.md).
type ttlCache[T any] struct {
	mu   sync.Mutex
	ttl  time.Duration
	held map[string]ttlHeld[T]
}

type ttlHeld[T any] struct {
	at time.Time
	v  T
}

func (c *ttlCache[T]) get(key string, now time.Time) (T, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, ok := c.held[key]
	if !ok || now.Sub(h.at) >= c.ttl || now.Before(h.at) {
		var zero T
		return zero, false
	}
	return h.v, true
}

func (c *ttlCache[T]) put(key string, now time.Time, v T) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held == nil || len(c.held) > 64 {
		c.held = map[string]ttlHeld[T]{}
	}
	c.held[key] = ttlHeld[T]{at: now, v: v}
}
