package schedule

import (
	"fmt"
	"slices"
	"testing"
	"time"
	_ "time/tzdata" // the same zone rules on every machine
)

// The oracle below decides what a fixed-time schedule should do from the
// time package alone, independently of the period walk in zone.go.

// wallOf returns instant u's local date and clock in loc, encoded as if
// in UTC.
func wallOf(loc *time.Location, u int64) int64 {
	t := time.Unix(u, 0).In(loc)
	y, m, d := t.Date()
	h, mi, s := t.Clock()
	return time.Date(y, m, d, h, mi, s, 0, time.UTC).Unix()
}

// wantFixed returns where a fixed-time schedule for wall time h:m on
// y-mo-d must fire in loc: the first instant that shows that time, or,
// when the time is skipped, the first instant after the jump. kind says
// which.
func wantFixed(loc *time.Location, y int, mo time.Month, d, h, m int) (u int64, kind string) {
	w := time.Date(y, mo, d, h, m, 0, 0, time.UTC).Unix()
	var offs []int64
	for _, x := range []int64{w - 40*3600, w - 14*3600, w, w + 14*3600, w + 40*3600} {
		_, off := time.Unix(x, 0).In(loc).Zone()
		offs = append(offs, int64(off))
	}
	var hits []int64
	for _, off := range offs {
		if u := w - off; wallOf(loc, u) == w && !slices.Contains(hits, u) {
			hits = append(hits, u)
		}
	}
	switch len(hits) {
	case 1:
		return hits[0], "exists"
	case 2:
		return min(hits[0], hits[1]), "repeated"
	}
	// Skipped: the jump is the first instant whose wall clock has passed
	// w. Transitions fall on whole minutes in these zones.
	lo, hi := w-slices.Max(offs), w-slices.Min(offs)
	for u := lo - lo%60; u <= hi; u += 60 {
		if wallOf(loc, u) >= w {
			return u, "skipped"
		}
	}
	panic(fmt.Sprintf("no instant for %d-%02d-%02d %02d:%02d in %v", y, mo, d, h, m, loc))
}

// dayKey is a local date, comparable.
type dayKey struct {
	y int
	m time.Month
	d int
}

func (k dayKey) String() string { return fmt.Sprintf("%d-%02d-%02d", k.y, k.m, k.d) }

func keyOf(t time.Time) dayKey {
	y, m, d := t.Date()
	return dayKey{y, m, d}
}

// firings runs Next from just before local midnight of `from` until
// `to`, checking that every firing is strictly later than the last.
func firings(t *testing.T, c *Cron, loc *time.Location, from, to time.Time) []time.Time {
	t.Helper()
	var out []time.Time
	cur := from.Add(-time.Second)
	for {
		next := c.Next(cur, loc)
		if next.IsZero() {
			t.Fatalf("Next(%v) = zero", cur)
		}
		if !next.After(cur) {
			t.Fatalf("Next(%v) = %v, not after", cur, next)
		}
		if !next.Before(to) {
			return out
		}
		out = append(out, next)
		cur = next
	}
}

// checkOncePerDay asserts that a daily h:m schedule fires exactly once
// on each local date in [from, to) (only Monday to Friday when
// weekdays), where the oracle says.
func checkOncePerDay(t *testing.T, loc *time.Location, expr string, h, m int, weekdays bool, from, to time.Time) map[string]int {
	t.Helper()
	c, err := ParseCron(expr)
	if err != nil {
		t.Fatal(err)
	}
	byDay := map[dayKey]time.Time{}
	for _, f := range firings(t, c, loc, from, to) {
		k := keyOf(f.In(loc))
		if prev, dup := byDay[k]; dup {
			t.Fatalf("%s fired twice on %v: %v and %v", expr, k, prev, f)
		}
		byDay[k] = f
	}
	kinds := map[string]int{}
	for day := from; day.Before(to); day = day.AddDate(0, 0, 1) {
		k := keyOf(day)
		got, ok := byDay[k]
		if weekdays && (day.Weekday() == time.Saturday || day.Weekday() == time.Sunday) {
			if ok {
				t.Errorf("%s fired on weekend day %v at %v", expr, k, got)
			}
			continue
		}
		want, kind := wantFixed(loc, k.y, k.m, k.d, h, m)
		kinds[kind]++
		if !ok {
			t.Errorf("%s did not fire on %v (want %v, %s)", expr, k, time.Unix(want, 0).In(loc), kind)
			continue
		}
		if got.Unix() != want {
			t.Errorf("%s on %v fired at %v, want %v (%s)", expr, k, got, time.Unix(want, 0).In(loc), kind)
		}
	}
	return kinds
}

var dstZones = []string{"Europe/Berlin", "America/New_York", "Australia/Sydney"}

// TestDailyScheduleFiresOncePerLocalDayForTenYears is the DST property:
// every daily schedule fires exactly once per local date, at its time
// when that exists, at the jump when it is skipped and at the first
// occurrence when it repeats.
func TestDailyScheduleFiresOncePerLocalDayForTenYears(t *testing.T) {
	schedules := []struct {
		expr     string
		h, m     int
		weekdays bool
	}{
		{"0 0 * * *", 0, 0, false},
		{"30 1 * * *", 1, 30, false},
		{"0 2 * * *", 2, 0, false},
		{"30 2 * * *", 2, 30, false},
		{"59 2 * * *", 2, 59, false},
		{"0 3 * * *", 3, 0, false},
		{"0 12 * * *", 12, 0, false},
		{"59 23 * * *", 23, 59, false},
		{"0 7 * * 1-5", 7, 0, true},
	}
	for _, zone := range dstZones {
		loc := mustLoad(t, zone)
		from := time.Date(2026, 1, 1, 0, 0, 0, 0, loc)
		to := time.Date(2036, 1, 1, 0, 0, 0, 0, loc)
		seen := map[string]int{}
		for _, s := range schedules {
			t.Run(zone+"/"+s.expr, func(t *testing.T) {
				for k, n := range checkOncePerDay(t, loc, s.expr, s.h, s.m, s.weekdays, from, to) {
					seen[k] += n
				}
			})
		}
		// The range must actually exercise both DST cases.
		if seen["skipped"] == 0 || seen["repeated"] == 0 {
			t.Errorf("%s: no skipped or repeated times seen: %v", zone, seen)
		}
	}
}

// TestGapTimesOnOneDayFireOnceTogetherAtTheJump pins "0,30 2 * * *" on a
// spring-forward day: both times are skipped and fire as one, then
// the next real time follows.
func TestGapTimesOnOneDayFireOnceTogetherAtTheJump(t *testing.T) {
	ber := mustLoad(t, "Europe/Berlin")
	c, _ := ParseCron("0,30 2 * * *")
	cur := time.Date(2026, 3, 28, 12, 0, 0, 0, ber)
	want := []time.Time{
		time.Date(2026, 3, 29, 1, 0, 0, 0, time.UTC), // 03:00 CEST, the jump
		time.Date(2026, 3, 30, 0, 0, 0, 0, time.UTC), // 02:00 CEST
		time.Date(2026, 3, 30, 0, 30, 0, 0, time.UTC),
	}
	for _, w := range want {
		cur = c.Next(cur, ber)
		if !cur.Equal(w) {
			t.Fatalf("Next = %v, want %v", cur, w.In(ber))
		}
	}
}

// TestRepeatedTimeFiresAtFirstOccurrenceOnly pins fall-back days in
// Berlin and New York: Next from the first occurrence skips the second.
func TestRepeatedTimeFiresAtFirstOccurrenceOnly(t *testing.T) {
	for _, c := range []struct {
		zone, expr string
		first      time.Time // UTC
		next       time.Time
	}{
		{"Europe/Berlin", "30 2 * * *", time.Date(2026, 10, 25, 0, 30, 0, 0, time.UTC), time.Date(2026, 10, 26, 1, 30, 0, 0, time.UTC)},
		{"America/New_York", "30 1 * * *", time.Date(2026, 11, 1, 5, 30, 0, 0, time.UTC), time.Date(2026, 11, 2, 6, 30, 0, 0, time.UTC)},
	} {
		t.Run(c.zone, func(t *testing.T) {
			loc := mustLoad(t, c.zone)
			cr, _ := ParseCron(c.expr)
			got := cr.Next(c.first.Add(-time.Hour), loc)
			if !got.Equal(c.first) {
				t.Fatalf("Next = %v, want %v", got, c.first.In(loc))
			}
			// From between the two occurrences, the second is skipped too.
			for _, from := range []time.Time{got, got.Add(30 * time.Minute), got.Add(time.Hour)} {
				if n := cr.Next(from, loc); !n.Equal(c.next) {
					t.Errorf("Next(%v) = %v, want %v", from.In(loc), n, c.next.In(loc))
				}
			}
		})
	}
}

// TestHourlyScheduleFollowsElapsedTime pins the hour-wildcard rule over
// ten years: "0 * * * *" fires on every real hour boundary, 23 times on
// a spring-forward day, 25 on a fall-back day, 24 otherwise, and
// "*/15 * * * *" every 15 real minutes, never stopping or doubling.
func TestHourlyScheduleFollowsElapsedTime(t *testing.T) {
	hourly, _ := ParseCron("0 * * * *")
	quarter, _ := ParseCron("*/15 * * * *")
	for _, zone := range dstZones {
		loc := mustLoad(t, zone)
		from := time.Date(2026, 1, 1, 0, 0, 0, 0, loc)
		to := time.Date(2036, 1, 1, 0, 0, 0, 0, loc)
		t.Run(zone+"/0 * * * *", func(t *testing.T) {
			perDay := map[dayKey]int{}
			var prev time.Time
			for _, f := range firings(t, hourly, loc, from, to) {
				if f.Unix()%3600 != 0 {
					t.Fatalf("fired at %v, not on an hour boundary", f)
				}
				if !prev.IsZero() && f.Sub(prev) != time.Hour {
					t.Fatalf("fired at %v after %v", f, prev)
				}
				prev = f
				perDay[keyOf(f.In(loc))]++
			}
			counts := map[int]int{}
			for day := from; day.Before(to); day = day.AddDate(0, 0, 1) {
				y, m, d := day.Date()
				length := time.Date(y, m, d+1, 0, 0, 0, 0, loc).Sub(time.Date(y, m, d, 0, 0, 0, 0, loc))
				want := int(length / time.Hour)
				if got := perDay[keyOf(day)]; got != want {
					t.Errorf("%v (%v long): %d firings, want %d", keyOf(day), length, got, want)
				}
				counts[want]++
			}
			if counts[23] != 10 || counts[25] != 10 {
				t.Errorf("day lengths seen %v, want ten 23h and ten 25h days", counts)
			}
		})
		t.Run(zone+"/*/15 * * * *", func(t *testing.T) {
			fs := firings(t, quarter, loc, from, to)
			for i := 1; i < len(fs); i++ {
				if d := fs[i].Sub(fs[i-1]); d != 15*time.Minute {
					t.Fatalf("fired at %v then %v (%v apart)", fs[i-1], fs[i], d)
				}
			}
			if want := int(to.Sub(from) / (15 * time.Minute)); len(fs) != want {
				t.Errorf("%d firings, want %d", len(fs), want)
			}
		})
	}
}
