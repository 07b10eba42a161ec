package schedule

import "time"

// Schedule is when something fires. *Cron and Sun satisfy it.
type Schedule interface {
	// Next returns the first firing strictly after t, reading local
	// times in loc (nil means UTC), or the zero Time if there is none.
	Next(t time.Time, loc *time.Location) time.Time
	// String describes the schedule for logs and errors.
	String() string
}

var (
	_ Schedule = (*Cron)(nil)
	_ Schedule = Sun{}
)
