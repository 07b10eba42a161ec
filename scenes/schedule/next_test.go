package schedule

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// dayMatches is the day rule written plainly, with time.Weekday instead
// of the per-month bit patterns Next uses.
func dayMatches(c *Cron, y int, m time.Month, d int) bool {
	if c.month&(1<<int(m)) == 0 {
		return false
	}
	wd := time.Date(y, m, d, 12, 0, 0, 0, time.UTC).Weekday()
	domOK := c.dom&(1<<d) != 0
	dowOK := c.dow&(1<<int(wd)) != 0
	if c.domStar || c.dowStar {
		return domOK && dowOK
	}
	return domOK || dowOK
}

// bruteNext is an independent reference for Cron.Next: it walks local
// dates one by one and, for each matching time of day, asks the time
// package where that wall time falls.
func bruteNext(c *Cron, from time.Time, loc *time.Location, horizonDays int) (time.Time, bool) {
	start := from.In(loc)
	y, m, d := start.Date()
	// A wall time w can only land after `from` if w > from + the
	// smallest offset around; skipping the others keeps dense
	// expressions cheap without changing the answer.
	// Likewise, once a candidate u is known, wall times past u + the
	// largest offset cannot beat it.
	minOff, maxOff := int64(1<<40), int64(-1<<40)
	for dx := int64(-48); dx <= 48; dx += 4 {
		_, off := time.Unix(from.Unix()+dx*3600, 0).In(loc).Zone()
		minOff, maxOff = min(minOff, int64(off)), max(maxOff, int64(off))
	}
	floor := from.Unix() + minOff
	var found int64
	ok, stop := false, horizonDays
	for i := -1; i <= stop; i++ {
		day := time.Date(y, m, d+i, 12, 0, 0, 0, time.UTC)
		dy, dm, dd := day.Date()
		if !dayMatches(c, dy, dm, dd) {
			continue
		}
		var cands []int64
		best := int64(1 << 62)
		dayMax := maxOff
		for _, dx := range []int64{-40 * 3600, 0, 40 * 3600} {
			_, off := time.Unix(day.Unix()+dx, 0).In(loc).Zone()
			dayMax = max(dayMax, int64(off))
		}
		for h := range 24 {
			if c.hour&(1<<h) == 0 {
				continue
			}
			for mi := range 60 {
				if c.minute&(1<<mi) == 0 {
					continue
				}
				w := time.Date(dy, dm, dd, h, mi, 0, 0, time.UTC).Unix()
				if w <= floor || w-dayMax > best {
					continue
				}
				if c.hourStar {
					// Every instant whose own wall clock reads h:mi.
					for _, dx := range []int64{-40 * 3600, 0, 40 * 3600} {
						_, off := time.Unix(w+dx, 0).In(loc).Zone()
						if u := w - int64(off); wallOf(loc, u) == w && !slices.Contains(cands, u) {
							cands = append(cands, u)
							if u > from.Unix() {
								best = min(best, u)
							}
						}
					}
					continue
				}
				u, _ := wantFixed(loc, dy, dm, dd, h, mi)
				cands = append(cands, u)
				if u > from.Unix() {
					best = min(best, u)
				}
			}
		}
		for _, u := range cands {
			if u > from.Unix() && (!ok || u < found) {
				found, ok = u, true
			}
		}
		if ok && stop == horizonDays {
			// A clock going back across midnight can put the next day's
			// first firings before this day's last ones: look one day on.
			stop = i + 1
		}
	}
	return time.Unix(found, 0), ok
}

// randomField builds a random but valid field for spec f.
func randomField(r *rand.Rand, f fieldSpec) string {
	hi := f.max
	if f.name == "day-of-week" {
		hi = 7
	}
	val := func() int { return f.min + r.IntN(hi-f.min+1) }
	var items []string
	for range 1 + r.IntN(3) {
		switch r.IntN(6) {
		case 0:
			return "*"
		case 1:
			items = append(items, fmt.Sprintf("*/%d", 1+r.IntN(f.max)))
		case 2, 3:
			items = append(items, fmt.Sprint(val()))
		case 4:
			a, b := val(), val()
			items = append(items, fmt.Sprintf("%d-%d", min(a, b), max(a, b)))
		default:
			a, b := val(), val()
			items = append(items, fmt.Sprintf("%d-%d/%d", min(a, b), max(a, b), 1+r.IntN(f.max)))
		}
	}
	return strings.Join(items, ",")
}

var bruteZones = []string{
	"UTC", "Europe/Berlin", "America/New_York", "Australia/Sydney", "America/Santiago",
	"America/Havana", "Asia/Beirut", "Australia/Lord_Howe", "Pacific/Apia", "Asia/Kathmandu",
	"America/St_Johns", // until 2011 it fell back at 00:01, to 23:01 the day before
}

// TestCronNextMatchesBruteForce compares Next with bruteNext for random
// expressions, zones and starting instants (not just previous firings),
// including days around DST changes.
func TestCronNextMatchesBruteForce(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 7))
	var locs []*time.Location
	for _, z := range bruteZones {
		locs = append(locs, mustLoad(t, z))
	}
	// Starting points: random instants, and instants near the
	// transitions where bugs live.
	span := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).Unix() - time.Date(2010, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	base := time.Date(2010, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	const trials = 3000
	for i := range trials {
		var parts [5]string
		for j, f := range cronFields {
			parts[j] = randomField(r, f)
		}
		// Keep the day fields loose enough that the reference finds a
		// firing within its horizon.
		if r.IntN(2) == 0 {
			parts[2], parts[3] = "*", "*"
		}
		expr := strings.Join(parts[:], " ")
		c, err := ParseCron(expr)
		if err != nil {
			continue // e.g. "31 2 *"-style dates that never occur
		}
		loc := locs[r.IntN(len(locs))]
		from := time.Unix(base+r.Int64N(span), int64(r.IntN(2))*r.Int64N(1e9))
		if r.IntN(3) == 0 {
			// Jump to a few hours before a transition.
			if _, end := from.In(loc).ZoneBounds(); !end.IsZero() {
				from = end.Add(-time.Duration(r.IntN(30*3600)) * time.Second)
			}
		}
		cur := from
		for step := range 3 {
			got := c.Next(cur, loc)
			want, ok := bruteNext(c, cur, loc, 800)
			if !ok {
				break // beyond the reference's horizon
			}
			if !got.Equal(want) {
				t.Fatalf("trial %d (seed %d) %q in %v, step %d: Next(%v) = %v, want %v",
					i, seed, expr, loc, step, cur.In(loc), got, want.In(loc))
			}
			cur = got
		}
	}
}
