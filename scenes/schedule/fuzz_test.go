package schedule

import (
	"errors"
	"testing"
	"time"
)

// wallMatches reports whether instant u's own wall clock in loc matches
// every field of c.
func wallMatches(c *Cron, loc *time.Location, u time.Time) bool {
	l := u.In(loc)
	y, m, d := l.Date()
	return l.Second() == 0 && c.minute&(1<<l.Minute()) != 0 && c.hour&(1<<l.Hour()) != 0 && dayMatches(c, y, m, d)
}

// isForwardJump reports whether the clock in loc jumps forward at u.
func isForwardJump(loc *time.Location, u time.Time) bool {
	_, before := u.Add(-time.Second).In(loc).Zone()
	_, after := u.In(loc).Zone()
	return after > before
}

var fuzzZones = []string{"UTC", "Europe/Berlin", "America/New_York", "America/Santiago", "Australia/Lord_Howe", "Asia/Kathmandu", "America/St_Johns"}

func FuzzParseCron(f *testing.F) {
	for _, s := range []string{
		"* * * * *", "*/15 * * * *", "0 7 * * 1-5", "30 2 * * *", "0,30 2 * * *",
		"0 0 29 2 *", "0 0 13 * 5", "10-50/10 */3 1,15 jan-jun mon-fri", "@hourly", "@yearly",
		"0 0 30 2 *", "*/0 * * * *", "5-1 * * * *", "1,,2 * * * *", "0 0 * * 7",
	} {
		f.Add(s, int64(0), uint8(1))
	}
	// at counts seconds from 2000-01-01 UTC.
	f.Add("45 1 * * *", int64(828579600), uint8(4))   // Lord Howe, the day 01:30-02:00 repeats
	f.Add("0 0 * * *", int64(841939200), uint8(3))    // Santiago, the day 00:00 is skipped
	f.Add("6-23 6 * * *", int64(427422876), uint8(0)) // a start hour before the field's, minute after it
	f.Add("*/15 * * * *", int64(342411600), uint8(6)) // St. John's going back from Sunday to Saturday
	zones := make([]*time.Location, len(fuzzZones))
	for i, z := range fuzzZones {
		zones[i] = mustLoad(f, z)
	}
	lo := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	hi := time.Date(2040, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	f.Fuzz(func(t *testing.T, expr string, at int64, zone uint8) {
		c, err := ParseCron(expr)
		if err != nil {
			if !errors.Is(err, ErrInvalidCron) {
				t.Fatalf("error %v does not wrap ErrInvalidCron", err)
			}
			return
		}
		again, err := ParseCron(c.String())
		if err != nil || !sameSchedule(c, again) || again.String() != c.String() {
			t.Fatalf("String() %q does not reparse to the same schedule (err %v)", c.String(), err)
		}
		loc := zones[int(zone)%len(zones)]
		if at < 0 {
			at = -(at + 1)
		}
		cur := time.Unix(lo+at%(hi-lo), 0)
		for range 4 {
			next := c.Next(cur, loc)
			if next.IsZero() {
				t.Fatalf("%q: Next(%v) = zero", expr, cur)
			}
			if !next.After(cur) {
				t.Fatalf("%q: Next(%v) = %v, not after", expr, cur, next)
			}
			if !wallMatches(c, loc, next) && (c.hourStar || !isForwardJump(loc, next)) {
				t.Fatalf("%q: Next(%v) = %v matches neither the fields nor a DST jump", expr, cur.In(loc), next.In(loc))
			}
			if again := c.Next(next.Add(-time.Nanosecond), loc); !again.Equal(next) {
				t.Fatalf("%q: Next just before %v = %v", expr, next, again)
			}
			if want, ok := bruteNext(c, cur, loc, 400); ok && !want.Equal(next) {
				t.Fatalf("%q: Next(%v) = %v, reference says %v", expr, cur.In(loc), next.In(loc), want.In(loc))
			}
			cur = next
		}
	})
}
