package schedule

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Event is a sun event.
type Event int

// Sun events. Dawn and Dusk are the start and end of civil twilight, the
// centre of the sun 6° below the horizon; Sunrise and Sunset are the
// upper limb on the horizon with standard refraction, the centre 0.833°
// below it.
const (
	Sunrise Event = iota + 1
	Sunset
	Dawn
	Dusk
)

var eventNames = [...]string{Sunrise: "sunrise", Sunset: "sunset", Dawn: "dawn", Dusk: "dusk"}

func (e Event) valid() bool { return e >= Sunrise && e <= Dusk }

func (e Event) String() string {
	if !e.valid() {
		return "Event(" + strconv.Itoa(int(e)) + ")"
	}
	return eventNames[e]
}

// ParseEvent parses "sunrise", "sunset", "dawn" or "dusk", in any case.
func ParseEvent(s string) (Event, error) {
	for e := Sunrise; e <= Dusk; e++ {
		if strings.EqualFold(s, eventNames[e]) {
			return e, nil
		}
	}
	return 0, fmt.Errorf("%w: event %q: want sunrise, sunset, dawn or dusk", ErrInvalidSun, s)
}

// zenith returns the sun's zenith distance at the event in degrees, and
// whether the event is in the morning.
func (e Event) zenith() (float64, bool) {
	switch e {
	case Sunrise:
		return 90.833, true
	case Sunset:
		return 90.833, false
	case Dawn:
		return 96, true
	default:
		return 96, false
	}
}

// MaxSunOffset bounds Sun.Offset: half a day either way reaches any time
// of day from the event, and a larger offset would move a firing onto a
// different day's event.
const MaxSunOffset = 12 * time.Hour

// Sun fires at a sun event plus Offset (negative for "15 minutes before
// sunset") at Lat/Lon in degrees, north and east positive.
//
// Times come from the NOAA solar calculator's equations (Meeus,
// Astronomical Algorithms), evaluated at the event itself rather than at
// noon; NOAA gives them as accurate to about a minute within ±72°
// latitude. Sea-level observer, flat horizon.
type Sun struct {
	Event  Event
	Offset time.Duration
	Lat    float64
	Lon    float64
}

// Validate reports the first bad field: latitude outside [-90, 90],
// longitude outside [-180, 180] (NaN in either), |Offset| over 12h, or
// an unknown event.
func (s Sun) Validate() error {
	switch {
	case !s.Event.valid():
		return fmt.Errorf("%w: event %d: want sunrise, sunset, dawn or dusk", ErrInvalidSun, int(s.Event))
	case !(s.Lat >= -90 && s.Lat <= 90):
		return fmt.Errorf("%w: latitude %v: want -90..90", ErrInvalidSun, s.Lat)
	case !(s.Lon >= -180 && s.Lon <= 180):
		return fmt.Errorf("%w: longitude %v: want -180..180", ErrInvalidSun, s.Lon)
	case s.Offset > MaxSunOffset || s.Offset < -MaxSunOffset:
		return fmt.Errorf("%w: offset %v: want at most %v either way", ErrInvalidSun, s.Offset, MaxSunOffset)
	}
	return nil
}

// String describes the schedule, e.g. "sunset-15m0s at 52.52,13.405".
func (s Sun) String() string {
	var b strings.Builder
	b.WriteString(s.Event.String())
	if s.Offset != 0 {
		if s.Offset > 0 {
			b.WriteByte('+')
		}
		b.WriteString(s.Offset.String())
	}
	b.WriteString(" at ")
	b.WriteString(strconv.FormatFloat(s.Lat, 'f', -1, 64))
	b.WriteByte(',')
	b.WriteString(strconv.FormatFloat(s.Lon, 'f', -1, 64))
	return b.String()
}

// On returns the instant of the event, Offset applied, on the local
// calendar date y-m-d in loc (nil means UTC; the date normalizes like
// time.Date). ok is false when the sun does not reach the event's
// altitude that day (polar day or night) or s is invalid.
//
// The event belongs to the day whose solar noon falls on that date, so
// each date has at most one of each event; far north a sunset can come
// after midnight, on the next date, and still belongs to the day it
// ends.
func (s Sun) On(y int, m time.Month, d int, loc *time.Location) (time.Time, bool) {
	if s.Validate() != nil {
		return time.Time{}, false
	}
	if loc == nil {
		loc = time.UTC
	}
	u, ok := s.event(daysFromCivil(int64(y), int(m), d), loc)
	if !ok {
		return time.Time{}, false
	}
	return time.Unix(u, 0).Add(s.Offset).In(loc), true
}

// sunSearchDays is how far Next looks ahead: past the longest polar
// night anywhere (about six months at the poles).
const sunSearchDays = 400

// Next returns the first firing strictly after t, or the zero Time if
// there is none within about 400 days (or s is invalid). Dates without
// the event are skipped; each date fires at most once.
func (s Sun) Next(t time.Time, loc *time.Location) time.Time {
	if s.Validate() != nil {
		return time.Time{}
	}
	if loc == nil {
		loc = time.UTC
	}
	ts := t.Unix()
	if ts > maxUnix || ts < -maxUnix {
		return time.Time{}
	}
	// An event is at most 12h (an hour angle of 180°, plus seconds of
	// equation-of-time drift) from its date's solar noon, so dates
	// before the one 13h+Offset before t fire before t. Events grow with
	// the date: the first one after t is the answer.
	start := localDay(loc, ts-int64(s.Offset/time.Second)-13*3600)
	for day := start; day < start+sunSearchDays; day++ {
		u, ok := s.event(day, loc)
		if !ok {
			continue
		}
		if f := time.Unix(u, 0).Add(s.Offset); f.After(t) {
			return f.In(loc)
		}
	}
	return time.Time{}
}

const deg = math.Pi / 180

// event returns the event's instant in whole Unix seconds (no offset)
// for local day number day.
func (s Sun) event(day int64, loc *time.Location) (int64, bool) {
	n, te, ok := s.transitDay(day, loc)
	if !ok {
		return 0, false
	}
	zen, morning := s.Event.zenith()
	cosZ := math.Cos(zen * deg)
	sinLat, cosLat := math.Sincos(s.Lat * deg)
	base := float64(n) * secondsPerDay
	// The hour angle depends on the declination, which moves up to 0.4°
	// a day; evaluating it at the event instead of at noon is what keeps
	// high latitudes within a minute. Four passes converge to well under
	// a second.
	for range 4 {
		decl, eot := solar(te)
		sinD, cosD := math.Sincos(decl)
		arg := (cosZ - sinLat*sinD) / (cosLat * cosD)
		if !(arg >= -1 && arg <= 1) {
			return 0, false
		}
		ha := math.Acos(arg) / deg
		noon := base + (720-4*s.Lon-eot)*60
		if morning {
			te = noon - ha*240
		} else {
			te = noon + ha*240
		}
	}
	return int64(math.Round(te)), true
}

// transitDay returns the UTC day number n whose solar transit falls on
// local day `day`, and the transit's instant.
func (s Sun) transitDay(day int64, loc *time.Location) (int64, float64, bool) {
	// Local noon, approximately: the offset in effect near noon is good
	// enough to pick the nearest transit, which is then checked.
	noonWall := day*secondsPerDay + secondsPerDay/2
	noon := noonWall - offsetAt(loc, noonWall-offsetAt(loc, noonWall))
	n := int64(math.Floor((float64(noon)-(720-4*s.Lon)*60)/secondsPerDay + 0.5))
	for range 3 {
		tr := transit(float64(n)*secondsPerDay, s.Lon)
		got := localDay(loc, int64(math.Floor(tr)))
		switch {
		case got == day:
			return n, tr, true
		case got < day:
			n++
		default:
			n--
		}
	}
	return 0, 0, false
}

// transit returns the instant (Unix seconds) of solar noon at longitude
// lon on the UTC day starting at base.
func transit(base, lon float64) float64 {
	t := base + (720-4*lon)*60
	for range 2 {
		_, eot := solar(t)
		t = base + (720-4*lon-eot)*60
	}
	return t
}

// solar returns the sun's apparent declination (radians) and the
// equation of time (minutes) at instant u (Unix seconds), following the
// NOAA solar calculator.
func solar(u float64) (decl, eot float64) {
	jd := u/secondsPerDay + 2440587.5
	jc := (jd - 2451545) / 36525
	l0 := math.Mod(280.46646+jc*(36000.76983+jc*0.0003032), 360) // geometric mean longitude
	m := 357.52911 + jc*(35999.05029-0.0001537*jc)               // geometric mean anomaly
	e := 0.016708634 - jc*(0.000042037+0.0000001267*jc)          // orbit eccentricity
	mr := m * deg
	c := math.Sin(mr)*(1.914602-jc*(0.004817+0.000014*jc)) +
		math.Sin(2*mr)*(0.019993-0.000101*jc) +
		math.Sin(3*mr)*0.000289 // equation of centre
	omega := (125.04 - 1934.136*jc) * deg // longitude of the moon's ascending node
	lambda := (l0 + c - 0.00569 - 0.00478*math.Sin(omega)) * deg
	eps0 := 23 + (26+(21.448-jc*(46.815+jc*(0.00059-jc*0.001813)))/60)/60
	eps := (eps0 + 0.00256*math.Cos(omega)) * deg // obliquity with nutation
	decl = math.Asin(math.Sin(eps) * math.Sin(lambda))
	y := math.Tan(eps / 2)
	y *= y
	l0r := l0 * deg
	eot = 4 / deg * (y*math.Sin(2*l0r) - 2*e*math.Sin(mr) +
		4*e*y*math.Sin(mr)*math.Cos(2*l0r) -
		0.5*y*y*math.Sin(4*l0r) - 1.25*e*e*math.Sin(2*mr))
	return decl, eot
}
