package schedule

import (
	"testing"
	"time"
)

func BenchmarkCronNext(b *testing.B) {
	for _, c := range []struct{ name, expr, zone string }{
		{"every15m/berlin", "*/15 * * * *", "Europe/Berlin"},
		{"daily0230/berlin", "30 2 * * *", "Europe/Berlin"},
		{"weekdays/new_york", "0 7 * * 1-5", "America/New_York"},
		{"leapday/utc", "0 0 29 2 *", "UTC"},
	} {
		b.Run(c.name, func(b *testing.B) {
			cr, err := ParseCron(c.expr)
			if err != nil {
				b.Fatal(err)
			}
			loc := mustLoad(b, c.zone)
			start := time.Date(2026, 1, 1, 0, 0, 0, 0, loc)
			cur := start
			for b.Loop() {
				cur = cr.Next(cur, loc)
				if cur.Year() > 2100 {
					cur = start
				}
			}
		})
	}
}

func BenchmarkSunNext(b *testing.B) {
	loc := mustLoad(b, "Europe/Berlin")
	s := Sun{Event: Sunset, Offset: -15 * time.Minute, Lat: 52.52, Lon: 13.405}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, loc)
	cur := start
	for b.Loop() {
		cur = s.Next(cur, loc)
		if cur.Year() > 2100 {
			cur = start
		}
	}
}
