package scenes

import (
	"fmt"
	"strconv"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/scenes/schedule"
)

// CatchUp says what a schedule does with the firings it missed while the
// agent was down.
type CatchUp string

// Catch-up policies, as Temporal's schedules have them.
const (
	// CatchUpSkip runs none of them.
	CatchUpSkip CatchUp = "skip"
	// CatchUpOnce runs the latest one within the window.
	CatchUpOnce CatchUp = "once"
	// CatchUpAll runs every one within the window, oldest first (at most
	// MaxCatchUp).
	CatchUpAll CatchUp = "all"
)

// Schedule defaults and limits.
const (
	DefaultCatchUp       = CatchUpOnce
	DefaultCatchUpWindow = time.Hour
	// MaxCatchUpWindow is a year, Temporal's default: the longest
	// outage anyone expects a schedule to make up for.
	MaxCatchUpWindow = 366 * 24 * time.Hour
	// MaxCatchUp bounds the firings a catch_up = "all" schedule runs
	// after one outage: an every-minute schedule down for a day would
	// otherwise start 1,440 missions at once.
	MaxCatchUp = 100
	// MaxSchedules bounds a scene's schedules.
	MaxSchedules = 16
	// MaxJitter bounds a schedule's jitter.
	MaxJitter = time.Hour
	// MaxSunOffset bounds a sun schedule's offset.
	MaxSunOffset = 12 * time.Hour
)

// Schedule is one [[scene.schedule]] of a scene: when the agent triggers
// the scene by itself. Exactly one of Cron and Sun is set.
type Schedule struct {
	Scene string
	// Name is unique within the scene ("1", "2", ... by position unless
	// given); ID, "scene/name", keys the schedule's durable cursor.
	Name string
	Cron *schedule.Cron
	// Sun has its event and offset; the agent fills in the gateway's
	// latitude and longitude.
	Sun *schedule.Sun
	// Zone is the IANA time zone the schedule is read in; "" is the
	// gateway's.
	Zone string
	// Jitter delays each firing by a fixed pseudo-random part of it,
	// derived from the schedule and the firing, so that many gateways
	// on one schedule do not fire in the same second, and a restart does
	// not move a firing.
	Jitter        time.Duration
	CatchUp       CatchUp
	CatchUpWindow time.Duration
	// Params are the trigger parameters of each firing.
	Params map[string]any
}

// ID is the schedule's key: scene/name.
func (s Schedule) ID() string { return s.Scene + "/" + s.Name }

// When says when the schedule fires, for people: the cron expression, or
// the sun event with its offset (the zone is apart, Zone).
func (s Schedule) When() string {
	w := ""
	switch {
	case s.Cron != nil:
		w = "cron " + s.Cron.String()
	case s.Sun != nil:
		w = s.Sun.Event.String()
		if s.Sun.Offset != 0 {
			w += fmt.Sprintf(" %+v", s.Sun.Offset)
		}
	}
	return w
}

// Schedules returns every scene's schedules, by scene name then
// position.
func (c *Catalog) Schedules() []Schedule {
	var out []Schedule
	for _, name := range c.names {
		for _, s := range c.scenes[name].schedules {
			s.Params = cloneParams(s.Params)
			out = append(out, s)
		}
	}
	return out
}

func cloneParams(m map[string]any) map[string]any {
	if m == nil {
		return nil
	}
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// schedules validates the scene's [[scene.schedule]] tables.
func (p *parser) schedules(t *table, scene string) []Schedule {
	v, ok := t.get("schedule")
	if !ok {
		return nil
	}
	var tables []map[string]any
	switch s := v.(type) {
	case []map[string]any:
		tables = s
	case []any:
		for _, e := range s {
			m, ok := e.(map[string]any)
			if !ok {
				t.fail("schedule", "%s is not a table", describe(e))
				return nil
			}
			tables = append(tables, m)
		}
	default:
		t.fail("schedule", "%s is not an array of tables ([[scene.schedule]])", describe(v))
		return nil
	}
	if len(tables) > MaxSchedules {
		t.fail("schedule", "%d schedules (max %d)", len(tables), MaxSchedules)
		return nil
	}
	var out []Schedule
	seen := map[string]bool{}
	for i, m := range tables {
		loc := t.loc
		loc.Step, loc.StepName = 0, ""
		st := p.table(loc, fmt.Sprintf("schedule[%d].", i+1), m)
		s := Schedule{Scene: scene, Name: strconv.Itoa(i + 1), CatchUp: DefaultCatchUp, CatchUpWindow: DefaultCatchUpWindow}
		if name, ok := st.str("name"); ok {
			if err := driver.CheckID("schedule name", name); err != nil {
				st.fail("name", "%s", idReason(err))
			}
			s.Name = name
		}
		if seen[s.Name] {
			st.fail("name", "two schedules of the scene are named %q", s.Name)
		}
		seen[s.Name] = true
		expr, hasCron := st.str("cron")
		event, hasSun := st.str("sun")
		switch {
		case hasCron && hasSun:
			st.fail("cron", "a schedule has cron or sun, not both")
		case hasCron:
			c, err := schedule.ParseCron(expr)
			if err != nil {
				st.fail("cron", "%v", err)
			}
			s.Cron = c
		case hasSun:
			e, err := schedule.ParseEvent(event)
			if err != nil {
				st.fail("sun", "%v", err)
			}
			s.Sun = &schedule.Sun{Event: e}
			if off, ok := st.str("offset"); ok {
				d, err := time.ParseDuration(off)
				switch {
				case err != nil:
					st.fail("offset", "%q is not a duration (want e.g. \"-15m\", \"30m\")", off)
				case d < -MaxSunOffset || d > MaxSunOffset:
					st.fail("offset", "%q is more than %s from the event", off, MaxSunOffset)
				default:
					s.Sun.Offset = d
				}
			}
		default:
			st.fail("cron", "a schedule needs cron = \"...\" or sun = \"sunrise\"|\"sunset\"|\"dawn\"|\"dusk\"")
		}
		if _, off := st.get("offset"); hasCron && off {
			st.fail("offset", "offset is for sun schedules; shift the cron expression instead")
		}
		if z, ok := st.str("timezone"); ok {
			if _, err := time.LoadLocation(z); err != nil || z == "" || z == "Local" {
				st.fail("timezone", "%q is not an IANA time zone such as \"Europe/Berlin\" in the system's time zone database (/usr/share/zoneinfo, or $ZONEINFO)", z)
			}
			s.Zone = z
		}
		if j, ok := st.str("jitter"); ok {
			d, err := time.ParseDuration(j)
			if err != nil || d < 0 || d > MaxJitter {
				st.fail("jitter", "%q is not a duration from 0 to %s", j, MaxJitter)
			}
			s.Jitter = d
		}
		if cu, ok := st.str("catch_up"); ok {
			s.CatchUp = CatchUp(cu)
			switch s.CatchUp {
			case CatchUpSkip, CatchUpOnce, CatchUpAll:
			default:
				st.fail("catch_up", "%q is not one of skip, once, all", cu)
			}
		}
		if w, ok := st.str("catch_up_window"); ok {
			d, err := time.ParseDuration(w)
			if err != nil || d < time.Minute || d > MaxCatchUpWindow {
				st.fail("catch_up_window", "%q is not a duration from 1m (a firing a minute late is on time) to %s (8784h)", w, MaxCatchUpWindow)
			}
			s.CatchUpWindow = d
		}
		if pv, ok := st.get("params"); ok {
			m, isMap := pv.(map[string]any)
			if !isMap {
				st.fail("params", "%s is not a table", describe(pv))
			} else if params, err := normalizeParams(m); err != nil {
				st.fail("params", "%v", err)
			} else {
				s.Params = params
			}
		}
		st.done()
		out = append(out, s)
	}
	return out
}

// checkSchedules builds each schedule's trigger once, so a missing or
// invalid parameter is found when the scenes load rather than at the
// first firing.
//
// It also refuses two schedules whose firings would share request IDs
// (FiringPrefix + scene + "-" + name + ...): "porch-light" / "on" and
// "porch" / "light-on" would.
func (c *Catalog) checkSchedules() []FieldError {
	var errs []FieldError
	seen := map[string]string{}
	for _, name := range c.names {
		sc := c.scenes[name]
		for i, s := range sc.schedules {
			if _, err := c.Build(name, s.Params); err != nil {
				errs = append(errs, FieldError{File: sc.file, Scene: name, Field: fmt.Sprintf("schedule[%d].params", i+1), Msg: err.Error()})
			}
			if s.CatchUp == CatchUpAll && (sc.mode == ModeSingle || sc.mode == ModeRestart) {
				errs = append(errs, FieldError{File: sc.file, Scene: name, Field: fmt.Sprintf("schedule[%d].catch_up", i+1),
					Msg: fmt.Sprintf("\"all\" runs the missed firings one after another, which mode %s would %s while the first runs: use mode queued or parallel, or catch_up \"once\"", sc.mode, map[Mode]string{ModeSingle: "reject", ModeRestart: "cancel one by one"}[sc.mode])})
			}
			flat := s.Scene + "-" + s.Name
			if other, ok := seen[flat]; ok {
				errs = append(errs, FieldError{File: sc.file, Scene: name, Field: fmt.Sprintf("schedule[%d].name", i+1),
					Msg: fmt.Sprintf("its firings' request IDs (%s%s-...) would be those of schedule %s; rename one", FiringPrefix, flat, other)})
			}
			seen[flat] = s.ID()
		}
	}
	return errs
}

// FiringPrefix begins the request ID of every schedule's firing; a
// trigger from outside may not use it, so that no app can pre-empt (or
// be taken for) a firing.
const FiringPrefix = "sched-"
