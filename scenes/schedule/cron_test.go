package schedule

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// bitsOf lists the set bits of m, for readable failures.
func bitsOf(m uint64) []int {
	var out []int
	for i := range 64 {
		if m&(1<<i) != 0 {
			out = append(out, i)
		}
	}
	return out
}

func maskOf(vals ...int) uint64 {
	var m uint64
	for _, v := range vals {
		m |= 1 << v
	}
	return m
}

func rangeMask(lo, hi, step int) uint64 {
	var m uint64
	for v := lo; v <= hi; v += step {
		m |= 1 << v
	}
	return m
}

// sameSchedule reports whether two parsed expressions fire identically.
func sameSchedule(a, b *Cron) bool {
	return a.minute == b.minute && a.hour == b.hour && a.dom == b.dom &&
		a.month == b.month && a.dow == b.dow && a.domStar == b.domStar &&
		a.dowStar == b.dowStar && a.hourStar == b.hourStar
}

func TestParseCronAcceptsStandardSyntax(t *testing.T) {
	all := func(lo, hi int) uint64 { return rangeMask(lo, hi, 1) }
	cases := []struct {
		expr                          string
		minute, hour, dom, month, dow uint64
		domStar, dowStar, hourStar    bool
		str                           string
	}{
		{"* * * * *", all(0, 59), all(0, 23), all(1, 31), all(1, 12), all(0, 6), true, true, true, "* * * * *"},
		{"*/15 * * * *", rangeMask(0, 59, 15), all(0, 23), all(1, 31), all(1, 12), all(0, 6), true, true, true, ""},
		{"0 7 * * 1-5", maskOf(0), maskOf(7), all(1, 31), all(1, 12), all(1, 5), true, false, false, ""},
		{"10-50/10 2 * * *", maskOf(10, 20, 30, 40, 50), maskOf(2), all(1, 31), all(1, 12), all(0, 6), true, true, false, ""},
		{"0 0 1,15 * *", maskOf(0), maskOf(0), maskOf(1, 15), all(1, 12), all(0, 6), false, true, false, ""},
		{"0 0 * JAN,jul-Sep *", maskOf(0), maskOf(0), all(1, 31), maskOf(1, 7, 8, 9), all(0, 6), true, true, false, "0 0 * jan,jul-sep *"},
		{"0 0 * * Mon-FRI", maskOf(0), maskOf(0), all(1, 31), all(1, 12), all(1, 5), true, false, false, "0 0 * * mon-fri"},
		{"0 0 * * 7", maskOf(0), maskOf(0), all(1, 31), all(1, 12), maskOf(0), true, false, false, ""},
		{"0 0 * * 5-7", maskOf(0), maskOf(0), all(1, 31), all(1, 12), maskOf(0, 5, 6), true, false, false, ""},
		{"0 0 * * sun,sat", maskOf(0), maskOf(0), all(1, 31), all(1, 12), maskOf(0, 6), true, false, false, ""},
		{"0 0 */2 * *", maskOf(0), maskOf(0), rangeMask(1, 31, 2), all(1, 12), all(0, 6), true, true, false, ""},
		{"0 0 1 * 1", maskOf(0), maskOf(0), maskOf(1), all(1, 12), maskOf(1), false, false, false, ""},
		{"05 04 * * *", maskOf(5), maskOf(4), all(1, 31), all(1, 12), all(0, 6), true, true, false, ""},
		{"  0\t12  *  *   * ", maskOf(0), maskOf(12), all(1, 31), all(1, 12), all(0, 6), true, true, false, "0 12 * * *"},
		{"0 0 29 2 *", maskOf(0), maskOf(0), maskOf(29), maskOf(2), all(0, 6), false, true, false, ""},
		{"0 0 31 1-12 *", maskOf(0), maskOf(0), maskOf(31), all(1, 12), all(0, 6), false, true, false, ""},
		{"0 0 30 2 1", maskOf(0), maskOf(0), maskOf(30), maskOf(2), maskOf(1), false, false, false, ""},
		{"@yearly", maskOf(0), maskOf(0), maskOf(1), maskOf(1), all(0, 6), false, true, false, ""},
		{"@annually", maskOf(0), maskOf(0), maskOf(1), maskOf(1), all(0, 6), false, true, false, ""},
		{"@monthly", maskOf(0), maskOf(0), maskOf(1), all(1, 12), all(0, 6), false, true, false, ""},
		{"@weekly", maskOf(0), maskOf(0), all(1, 31), all(1, 12), maskOf(0), true, false, false, ""},
		{"@DAILY", maskOf(0), maskOf(0), all(1, 31), all(1, 12), all(0, 6), true, true, false, "@daily"},
		{"@midnight", maskOf(0), maskOf(0), all(1, 31), all(1, 12), all(0, 6), true, true, false, ""},
		{"@hourly", maskOf(0), all(0, 23), all(1, 31), all(1, 12), all(0, 6), true, true, true, ""},
	}
	for _, c := range cases {
		t.Run(c.expr, func(t *testing.T) {
			got, err := ParseCron(c.expr)
			if err != nil {
				t.Fatalf("ParseCron: %v", err)
			}
			check := func(name string, got, want uint64) {
				if got != want {
					t.Errorf("%s = %v, want %v", name, bitsOf(got), bitsOf(want))
				}
			}
			check("minute", got.minute, c.minute)
			check("hour", got.hour, c.hour)
			check("day-of-month", got.dom, c.dom)
			check("month", got.month, c.month)
			check("day-of-week", got.dow, c.dow)
			if got.domStar != c.domStar || got.dowStar != c.dowStar || got.hourStar != c.hourStar {
				t.Errorf("stars dom/dow/hour = %v/%v/%v, want %v/%v/%v", got.domStar, got.dowStar, got.hourStar, c.domStar, c.dowStar, c.hourStar)
			}
			want := c.str
			if want == "" {
				want = c.expr
			}
			if got.String() != want {
				t.Errorf("String() = %q, want %q", got.String(), want)
			}
			again, err := ParseCron(got.String())
			if err != nil || !sameSchedule(got, again) {
				t.Errorf("String() %q does not reparse to the same schedule: %v", got.String(), err)
			}
		})
	}
}

func TestParseCronRejectsWithFieldAndToken(t *testing.T) {
	cases := []struct {
		expr, field, token, msg string
	}{
		{"", "", "", "empty"},
		{"   ", "", "", "empty"},
		{"* * * *", "", "", "want 5 fields"},
		{"0 * * * * *", "", "", "seconds field is not supported"},
		{"0 0 * * * * *", "", "", "got 7"},
		{"60 * * * *", "minute", "60", "out of range 0-59"},
		{"* 24 * * *", "hour", "24", "out of range 0-23"},
		{"* * 0 * *", "day-of-month", "0", "out of range 1-31"},
		{"* * 32 * *", "day-of-month", "32", "out of range 1-31"},
		{"* * * 13 *", "month", "13", "out of range 1-12"},
		{"* * * 0 *", "month", "0", "out of range 1-12"},
		{"* * * * 8", "day-of-week", "8", "out of range 0-7"},
		{"*/0 * * * *", "minute", "*/0", "step"},
		{"*/60 * * * *", "minute", "*/60", "step must be between 1 and 59"},
		{"1-10/0 * * * *", "minute", "1-10/0", "step"},
		{"*/x * * * *", "minute", "*/x", "not a number"},
		{"*/5/2 * * * *", "minute", "*/5/2", "not a number"},
		{"5/15 * * * *", "minute", "5/15", "needs a range"},
		{"1,,2 * * * *", "minute", "1,,2", "empty list item"},
		{",1 * * * *", "minute", ",1", "empty list item"},
		{"1, * * * *", "minute", "1,", "empty list item"},
		{"5-1 * * * *", "minute", "5-1", "reversed"},
		{"* * * * sat-sun", "day-of-week", "sat-sun", "reversed"},
		{"* * * dec-jan *", "month", "dec-jan", "reversed"},
		{"-5 * * * *", "minute", "-5", "missing value"},
		{"5- * * * *", "minute", "5-", "missing value"},
		{"1-2-3 * * * *", "minute", "1-2-3", "not a number"},
		{"*-5 * * * *", "minute", "*-5", "not a number"},
		{"+5 * * * *", "minute", "+5", "not a number"},
		{"0x1 * * * *", "minute", "0x1", "not a number"},
		{"99999999999999999999 * * * *", "minute", "99999999999999999999", "out of range"},
		{"jan * * * *", "minute", "jan", "not a number"},
		{"* * * mon *", "month", "mon", "jan..dec"},
		{"* * * * jan", "day-of-week", "jan", "sun..sat"},
		{"* * * * monday", "day-of-week", "monday", "sun..sat"},
		{"0 0 30 2 *", "day-of-month", "30", "never matches"},
		{"0 0 31 4,6,9,11 *", "day-of-month", "31", "never matches"},
		{"0 0 30,31 feb *", "day-of-month", "30,31", "never matches"},
		{"0 0 31 4 */7", "day-of-month", "31", "never matches"},
		{"@reboot", "", "@reboot", "unknown macro"},
		{"@daily 5", "", "@daily 5", "unknown macro"},
		{"0 0 * * \xff", "", "", "UTF-8"},
		{"0 0 * * mön", "day-of-week", "mön", "sun..sat"},
		{strings.Repeat("1,", 200) + "1 * * * *", "", "", "longer than 256 bytes"},
	}
	for _, c := range cases {
		t.Run(c.expr, func(t *testing.T) {
			got, err := ParseCron(c.expr)
			if err == nil {
				t.Fatalf("ParseCron(%q) = %v, want an error", c.expr, got)
			}
			if !errors.Is(err, ErrInvalidCron) {
				t.Errorf("error %v does not wrap ErrInvalidCron", err)
			}
			var ce *CronError
			if !errors.As(err, &ce) {
				t.Fatalf("error %T is not a *CronError", err)
			}
			if ce.Field != c.field || ce.Token != c.token {
				t.Errorf("field, token = %q, %q; want %q, %q", ce.Field, ce.Token, c.field, c.token)
			}
			if !strings.Contains(err.Error(), c.msg) {
				t.Errorf("error %q does not mention %q", err, c.msg)
			}
			if c.field != "" && !strings.Contains(err.Error(), c.field) {
				t.Errorf("error %q does not name the field %q", err, c.field)
			}
			if len(err.Error()) > 2*MaxCronLen {
				t.Errorf("error message is %d bytes long", len(err.Error()))
			}
		})
	}
}

func TestCronNextFollowsFieldsAndVixieDayRule(t *testing.T) {
	at := func(s string) time.Time {
		tt, err := time.Parse("2006-01-02 15:04", s)
		if err != nil {
			t.Fatal(err)
		}
		return tt
	}
	cases := []struct {
		expr, from string
		want       []string
	}{
		{"*/15 * * * *", "2026-01-01 00:00", []string{"2026-01-01 00:15", "2026-01-01 00:30"}},
		{"0 7 * * 1-5", "2026-01-02 07:00", []string{"2026-01-05 07:00", "2026-01-06 07:00"}}, // Fri -> Mon
		{"30 23 31 * *", "2026-01-31 23:30", []string{"2026-03-31 23:30", "2026-05-31 23:30"}},
		{"0 0 29 2 *", "2026-01-01 00:00", []string{"2028-02-29 00:00", "2032-02-29 00:00"}},
		// Both day fields restricted: the 13th OR a Friday.
		{"0 0 13 * 5", "2026-03-01 00:00", []string{"2026-03-06 00:00", "2026-03-13 00:00", "2026-03-20 00:00"}},
		// Day-of-week starts with '*': the 13th AND an even weekday.
		{"0 0 13 * */2", "2026-01-01 00:00", []string{"2026-01-13 00:00", "2026-06-13 00:00"}},
		{"0 0 29 2 */7", "2026-01-01 00:00", []string{"2032-02-29 00:00", "2060-02-29 00:00"}},
		{"59 23 31 12 *", "2026-12-31 23:59", []string{"2027-12-31 23:59"}},
		{"@yearly", "2026-06-15 12:00", []string{"2027-01-01 00:00"}},
		{"@weekly", "2026-01-01 00:00", []string{"2026-01-04 00:00"}},
		{"0 12 * * sun", "2026-01-04 11:59", []string{"2026-01-04 12:00", "2026-01-11 12:00"}},
	}
	for _, c := range cases {
		t.Run(c.expr+" from "+c.from, func(t *testing.T) {
			cr, err := ParseCron(c.expr)
			if err != nil {
				t.Fatal(err)
			}
			cur := at(c.from)
			for _, w := range c.want {
				cur = cr.Next(cur, nil)
				if !cur.Equal(at(w)) {
					t.Fatalf("Next = %v, want %s", cur, w)
				}
			}
		})
	}
}

func TestCronNextIsStrictlyAfterSubSecondTimes(t *testing.T) {
	cr, _ := ParseCron("* * * * *")
	base := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		from time.Time
		want time.Time
	}{
		{base, base.Add(time.Minute)},
		{base.Add(-time.Nanosecond), base},
		{base.Add(time.Nanosecond), base.Add(time.Minute)},
		{time.Date(1969, 12, 31, 23, 59, 59, 500, time.UTC), time.Unix(0, 0).UTC()},
	} {
		if got := cr.Next(c.from, time.UTC); !got.Equal(c.want) {
			t.Errorf("Next(%v) = %v, want %v", c.from, got, c.want)
		}
	}
}

func TestCronNextGivesZeroAtTheEndsOfTime(t *testing.T) {
	cr, _ := ParseCron("0 0 * * *")
	for _, from := range []time.Time{
		time.Unix(1<<62, 0),
		time.Unix(-1<<62, 0),
	} {
		if got := cr.Next(from, nil); !got.IsZero() {
			t.Errorf("Next(%v) = %v, want zero", from, got)
		}
	}
	var nilCron *Cron
	if got := nilCron.Next(time.Now(), nil); !got.IsZero() {
		t.Errorf("nil Cron Next = %v", got)
	}
}
