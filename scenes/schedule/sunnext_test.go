package schedule

import (
	"testing"
	"time"
)

// TestSunNextYieldsEachDaysEventExactlyOnce runs Next over two years at
// latitudes from the tropics to Svalbard and checks that the firings are
// exactly On(date)+Offset for every local date that has the event, in
// order: never repeated, never backwards, no date skipped.
func TestSunNextYieldsEachDaysEventExactlyOnce(t *testing.T) {
	places := []struct {
		name     string
		zone     string
		lat, lon float64
	}{
		{"quito", "America/Guayaquil", -0.18, -78.47},
		{"sydney", "Australia/Sydney", -33.87, 151.21},
		{"new york", "America/New_York", 40.71, -74.01},
		{"berlin", "Europe/Berlin", 52.52, 13.405},
		{"reykjavik", "Atlantic/Reykjavik", 64.15, -21.94},
		{"tromso", "Europe/Oslo", 69.65, 18.96},
		{"longyearbyen", "Arctic/Longyearbyen", 78.22, 15.65},
		{"mcmurdo", "Antarctica/McMurdo", -77.85, 166.67},
	}
	for _, p := range places {
		loc := mustLoad(t, p.zone)
		from := time.Date(2026, 1, 1, 0, 0, 0, 0, loc)
		to := time.Date(2028, 1, 1, 0, 0, 0, 0, loc)
		offsets := []time.Duration{0, -15 * time.Minute}
		if p.name == "sydney" || p.name == "tromso" {
			// Large offsets move firings onto other dates.
			offsets = append(offsets, 11*time.Hour, -12*time.Hour)
		}
		for ev := Sunrise; ev <= Dusk; ev++ {
			for _, off := range offsets {
				s := Sun{Event: ev, Offset: off, Lat: p.lat, Lon: p.lon}
				t.Run(p.name+"/"+s.String(), func(t *testing.T) {
					var want []time.Time
					for day := from.AddDate(0, 0, -2); day.Before(to.AddDate(0, 0, 2)); day = day.AddDate(0, 0, 1) {
						f, ok := s.On(day.Year(), day.Month(), day.Day(), loc)
						if ok && !f.Before(from) && f.Before(to) {
							want = append(want, f)
						}
					}
					var got []time.Time
					cur := from.Add(-time.Nanosecond)
					for {
						f := s.Next(cur, loc)
						if f.IsZero() || !f.Before(to) {
							break
						}
						if !f.After(cur) {
							t.Fatalf("Next(%v) = %v, not after", cur, f)
						}
						got = append(got, f)
						cur = f
					}
					if len(got) != len(want) {
						t.Fatalf("%d firings, want %d (one per date with the event)", len(got), len(want))
					}
					for i := range got {
						if !got[i].Equal(want[i]) {
							t.Fatalf("firing %d = %v, want %v", i, got[i], want[i])
						}
					}
					if p.name == "tromso" && (ev == Sunrise || ev == Sunset) && len(got) > 660 {
						t.Errorf("%d firings in two years at 69.65N: polar day and night are missing", len(got))
					}
				})
			}
		}
	}
}

// TestSunEventsFallOnTheirOwnDateAtMidLatitudes checks that below the
// polar circles, with no offset, On(date) returns an instant on that
// date.
func TestSunEventsFallOnTheirOwnDateAtMidLatitudes(t *testing.T) {
	for _, z := range []struct {
		zone     string
		lat, lon float64
	}{{"Europe/Berlin", 52.52, 13.405}, {"Australia/Sydney", -33.87, 151.21}, {"America/New_York", 40.71, -74.01}, {"Asia/Kathmandu", 27.7, 85.3}} {
		loc := mustLoad(t, z.zone)
		for ev := Sunrise; ev <= Dusk; ev++ {
			s := Sun{Event: ev, Lat: z.lat, Lon: z.lon}
			for day := time.Date(2026, 1, 1, 0, 0, 0, 0, loc); day.Year() == 2026; day = day.AddDate(0, 0, 1) {
				f, ok := s.On(day.Year(), day.Month(), day.Day(), loc)
				if !ok {
					t.Fatalf("%s %v %v: no event", z.zone, ev, keyOf(day))
				}
				if keyOf(f) != keyOf(day) {
					t.Errorf("%s %v on %v fell on %v", z.zone, ev, keyOf(day), f)
				}
			}
		}
	}
}

// TestSunNextStartsFromAnyInstant checks Next from instants around an
// event: just before returns it, at or after returns the next day's.
func TestSunNextStartsFromAnyInstant(t *testing.T) {
	ber := mustLoad(t, "Europe/Berlin")
	s := Sun{Event: Sunset, Offset: -15 * time.Minute, Lat: 52.52, Lon: 13.405}
	today, _ := s.On(2026, 3, 29, ber) // the spring-forward day
	tomorrow, _ := s.On(2026, 3, 30, ber)
	for _, c := range []struct {
		from, want time.Time
	}{
		{today.Add(-time.Nanosecond), today},
		{today, tomorrow},
		{today.Add(time.Hour), tomorrow},
		{time.Date(2026, 3, 29, 0, 0, 0, 0, ber), today},
	} {
		if got := s.Next(c.from, ber); !got.Equal(c.want) {
			t.Errorf("Next(%v) = %v, want %v", c.from, got, c.want)
		}
	}
}

// TestSunNextGivesUpWhenTheEventNeverComes: exactly at the pole the hour
// angle is undefined and no day has a sunrise, so Next returns the zero
// Time once its horizon is spent.
func TestSunNextGivesUpWhenTheEventNeverComes(t *testing.T) {
	s := Sun{Event: Sunrise, Lat: 90, Lon: 0}
	if got := s.Next(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), nil); !got.IsZero() {
		t.Errorf("Next at the pole = %v, want zero", got)
	}
}
