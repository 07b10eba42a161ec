// Package schedule computes when a scene's schedule fires: a cron
// expression (Cron) or a sun event with an offset (Sun). Both satisfy
// Schedule, whose Next returns the first firing strictly after a given
// instant. The package does time math only; it keeps no state, starts no
// goroutines and imports only the standard library. Zone rules come from
// the time package's tz database.
//
// # Cron and daylight saving time
//
// Cron fields are local wall-clock times in the Location passed to Next
// (UTC when nil). Twice a year a zone's wall clock skips or repeats, and
// the rules below decide what a schedule does then. A daily job must run
// once a day, not zero or two times, so:
//
//   - A local time that does not exist because the clock jumps forward
//     (02:30 in Europe/Berlin on the last Sunday of March) fires once, at
//     the jump: the first instant after the gap, which reads 03:00. When
//     several of a day's times fall in the same gap ("0,30 2 * * *"),
//     they fire once together at the jump, and the next firing is the
//     next real time after it.
//   - A local time that happens twice because the clock falls back (02:30
//     in Berlin on the last Sunday of October, 01:30 in America/New_York
//     on the first Sunday of November) fires once, at its first
//     occurrence.
//
// Exception, as in Vixie cron: when the hour field starts with '*' ("*",
// "*/2"; so "*/15 * * * *", "0 * * * *" and @hourly), the schedule follows
// elapsed time instead. It fires at every instant whose wall clock
// matches: in both passes of a repeated hour, and not at all in a skipped
// hour, which has no instants. An "every 15 minutes" job keeps firing
// every 15 real minutes through both changes, where the fixed-time rules
// would make it stop for an hour in autumn and bunch up in spring; "0 * *
// * *" fires 23 times on a spring-forward day and 25 times on a
// fall-back day.
//
// The same rules cover zones whose clocks change at midnight
// (America/Santiago, America/Havana, Asia/Beirut): when 00:00 does not
// exist, "0 0 * * *" fires at the jump, 01:00, and a repeated 23:00 hour
// fires once. They cover 30-minute shifts (Australia/Lord_Howe) and
// whole skipped days too: Pacific/Apia skipped 30 December 2011, and a
// daily time on that date fires once at the jump, 31 December 00:00.
//
// # Cron syntax
//
// Five fields, minute hour day-of-month month day-of-week, with *, lists,
// ranges, steps on ranges or on '*', jan..dec and sun..sat in any case,
// 7 for Sunday, and the macros @yearly, @annually, @monthly, @weekly,
// @daily, @midnight and @hourly. When both day fields are restricted, a
// day matches either one (Vixie); a day field starting with '*' counts as
// unrestricted, also as in Vixie cron. ParseCron rejects anything else,
// and expressions that can never fire, with a *CronError naming the field
// and the token.
//
// # Sun events
//
// Sunrise and Sunset are the instants the upper limb of the sun touches
// a flat sea-level horizon under standard refraction (the sun's centre
// 0.833° below the horizon); Dawn and Dusk are the start and end of civil
// twilight (centre 6° below). Positions follow the NOAA Solar Calculator
// (equations from Meeus, Astronomical Algorithms), solved at the event's
// own instant rather than at noon. NOAA states about one minute of
// accuracy within ±72° latitude; the tests compare against published U.S.
// Naval Observatory tables and planetarium tables within 60 seconds.
// Real sunsets also depend on terrain, height and the weather.
//
// Each event belongs to the local calendar date on which its solar noon
// falls, so a date has at most one of each event, and Next yields one
// firing per date that has the event, skipping dates without it (polar
// day and night) and giving up after about 400 days. Far north a sunset
// can come just after midnight; it still belongs to the date before,
// whose day it ends.
//
// All exported types are immutable values and safe for concurrent use.
package schedule
