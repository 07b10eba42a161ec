package hub

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"time"
)

// OutcomeBucket is what finished in one hour or day: missions by
// outcome, steps that gave way, and the missions' duration percentiles
// (from the histogram: within 19%; zero when none finished).
type OutcomeBucket struct {
	Start      time.Time `json:"start"`
	Finished   int64     `json:"finished"`
	Succeeded  int64     `json:"succeeded"`
	Failed     int64     `json:"failed"`
	Undone     int64     `json:"undone"`
	Cancelled  int64     `json:"cancelled"`
	Superseded int64     `json:"superseded"`
	P50MS      float64   `json:"p50_ms"`
	P95MS      float64   `json:"p95_ms"`
}

// Outcomes is the body of GET /api/outcomes.
type Outcomes struct {
	Gateway string          `json:"gateway,omitempty"`
	Scene   string          `json:"scene,omitempty"`
	Range   string          `json:"range"`
	Step    string          `json:"step"`
	Buckets []OutcomeBucket `json:"buckets"`
	Total   OutcomeBucket   `json:"total"`
}

// outcomeRanges are the ranges offered and their default step.
var outcomeRanges = map[string]struct {
	span time.Duration
	step string
}{
	"24h": {24 * time.Hour, "hour"},
	"7d":  {7 * 24 * time.Hour, "day"},
	"30d": {30 * 24 * time.Hour, "day"},
}

// outcomeReader is the store's side of GET /api/outcomes.
type outcomeReader interface {
	OutcomeHours(ctx context.Context, scope string, from, to int64) (map[int64]OutcomeRow, error)
}

// BuildOutcomes reads the roll-up of one scope (a gateway, a scene, or
// every mission when both are empty) for the range ending now, in UTC
// hours or days, oldest first, every bucket present.
func BuildOutcomes(ctx context.Context, st outcomeReader, gw, scene, rng, step string, now time.Time) (Outcomes, error) {
	r, ok := outcomeRanges[rng]
	if !ok {
		return Outcomes{}, fmt.Errorf("%w: range %q is not 24h, 7d or 30d", ErrInvalid, rng)
	}
	if step == "" {
		step = r.step
	}
	hours := int64(1)
	switch step {
	case "hour":
	case "day":
		hours = 24
	default:
		return Outcomes{}, fmt.Errorf("%w: step %q is not hour or day", ErrInvalid, step)
	}
	if gw != "" && scene != "" {
		return Outcomes{}, fmt.Errorf("%w: give a gateway or a scene, not both", ErrInvalid)
	}
	scope := scopeAll()
	switch {
	case gw != "":
		scope = scopeGateway(gw)
	case scene != "":
		scope = scopeScene(scene)
	}
	n := int64(r.span/time.Hour) / hours
	to := (now.Unix()/3600/hours + 1) * hours // the end of the current hour or day
	from := to - n*hours
	rows, err := st.OutcomeHours(ctx, scope, from, to)
	if err != nil {
		return Outcomes{}, err
	}
	out := Outcomes{Gateway: gw, Scene: scene, Range: rng, Step: step, Buckets: make([]OutcomeBucket, n)}
	sums := make([]OutcomeRow, n)
	var total OutcomeRow
	for h, row := range rows {
		i := (h - from) / hours
		for k := range row {
			sums[i][k] += row[k]
			total[k] += row[k]
		}
	}
	for i := range sums {
		out.Buckets[i] = bucketOf(sums[i], time.Unix((from+int64(i)*hours)*3600, 0).UTC())
	}
	out.Total = bucketOf(total, time.Unix(from*3600, 0).UTC())
	return out, nil
}

func bucketOf(r OutcomeRow, start time.Time) OutcomeBucket {
	b := OutcomeBucket{Start: start, Succeeded: r[oSucceeded], Failed: r[oFailed], Undone: r[oUndone], Cancelled: r[oCancelled], Superseded: r[oSuperseded]}
	b.Finished = b.Succeeded + b.Failed + b.Undone + b.Cancelled
	b.P50MS, b.P95MS = histQuantile(r, 0.50), histQuantile(r, 0.95)
	return b
}

// histQuantile reads the q-quantile of the durations off the histogram:
// the middle (geometric) of the bucket it falls in, in milliseconds.
func histQuantile(r OutcomeRow, q float64) float64 {
	var n int64
	for k := range histBuckets {
		n += max(0, r[oHist+k])
	}
	if n == 0 {
		return 0
	}
	want := int64(math.Ceil(q * float64(n)))
	var seen int64
	for k := range histBuckets {
		seen += max(0, r[oHist+k])
		if seen >= want {
			if k == 0 {
				return 1
			}
			return math.Round(math.Pow(2, (float64(k)+0.5)/2)*10) / 10
		}
	}
	return 0
}

// outcomes answers GET /api/outcomes?range=24h|7d|30d&gateway=|scene=&step=hour|day.
func (a *API) outcomes(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	rng := q.Get("range")
	if rng == "" {
		rng = "24h"
	}
	out, err := BuildOutcomes(r.Context(), a.st, q.Get("gateway"), q.Get("scene"), rng, q.Get("step"), time.Now())
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}
