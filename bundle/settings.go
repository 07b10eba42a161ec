package bundle

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// Settings are the agent settings a bundle carries: those the agent
// takes without a restart. Today that is [location] alone: the sun
// schedules of the scenes are placed by it, so it must change with them.
// Everything else in agent.toml (broker, API, store, hub, driver and
// retention bounds, logging) is read once at start: it opens listeners
// and files or sizes pools, and stays in agent.toml (docs/fleet.md).
type Settings struct {
	Location Location `toml:"location"`
}

// Location places the gateway for sun schedules and names its time zone
// (agent.toml's [location], same keys). Latitude and Longitude are
// pointers so that 0 (the equator, Greenwich) is a place, not "unset".
type Location struct {
	Latitude  *float64 `toml:"latitude"`
	Longitude *float64 `toml:"longitude"`
	// TimeZone is the IANA zone schedules are read in unless they name
	// their own; "" is the system's (TZ, /etc/localtime).
	TimeZone string `toml:"timezone"`
}

// Problem is one bad setting: its field ("location.latitude") and why.
type Problem struct {
	Field, Msg string
}

// Problems checks every field and returns what is wrong, in field
// order; none for good settings. agent.toml's [location] is checked by
// the same rules.
func (l Location) Problems() []Problem {
	var out []Problem
	bad := func(field, format string, args ...any) { out = appendProblem(out, field, format, args...) }
	if (l.Latitude == nil) != (l.Longitude == nil) {
		bad("location.latitude", "latitude and longitude go together")
	}
	if l.Latitude != nil && !(*l.Latitude >= -90 && *l.Latitude <= 90) {
		bad("location.latitude", "%v is not between -90 and 90", *l.Latitude)
	}
	if l.Longitude != nil && !(*l.Longitude >= -180 && *l.Longitude <= 180) {
		bad("location.longitude", "%v is not between -180 and 180", *l.Longitude)
	}
	if l.TimeZone != "" {
		if _, err := time.LoadLocation(l.TimeZone); err != nil || l.TimeZone == "Local" {
			bad("location.timezone", "%q is not an IANA time zone such as \"Europe/Berlin\" in the system's time zone database (/usr/share/zoneinfo, or $ZONEINFO)", l.TimeZone)
		}
	}
	return out
}

// HasPosition says whether latitude and longitude are both set.
func (l Location) HasPosition() bool { return l.Latitude != nil && l.Longitude != nil }

// ParseSettings decodes settings.toml, rejecting unknown keys, and
// checks them.
func ParseSettings(data []byte) (Settings, error) {
	var s Settings
	md, err := toml.Decode(string(data), &s)
	if err != nil {
		return s, fmt.Errorf("%s: %w", SettingsFile, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return s, fmt.Errorf("%s: unknown key(s) %s (a bundle's settings are [location] only)", SettingsFile, strings.Join(keys, ", "))
	}
	var msgs []string
	for _, p := range s.Location.Problems() {
		msgs = append(msgs, fmt.Sprintf("%s: %s: %s", SettingsFile, p.Field, p.Msg))
	}
	if len(msgs) > 0 {
		return s, fmt.Errorf("%s", strings.Join(msgs, "\n"))
	}
	return s, nil
}

// Encode renders the settings as settings.toml, always the same way for
// the same values; nil when they set nothing.
func (s Settings) Encode() []byte {
	l := s.Location
	if l.Latitude == nil && l.Longitude == nil && l.TimeZone == "" {
		return nil
	}
	var b strings.Builder
	b.WriteString("[location]\n")
	if l.Latitude != nil {
		b.WriteString("latitude = " + tomlFloat(*l.Latitude) + "\n")
	}
	if l.Longitude != nil {
		b.WriteString("longitude = " + tomlFloat(*l.Longitude) + "\n")
	}
	if l.TimeZone != "" {
		b.WriteString("timezone = " + strconv.Quote(l.TimeZone) + "\n")
	}
	return []byte(b.String())
}

// tomlFloat writes f so that TOML reads it back as a float.
func tomlFloat(f float64) string {
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}

// appendProblem is kept out of line: inlined at each of Problems'
// checks it costs the gateway's binary kilobytes.
//
//go:noinline
func appendProblem(out []Problem, field, format string, args ...any) []Problem {
	return append(out, Problem{Field: field, Msg: fmt.Sprintf(format, args...)})
}
