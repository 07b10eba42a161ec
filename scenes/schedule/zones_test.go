package schedule

import (
	"testing"
	"time"
)

// zoneCase runs expr from `from` and expects the given firings, written
// as local times with their UTC offsets so the test reads like a clock.
type zoneCase struct {
	name, zone, expr, from string
	want                   []string
}

const stamp = "2006-01-02 15:04 -07:00"

func runZoneCases(t *testing.T, cases []zoneCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			loc := mustLoad(t, c.zone)
			cr, err := ParseCron(c.expr)
			if err != nil {
				t.Fatal(err)
			}
			cur, err := time.Parse(stamp, c.from)
			if err != nil {
				t.Fatal(err)
			}
			for i, w := range c.want {
				want, err := time.Parse(stamp, w)
				if err != nil {
					t.Fatal(err)
				}
				cur = cr.Next(cur, loc)
				if !cur.Equal(want) {
					t.Fatalf("firing %d: got %s, want %s", i, cur.Format(stamp), w)
				}
			}
		})
	}
}

// TestMidnightTransitionZonesFireDailyOnce covers zones that change the
// clock at midnight, so 00:00 is skipped (and fires at the 01:00 jump) or
// 23:00-24:00 repeats (and fires once).
func TestMidnightTransitionZonesFireDailyOnce(t *testing.T) {
	runZoneCases(t, []zoneCase{
		// Chile: Saturday 24:00 -> Sunday 01:00 on 6 Sep 2026.
		{"santiago midnight skipped fires at 01:00", "America/Santiago", "0 0 * * *", "2026-09-05 12:00 -04:00",
			[]string{"2026-09-06 01:00 -03:00", "2026-09-07 00:00 -03:00"}},
		{"santiago 00:30 skipped fires at 01:00", "America/Santiago", "30 0 * * *", "2026-09-05 12:00 -04:00",
			[]string{"2026-09-06 01:00 -03:00", "2026-09-07 00:30 -03:00"}},
		{"santiago 01:00 exists on the jump day", "America/Santiago", "0 1 * * *", "2026-09-05 12:00 -04:00",
			[]string{"2026-09-06 01:00 -03:00", "2026-09-07 01:00 -03:00"}},
		// Chile: Saturday 24:00 -> Saturday 23:00 on 4 Apr 2026.
		{"santiago repeated 23:30 fires at first occurrence", "America/Santiago", "30 23 * * *", "2026-04-04 12:00 -03:00",
			[]string{"2026-04-04 23:30 -03:00", "2026-04-05 23:30 -04:00"}},
		{"santiago midnight after the repeat", "America/Santiago", "0 0 * * *", "2026-04-04 12:00 -03:00",
			[]string{"2026-04-05 00:00 -04:00", "2026-04-06 00:00 -04:00"}},
		// Cuba: 00:00 -> 01:00 on 8 Mar 2026; 01:00 -> 00:00 on 1 Nov 2026.
		{"havana midnight skipped fires at 01:00", "America/Havana", "0 0 * * *", "2026-03-07 12:00 -05:00",
			[]string{"2026-03-08 01:00 -04:00", "2026-03-09 00:00 -04:00"}},
		{"havana repeated 00:30 fires at first occurrence", "America/Havana", "30 0 * * *", "2026-10-31 12:00 -04:00",
			[]string{"2026-11-01 00:30 -04:00", "2026-11-02 00:30 -05:00"}},
		// Lebanon: 00:00 -> 01:00 on 29 Mar 2026; 24:00 -> 23:00 on 24 Oct 2026.
		{"beirut midnight skipped fires at 01:00", "Asia/Beirut", "0 0 * * *", "2026-03-28 12:00 +02:00",
			[]string{"2026-03-29 01:00 +03:00", "2026-03-30 00:00 +03:00"}},
		{"beirut repeated 23:30 fires at first occurrence", "Asia/Beirut", "30 23 * * *", "2026-10-24 12:00 +03:00",
			[]string{"2026-10-24 23:30 +03:00", "2026-10-25 23:30 +02:00"}},
		// Samoa skipped 30 Dec 2011 entirely: its noon fires at the jump.
		{"apia skipped day fires once at the jump", "Pacific/Apia", "0 12 * * *", "2011-12-29 00:00 -10:00",
			[]string{"2011-12-29 12:00 -10:00", "2011-12-31 00:00 +14:00", "2011-12-31 12:00 +14:00"}},
		// Newfoundland fell back at 00:01 to 23:01 the day before until
		// 2011: elapsed-time schedules go from Sunday back to Saturday.
		{"st johns every 15 minutes across a date going back", "America/St_Johns", "*/15 * * * *", "2010-11-06 23:50 -02:30",
			[]string{"2010-11-07 00:00 -02:30", "2010-11-06 23:15 -03:30", "2010-11-06 23:30 -03:30", "2010-11-06 23:45 -03:30", "2010-11-07 00:00 -03:30"}},
		{"st johns daily 23:30 fires at first occurrence", "America/St_Johns", "30 23 * * *", "2010-11-06 12:00 -02:30",
			[]string{"2010-11-06 23:30 -02:30", "2010-11-07 23:30 -03:30"}},
		{"st johns daily 00:00 fires once", "America/St_Johns", "0 0 * * *", "2010-11-06 12:00 -02:30",
			[]string{"2010-11-07 00:00 -02:30", "2010-11-08 00:00 -03:30"}},
		// Hour wildcard at a midnight gap and overlap.
		{"santiago hourly skips the missing hour", "America/Santiago", "0 * * * *", "2026-09-05 22:30 -04:00",
			[]string{"2026-09-05 23:00 -04:00", "2026-09-06 01:00 -03:00", "2026-09-06 02:00 -03:00"}},
		{"beirut hourly fires in both 23:00 hours", "Asia/Beirut", "0 * * * *", "2026-10-24 22:30 +03:00",
			[]string{"2026-10-24 23:00 +03:00", "2026-10-24 23:00 +02:00", "2026-10-25 00:00 +02:00"}},
	})
}

// TestLordHoweHalfHourShift covers a 30-minute DST shift: 02:00-02:30 is
// skipped on 4 Oct 2026 and 01:30-02:00 repeats on 5 Apr 2026.
func TestLordHoweHalfHourShift(t *testing.T) {
	runZoneCases(t, []zoneCase{
		{"skipped 02:15 fires at the 02:30 jump", "Australia/Lord_Howe", "15 2 * * *", "2026-10-03 12:00 +10:30",
			[]string{"2026-10-04 02:30 +11:00", "2026-10-05 02:15 +11:00"}},
		{"skipped 02:00 and 02:15 fire once together", "Australia/Lord_Howe", "0,15 2 * * *", "2026-10-03 12:00 +10:30",
			[]string{"2026-10-04 02:30 +11:00", "2026-10-05 02:00 +11:00", "2026-10-05 02:15 +11:00"}},
		{"02:30 exists on the jump day", "Australia/Lord_Howe", "30 2 * * *", "2026-10-03 12:00 +10:30",
			[]string{"2026-10-04 02:30 +11:00", "2026-10-05 02:30 +11:00"}},
		{"02:00, 02:15 and 02:30 collapse onto the jump once", "Australia/Lord_Howe", "0,15,30 2 * * *", "2026-10-03 12:00 +10:30",
			[]string{"2026-10-04 02:30 +11:00", "2026-10-05 02:00 +11:00"}},
		{"repeated 01:45 fires at first occurrence", "Australia/Lord_Howe", "45 1 * * *", "2026-04-04 12:00 +11:00",
			[]string{"2026-04-05 01:45 +11:00", "2026-04-06 01:45 +10:30"}},
		{"every 15 minutes keeps real time through the repeat", "Australia/Lord_Howe", "*/15 * * * *", "2026-04-05 01:20 +11:00",
			[]string{"2026-04-05 01:30 +11:00", "2026-04-05 01:45 +11:00", "2026-04-05 01:30 +10:30", "2026-04-05 01:45 +10:30", "2026-04-05 02:00 +10:30"}},
		{"every 15 minutes keeps real time through the gap", "Australia/Lord_Howe", "*/15 * * * *", "2026-10-04 01:40 +10:30",
			[]string{"2026-10-04 01:45 +10:30", "2026-10-04 02:30 +11:00", "2026-10-04 02:45 +11:00"}},
		{"hourly skips the 02:00 that does not exist", "Australia/Lord_Howe", "0 * * * *", "2026-10-04 00:30 +10:30",
			[]string{"2026-10-04 01:00 +10:30", "2026-10-04 03:00 +11:00"}},
	})
}

// TestHourWildcardDayCountsInHalfHourZone counts "0 * * * *" per local
// day on Lord Howe's transition days: the spring day loses the 02:00
// mark, the autumn day's repeated half hour holds no hour mark.
func TestHourWildcardDayCountsInHalfHourZone(t *testing.T) {
	loc := mustLoad(t, "Australia/Lord_Howe")
	c, _ := ParseCron("0 * * * *")
	for _, tc := range []struct {
		day  dayKey
		want int
	}{{dayKey{2026, 10, 4}, 23}, {dayKey{2026, 4, 5}, 24}, {dayKey{2026, 4, 6}, 24}} {
		from := time.Date(tc.day.y, tc.day.m, tc.day.d, 0, 0, 0, 0, loc)
		to := time.Date(tc.day.y, tc.day.m, tc.day.d+1, 0, 0, 0, 0, loc)
		if got := len(firings(t, c, loc, from, to)); got != tc.want {
			t.Errorf("%v: %d firings, want %d", tc.day, got, tc.want)
		}
	}
}

// TestMidnightZonesFireOncePerDayForTwentyYears runs the daily
// property over 2010-2030 in the zones with odd transitions.
func TestMidnightZonesFireOncePerDayForTwentyYears(t *testing.T) {
	for _, zone := range []string{"America/Santiago", "America/Havana", "Asia/Beirut", "Australia/Lord_Howe"} {
		loc := mustLoad(t, zone)
		from := time.Date(2010, 1, 1, 0, 0, 0, 0, loc)
		to := time.Date(2030, 1, 1, 0, 0, 0, 0, loc)
		for _, s := range []struct {
			expr string
			h, m int
		}{{"0 0 * * *", 0, 0}, {"30 0 * * *", 0, 30}, {"15 2 * * *", 2, 15}, {"45 1 * * *", 1, 45}, {"30 23 * * *", 23, 30}} {
			t.Run(zone+"/"+s.expr, func(t *testing.T) {
				checkOncePerDay(t, loc, s.expr, s.h, s.m, false, from, to)
			})
		}
	}
}
