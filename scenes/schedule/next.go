package schedule

import "time"

// searchDays bounds the search for a matching day: the Gregorian
// calendar repeats every 400 years (146097 days), so a day pattern that
// has not matched by then never will.
const searchDays = 146097 + 366

// maxUnix keeps the day arithmetic far from int64 overflow; it is about
// a billion years either side of 1970.
const maxUnix = 1 << 55

// Next returns the first firing strictly after t, reading the expression
// as wall-clock time in loc (nil means UTC). It returns the zero Time
// when there is none within 400 years of t, which only happens for t
// near the ends of time. The result is in loc.
//
// Around DST changes it follows the policy in the package
// documentation.
func (c *Cron) Next(t time.Time, loc *time.Location) time.Time {
	if c == nil {
		return time.Time{}
	}
	if loc == nil {
		loc = time.UTC
	}
	ts := t.Unix()
	if ts > maxUnix || ts < -maxUnix {
		return time.Time{}
	}
	var z dayZone
	p := periodAt(loc, ts)
	day := floorDiv(ts+p.off, secondsPerDay)
	z.seed(loc, p)
	z.load(loc, day)
	if z.n > 1 {
		// The clock changes within a day of today. A time skipped at the
		// end of yesterday fires at a jump that can fall today, and a
		// clock going back across midnight repeats part of yesterday
		// after t: start a day early.
		day--
	}
	limit := day + searchDays
	best, found := int64(0), false
	for day < limit {
		var ok bool
		if day, ok = c.nextDay(day, limit); !ok {
			break
		}
		z.load(loc, day)
		if found {
			// Firings are in day order except where a clock goes back
			// across midnight; once a day can only start after the best
			// firing so far, no later day can beat it.
			if _, hi := z.offsetRange(); z.wall-hi >= best {
				break
			}
		}
		if u, ok := c.fireOnDay(&z, ts); ok {
			if !found || u < best {
				best, found = u, true
			}
			if z.n == 1 {
				// One offset from a day before to a day after: nothing
				// later can come first.
				break
			}
			limit = min(limit, floorDiv(best+zoneMargin, secondsPerDay)+1)
		}
		day++
	}
	if !found {
		return time.Time{}
	}
	return time.Unix(best, 0).In(loc)
}

// nextDay returns the first day number >= day whose date matches the
// month and day fields, or false if there is none before limit. It walks
// month by month, turning each month into a bit mask of matching days.
func (c *Cron) nextDay(day, limit int64) (int64, bool) {
	y, m, d := civilFromDays(day)
	for {
		first := daysFromCivil(y, m, 1)
		if first >= limit {
			return 0, false
		}
		if c.month&(1<<m) != 0 {
			if dd := next(c.daysOf(y, m, first), d); dd > 0 {
				return first + int64(dd-1), true
			}
		}
		m, d = m+1, 1
		if m > 12 {
			y, m = y+1, 1
		}
	}
}

// daysOf returns the bit mask (bits 1..31) of the days of month m of
// year y that match the day-of-month and day-of-week fields.
func (c *Cron) daysOf(y int64, m int, first int64) uint64 {
	valid := dayBits(daysIn(y, m))
	dom := c.dom & valid
	dow := c.dowDays[weekday(first)] & valid
	if c.domStar || c.dowStar {
		return dom & dow
	}
	return dom | dow
}

// fireOnDay returns the first firing on the loaded day that is after
// instant ts.
func (c *Cron) fireOnDay(z *dayZone, ts int64) (int64, bool) {
	if c.hourStar {
		return c.elapsedOnDay(z, ts)
	}
	// Resolved instants never decrease as the wall time grows, so the
	// first wall time that resolves after ts is the answer. No wall time
	// before ts+lo+1 can resolve after ts.
	lo, _ := z.offsetRange()
	from := max(ts+lo+1-z.wall, 0)
	for from < secondsPerDay {
		s := c.nextTimeOfDay(from)
		if s < 0 {
			return 0, false
		}
		if u := z.resolve(z.wall + s); u > ts {
			return u, true
		}
		from = s + 1
	}
	return 0, false
}

// elapsedOnDay handles a '*' hour field: the schedule fires at every
// instant whose own wall clock matches, so a repeated hour fires twice
// and a skipped hour not at all.
func (c *Cron) elapsedOnDay(z *dayZone, ts int64) (int64, bool) {
	dayEnd := z.wall + secondsPerDay
	for i := 0; i < z.n; i++ {
		p := z.p[i]
		lo := max(z.wall, p.wallStart(), ts+p.off+1)
		hi := min(dayEnd, p.wallEnd())
		if lo >= hi {
			continue
		}
		s := c.nextTimeOfDay(lo - z.wall)
		if s >= 0 && z.wall+s < hi {
			return z.wall + s - p.off, true
		}
	}
	return 0, false
}

// nextTimeOfDay returns the first second of the day at or after from
// (0 <= from) that is a whole minute matching the hour and minute
// fields, or -1.
func (c *Cron) nextTimeOfDay(from int64) int64 {
	mins := (from + 59) / 60
	h, mi := int(mins/60), int(mins%60)
	for h < 24 {
		nh := next(c.hour, h)
		if nh < 0 || nh > 23 {
			return -1
		}
		if nh != h {
			h, mi = nh, 0
		}
		if mm := next(c.minute, mi); mm >= 0 && mm < 60 {
			return int64(h)*3600 + int64(mm)*60
		}
		h, mi = h+1, 0
	}
	return -1
}
