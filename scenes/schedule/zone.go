package schedule

import (
	"math"
	"time"
)

// Times here are int64 Unix seconds. A "wall" value is a local date and
// clock reading encoded the same way, as if the zone were UTC: wall =
// instant + offset. Local day numbers are wall/86400, floored.

const secondsPerDay = 86400

// period is a stretch of instants [start, end) with one UTC offset.
type period struct {
	start, end, off int64
}

func (p period) wallStart() int64 {
	if p.start == math.MinInt64 {
		return math.MinInt64
	}
	return p.start + p.off
}

func (p period) wallEnd() int64 {
	if p.end == math.MaxInt64 {
		return math.MaxInt64
	}
	return p.end + p.off
}

// maxPeriods bounds the zone periods looked at around one day. Real
// zones change at most twice in three days; the bound only keeps a
// pathological zone from looping.
const maxPeriods = 8

// zoneMargin is more than any UTC offset the tz database has held (local
// mean times reach about 15h56m), so every instant whose wall clock reads
// a given day lies within a margin of that day.
const zoneMargin = 26 * 3600

// dayZone holds the zone periods covering every instant whose wall clock
// can read local day `day`, plus a margin on each side so a gap or an
// overlap at the edge of the day is seen whole.
type dayZone struct {
	p    [maxPeriods]period
	n    int
	wall int64 // wall value of 00:00 on the day
	loc  *time.Location
}

func (z *dayZone) load(loc *time.Location, day int64) {
	z.wall = day * secondsPerDay
	from, to := z.wall-zoneMargin, z.wall+secondsPerDay+zoneMargin
	if z.n == 1 && z.loc == loc && z.p[0].start <= from && z.p[0].end >= to {
		// Most days sit inside one long period; the next day usually
		// does too.
		return
	}
	z.loc = loc
	z.n = 0
	for x := from; z.n < maxPeriods; {
		p := periodAt(loc, x)
		z.p[z.n] = p
		z.n++
		if p.end >= to || p.end <= x {
			break
		}
		x = p.end
	}
}

// seed primes z with a period already looked up, which load reuses
// when it covers the day.
func (z *dayZone) seed(loc *time.Location, p period) {
	z.loc, z.p[0], z.n = loc, p, 1
}

func periodAt(loc *time.Location, x int64) period {
	t := time.Unix(x, 0).In(loc)
	_, off := t.Zone()
	s, e := t.ZoneBounds()
	p := period{start: math.MinInt64, end: math.MaxInt64, off: int64(off)}
	if !s.IsZero() {
		p.start = s.Unix()
	}
	if !e.IsZero() {
		p.end = e.Unix()
	}
	return p
}

// resolve maps a wall value to an instant under the fixed-time DST
// policy: the first instant showing that wall time, or, when the wall
// time is skipped by a forward jump, the first instant after the jump.
// Periods are in instant order, so the first period that contains its
// candidate instant holds the earliest occurrence.
func (z *dayZone) resolve(w int64) int64 {
	for i := 0; i < z.n; i++ {
		p := z.p[i]
		u := w - p.off
		if u >= p.start && u < p.end {
			return u
		}
		if i > 0 && w < p.wallStart() {
			return p.start
		}
	}
	return w - z.p[z.n-1].off
}

// offsetRange returns the smallest and largest offset in effect around
// the day.
func (z *dayZone) offsetRange() (lo, hi int64) {
	lo, hi = z.p[0].off, z.p[0].off
	for i := 1; i < z.n; i++ {
		lo = min(lo, z.p[i].off)
		hi = max(hi, z.p[i].off)
	}
	return lo, hi
}

// offsetAt returns the UTC offset in loc at instant x.
func offsetAt(loc *time.Location, x int64) int64 {
	_, off := time.Unix(x, 0).In(loc).Zone()
	return int64(off)
}

// localDay returns the local day number of instant x.
func localDay(loc *time.Location, x int64) int64 {
	return floorDiv(x+offsetAt(loc, x), secondsPerDay)
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// daysFromCivil returns the day number (days since 1970-01-01) of a
// proleptic Gregorian date. Out-of-range days and months normalize the
// way time.Date does. The era arithmetic follows H. Hinnant's published
// derivation.
func daysFromCivil(y int64, m, d int) int64 {
	// Normalize the month into 1..12 first.
	mm := int64(m) - 1
	y += floorDiv(mm, 12)
	mm = mm - floorDiv(mm, 12)*12 + 1
	if mm <= 2 {
		y--
	}
	era := floorDiv(y, 400)
	yoe := y - era*400
	mp := (mm + 9) % 12
	doy := (153*mp+2)/5 + int64(d) - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	return era*146097 + doe - 719468
}

// civilFromDays is the inverse of daysFromCivil.
func civilFromDays(z int64) (y int64, m, d int) {
	z += 719468
	era := floorDiv(z, 146097)
	doe := z - era*146097
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365
	doy := doe - (365*yoe + yoe/4 - yoe/100)
	mp := (5*doy + 2) / 153
	d = int(doy - (153*mp+2)/5 + 1)
	m = int(mp + 3)
	if m > 12 {
		m -= 12
	}
	y = yoe + era*400
	if m <= 2 {
		y++
	}
	return y, m, d
}

// weekday returns 0 for Sunday .. 6 for Saturday; day 0 was a Thursday.
func weekday(day int64) int {
	return int(((day+4)%7 + 7) % 7)
}
