package agent

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"reflect"
	"sort"
	"sync"
	"time"

	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/bundle/check"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/scenes"
	"github.com/sortie-edge/sortie/store"
)

// Reasons a schedule's evaluation carries: a missed firing run late, and
// one not run.
const (
	reasonCaughtUp = "caught_up"
	reasonMissed   = "schedule_missed"
)

// Schedule timing.
const (
	// maxScheduleWait caps each sleep of the scheduler: the wall clock
	// may be stepped (NTP at boot on a gateway without a clock battery)
	// while a timer counts elapsed time, so the next firing is worked out
	// again at least this often.
	maxScheduleWait = time.Minute
	// clockAhead is how far a cursor may be ahead of the clock before it
	// is taken for the mark of a clock that was wrong, and moved back.
	clockAhead = time.Minute
	// onTimeGrace is how late a firing may be and still count as on
	// time rather than missed: the agent was busy, not away.
	onTimeGrace = time.Minute
	// maxPassed bounds the missed firings walked past at once (a year of
	// an every-minute schedule is 525,600); the rest wait for the next
	// round, a moment later.
	maxPassed = 1 << 20
	// scheduleRetryMax caps the back-off of a firing the trigger service
	// could not take (overloaded, stopping).
	scheduleRetryMax = time.Minute
)

// scheduleCursors reads the cursors of the last run.
type scheduleCursors interface {
	Cursors(ctx context.Context) (map[string]time.Time, error)
}

// scheduler fires the catalog's schedules as triggers. Each firing's
// request ID is derived from the schedule and the scheduled instant, so
// firing twice (a crash between the trigger and the cursor) starts one
// mission; and each schedule's cursor, the last instant handled, is
// durable, so what was missed while the agent was down is known at the
// next start, where the schedule's catch-up policy decides.
type scheduler struct {
	log    *slog.Logger
	clock  driver.Clock
	trig   *Triggers
	traces *tracer
	lookup func(ctx context.Context, requestKey string) (*driver.Mission, error)
	db     scheduleCursors

	mu      sync.Mutex
	entries []*scheduleEntry
	wake    chan struct{}
	// warnedClock is set once the clock was found not set (run's
	// goroutine, and start before it).
	warnedClock bool
}

type scheduleEntry struct {
	s    scenes.Schedule
	loc  *time.Location
	when interface {
		Next(t time.Time, loc *time.Location) time.Time
	}
	key     string    // the cursor's key: the ID and a fingerprint of when it fires
	cursor  time.Time // the last instant handled (fired, or decided against)
	next    time.Time // the first instant after cursor; zero: never
	retry   time.Time // a firing the trigger service could not take waits until then
	backoff time.Duration
	last    string // the latest firing's request ID
}

// LocationOptions place the gateway for sun schedules and name its time
// zone.
type LocationOptions struct {
	// Latitude and Longitude are in degrees, north and east positive;
	// HasPosition says they are set.
	Latitude, Longitude float64
	HasPosition         bool
	// TimeZone is the IANA zone schedules are read in unless they name
	// their own; "" is the system's.
	TimeZone string
}

// CheckLocation reports the sun schedules of cat that loc cannot place
// (no latitude and longitude), so that a config is refused when it is
// checked rather than when the agent starts.
func CheckLocation(cat *scenes.Catalog, loc *LocationOptions) error {
	return check.Location(cat, loc != nil && loc.HasPosition)
}

func newScheduler(o Options, log *slog.Logger, trig *Triggers, traces *tracer, db scheduleCursors, lookup func(context.Context, string) (*driver.Mission, error)) (*scheduler, error) {
	sc := &scheduler{log: log, clock: o.Clock, trig: trig, traces: traces, db: db, lookup: lookup, wake: make(chan struct{}, 1)}
	var err error
	sc.entries, err = scheduleEntries(o.Catalog, o.Location)
	return sc, err
}

// scheduleEntries are the schedules of cat, placed by loc, not yet
// given their cursors.
func scheduleEntries(cat *scenes.Catalog, loc *LocationOptions) ([]*scheduleEntry, error) {
	def := time.Local
	if loc != nil && loc.TimeZone != "" {
		var err error
		if def, err = time.LoadLocation(loc.TimeZone); err != nil {
			return nil, fmt.Errorf("location.timezone: %w", err)
		}
	}
	var entries []*scheduleEntry
	var errs []error
	for _, s := range cat.Schedules() {
		e := &scheduleEntry{s: s, loc: def, key: cursorKey(s)}
		if s.Zone != "" {
			loc, err := time.LoadLocation(s.Zone)
			if err != nil {
				errs = append(errs, fmt.Errorf("schedule %s: timezone: %w", s.ID(), err))
				continue
			}
			e.loc = loc
		}
		switch {
		case s.Cron != nil:
			e.when = s.Cron
		case s.Sun != nil:
			if loc == nil || !loc.HasPosition {
				errs = append(errs, fmt.Errorf("schedule %s: a sun schedule needs the gateway's [location] latitude and longitude", s.ID()))
				continue
			}
			sun := *s.Sun
			sun.Lat, sun.Lon = loc.Latitude, loc.Longitude
			if err := sun.Validate(); err != nil {
				errs = append(errs, fmt.Errorf("schedule %s: %w", s.ID(), err))
				continue
			}
			e.when = sun
		}
		entries = append(entries, e)
	}
	return entries, errors.Join(errs...)
}

// replace makes entries (from scheduleEntries) the schedules, while the
// scheduler runs: a configuration bundle was applied. A schedule the old
// set had, unchanged and placed alike, goes on as it was; another takes
// its stored cursor, or starts now, as at start, so that what it missed
// is caught up by its own policy.
func (sc *scheduler) replace(ctx context.Context, entries []*scheduleEntry) error {
	cursors, err := sc.db.Cursors(ctx)
	if err != nil {
		return err
	}
	now := sc.clock.Now()
	added := false
	sc.mu.Lock()
	old := make(map[string]*scheduleEntry, len(sc.entries))
	for _, e := range sc.entries {
		old[e.key] = e
	}
	for i, e := range entries {
		if o := old[e.key]; o != nil && o.loc.String() == e.loc.String() && reflect.DeepEqual(o.s, e.s) {
			entries[i] = o
			continue
		}
		if o := old[e.key]; o != nil {
			e.cursor, e.next = o.cursor, e.when.Next(o.cursor, e.loc)
			continue
		}
		added = sc.place(e, cursors, now) || added
	}
	sc.entries = entries
	sc.mu.Unlock()
	if added {
		_ = sc.traces.flush() // logged there; the batch is kept and written later
	}
	select {
	case sc.wake <- struct{}{}:
	default: // a wake is pending already
	}
	return nil
}

// cursorKey keys a schedule's cursor by its ID and a fingerprint of
// when it fires, so that a schedule whose expression, event or zone was
// edited starts afresh instead of catching up, by its new rule, on
// instants its old rule handled.
func cursorKey(s scenes.Schedule) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s.When() + "|" + s.Zone)) // a hash's Write does not fail
	return fmt.Sprintf("%s#%08x", s.ID(), h.Sum32())
}

// firingID is the request ID of a schedule's firing at instant: the
// same for every evaluation of that firing, on any run of the agent.
func firingID(s scenes.Schedule, instant time.Time) string {
	id := scenes.FiringPrefix + s.Scene + "-" + s.Name + "-" + instant.UTC().Format("20060102T150405Z")
	if len(id) <= driver.MaxIDLen {
		return id
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(s.ID())) // a hash's Write does not fail
	return fmt.Sprintf("%s%016x-%s", scenes.FiringPrefix, h.Sum64(), instant.UTC().Format("20060102T150405Z"))
}

// fireAt is when the firing of instant runs: the instant plus its share
// of the schedule's jitter, the same on every run of the agent.
func (e *scheduleEntry) fireAt(instant time.Time) time.Time {
	if e.s.Jitter <= 0 {
		return instant
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(firingID(e.s, instant))) // a hash's Write does not fail
	j := time.Duration(h.Sum64() % uint64(e.s.Jitter))
	// Within the gap to the next instant, so firings keep their order and
	// one jittered past the next does not hold that one up until it
	// counts as missed.
	if next := e.when.Next(instant, e.loc); !next.IsZero() && j >= next.Sub(instant) {
		j %= next.Sub(instant)
	}
	return instant.Add(j)
}

// start loads the cursors. A schedule seen for the first time starts now:
// it has missed nothing.
func (sc *scheduler) start(ctx context.Context) error {
	cursors, err := sc.db.Cursors(ctx)
	if err != nil {
		return err
	}
	now := sc.clock.Now()
	sc.mu.Lock()
	added := false
	for _, e := range sc.entries {
		added = sc.place(e, cursors, now) || added
	}
	sc.mu.Unlock()
	if sc.clockSet(now) {
		sc.checkClock(now)
	}
	if added {
		// Written at once: a crash before the next batch would make the
		// next start take its own time as the beginning, and miss what
		// fell due in between.
		_ = sc.traces.flush() // logged there; the batch is kept and written later
	}
	return nil
}

// place gives e its stored cursor, or now for a schedule seen for the
// first time (it has missed nothing), which it records; it says whether
// it did.
func (sc *scheduler) place(e *scheduleEntry, cursors map[string]time.Time, now time.Time) (added bool) {
	c, ok := cursors[e.key]
	if !ok {
		c = now.Truncate(time.Second)
		sc.traces.cursor(e.key, c, false)
	}
	e.cursor = c
	e.next = e.when.Next(c, e.loc)
	return !ok
}

// run fires schedules until ctx ends.
func (sc *scheduler) run(ctx context.Context) error {
	// With no schedule it still runs: a bundle may bring some (replace).
	for {
		now := sc.clock.Now()
		var due []*scheduleEntry
		if sc.clockSet(now) {
			sc.checkClock(now)
			due = sc.dueAt(now)
		}
		for _, e := range due {
			sc.handle(ctx, e, now)
			if ctx.Err() != nil {
				return nil
			}
		}
		wait := sc.untilNext(sc.clock.Now())
		if len(due) > 0 && wait <= 0 {
			continue
		}
		timer := make(chan struct{}, 1)
		stop := sc.clock.AfterFunc(min(max(wait, 0), maxScheduleWait), func() { timer <- struct{}{} })
		select {
		case <-ctx.Done():
			stop()
			return nil
		case <-timer:
		case <-sc.wake:
			stop()
		}
	}
}

// dueAt returns the entries with a firing due at now, in ID order.
func (sc *scheduler) dueAt(now time.Time) []*scheduleEntry {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	var out []*scheduleEntry
	for _, e := range sc.entries {
		if !e.next.IsZero() && !e.fireAt(e.next).After(now) && !e.retry.After(now) {
			out = append(out, e)
		}
	}
	return out
}

// untilNext is how long until the next firing of any schedule.
func (sc *scheduler) untilNext(now time.Time) time.Duration {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	wait := time.Duration(-1)
	for _, e := range sc.entries {
		if e.next.IsZero() {
			continue
		}
		at := e.fireAt(e.next)
		if e.retry.After(at) {
			at = e.retry
		}
		if d := at.Sub(now); wait < 0 || d < wait {
			wait = d
		}
	}
	if wait < 0 {
		return maxScheduleWait
	}
	return wait
}

// checkClock deals with a clock that was wrong. A cursor ahead of now
// was written under a clock set ahead (or the clock was stepped back):
// it is moved back to now, so the schedule fires again from here; what
// it handled in between has request IDs that make a second run a
// duplicate. A schedule with no next firing (a sun event that did not
// come within a year at that latitude) is looked at again.
func (sc *scheduler) checkClock(now time.Time) {
	sc.mu.Lock()
	var moved []*scheduleEntry
	for _, e := range sc.entries {
		// A back-off longer than its cap was set under a clock since
		// stepped back.
		if e.retry.After(now.Add(scheduleRetryMax)) {
			e.retry, e.backoff = time.Time{}, 0
		}
		if e.cursor.After(now.Add(clockAhead)) {
			sc.log.Warn("schedule: its cursor is ahead of the clock; the clock was wrong, or is; going on from now",
				"schedule", e.s.ID(), "cursor", e.cursor, "now", now)
			e.cursor = now.Truncate(time.Second)
			e.next = e.when.Next(e.cursor, e.loc)
			moved = append(moved, e)
		}
		if e.next.IsZero() && now.Sub(e.retry) > time.Hour {
			e.next = e.when.Next(maxTime(e.cursor, now), e.loc)
			e.retry = now
		}
	}
	sc.mu.Unlock()
	for _, e := range moved {
		sc.traces.cursor(e.key, e.cursor, true)
	}
}

// zoneName names a zone for people: the system's zone is "Local" to Go,
// so it is shown with its current abbreviation and offset.
func zoneName(loc *time.Location) string {
	if loc != time.Local {
		return loc.String()
	}
	if tz := os.Getenv("TZ"); tz != "" {
		return tz
	}
	return "system (" + time.Now().In(loc).Format("MST -07:00") + ")"
}

// clockNotSet is a time no gateway runs at with its clock set: one that
// boots without a clock battery reads 1970 (or its image's build date)
// until NTP answers. Schedules wait for the clock rather than fire by it
// or move their cursors back to it.
var clockNotSet = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// clockSet reports whether now can be trusted, logging once when not.
func (sc *scheduler) clockSet(now time.Time) bool {
	if !now.Before(clockNotSet) {
		return true
	}
	if !sc.warnedClock {
		sc.warnedClock = true
		sc.log.Warn("schedules wait: the clock is not set", "now", now)
	}
	return false
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// handle runs or decides against every firing of e due at now, oldest
// first: on time ones run; missed ones (the agent was away, or the
// clock jumped) go by the schedule's catch-up policy.
func (sc *scheduler) handle(ctx context.Context, e *scheduleEntry, now time.Time) {
	isDue := func(t time.Time) bool { return !t.IsZero() && !e.fireAt(t).After(now) }
	missed := func(t time.Time) bool { return now.Sub(e.fireAt(t)) > onTimeGrace }
	sc.mu.Lock()
	from := e.next
	sc.mu.Unlock()
	// Firings are handled in order, so those handled before a crash whose
	// cursor was not yet written come first: they are passed by their
	// request IDs before anything is taken for missed.
	for ; isDue(from) && sc.handled(ctx, firingID(e.s, from)); from = e.when.Next(from, e.loc) {
		sc.advance(e, from, firingID(e.s, from))
	}
	// Firings older than the window are missed whatever the policy: they
	// are passed over, the latest of them recorded as skipped (with how
	// many it stands for), not each one.
	windowStart := now.Add(-e.s.CatchUpWindow - e.s.Jitter)
	var old passedFirings
	for t := from; !t.IsZero() && t.Before(windowStart) && old.n < maxPassed; t = e.when.Next(t, e.loc) {
		old.add(t)
	}
	if old.n > 0 {
		from = e.when.Next(old.latest(), e.loc)
		sc.passOver(ctx, e, now, &old, fmt.Sprintf("beyond catch_up_window (%s)", e.s.CatchUpWindow))
		sc.log.Warn("schedule: firings missed beyond the catch-up window were not run", "schedule", e.s.ID(), "count", old.n, "latest", old.latest(), "window", e.s.CatchUpWindow.String())
	}
	// First pass: the latest missed firings, which the policy picks from
	// (no policy runs more than MaxCatchUp of them), and which are
	// recorded one by one; older ones are passed over like those beyond
	// the window, the latest recorded for all of them.
	var latest []time.Time
	var passed passedFirings
	onTime := false
	for t := from; isDue(t); t = e.when.Next(t, e.loc) {
		if !missed(t) {
			onTime = true
			continue
		}
		if len(latest) == scenes.MaxCatchUp {
			passed.add(latest[0])
			latest = append(latest[:0], latest[1:]...)
		}
		latest = append(latest, t)
	}
	if passed.n > 0 {
		from = e.when.Next(passed.latest(), e.loc)
		sc.passOver(ctx, e, now, &passed,
			fmt.Sprintf("behind the latest %d missed firings, the most catch_up = %q decides on", scenes.MaxCatchUp, e.s.CatchUp))
		sc.log.Warn("schedule: missed firings beyond the latest ones the catch-up policy decides on were not run", "schedule", e.s.ID(), "count", passed.n, "latest", passed.latest(), "catch_up", string(e.s.CatchUp))
	}
	if old.n > 0 || passed.n > 0 {
		// Written before any catch-up runs: an agent killed while it
		// catches up would otherwise leave the cursor behind the firings
		// it ran, and the next start would find the latest passed over
		// already run, with nothing to record for those before it.
		_ = sc.traces.flush() // logged there; the batch is kept and written later
	}
	run := map[time.Time]bool{}
	switch {
	case len(latest) == 0:
	case e.s.CatchUp == scenes.CatchUpOnce && !onTime:
		// A firing due now stands for the ones missed: run once, and
		// the current one rather than a stale one.
		run[latest[len(latest)-1]] = true
	case e.s.CatchUp == scenes.CatchUpAll:
		for _, t := range latest {
			run[t] = true
		}
	}
	for t := from; isDue(t); t = e.when.Next(t, e.loc) {
		late := now.Sub(e.fireAt(t))
		if !sc.fire(ctx, e, t, late, !missed(t) || run[t]) {
			return // tried again later, from this firing
		}
	}
	if len(latest) > 0 {
		// What a catch-up decided is written at once, not with the next
		// batch: an agent that crashes again within the batch's interval
		// would otherwise decide it again each time, its missed firings
		// piling up past what is recorded one by one.
		_ = sc.traces.flush() // logged there; the batch is kept and written later
	}
}

// passedFirings are missed firings passed over together: how many, the
// oldest, and the latest few.
type passedFirings struct {
	n      int
	oldest time.Time
	tail   []time.Time // the latest passedTail, oldest first
}

// passedTail bounds the latest passed firings looked at for one not yet
// handled, to record.
const passedTail = 16

func (p *passedFirings) add(t time.Time) {
	if p.n == 0 {
		p.oldest = t
	}
	p.n++
	if len(p.tail) == passedTail {
		p.tail = append(p.tail[:0], p.tail[1:]...)
	}
	p.tail = append(p.tail, t)
}

func (p *passedFirings) latest() time.Time { return p.tail[len(p.tail)-1] }

// passOver moves e's cursor past the firings p that are not run one by
// one: the latest of them not yet handled is recorded as skipped for
// itself and all before it, why saying why, so that every firing up to
// the cursor has a mission or a record that accounts for it. (A later
// one was handled when the latest were run by a run of the agent that
// did not live to write its cursor.) The record goes before the cursor,
// in the same batch or an earlier one.
func (sc *scheduler) passOver(ctx context.Context, e *scheduleEntry, now time.Time, p *passedFirings, why string) {
	for i := len(p.tail) - 1; i >= 0; i-- {
		at := p.tail[i]
		id := firingID(e.s, at)
		if sc.handled(ctx, id) {
			continue
		}
		msg := fmt.Sprintf("the firing of %s (%s) was missed by %s, %s",
			at.In(e.loc).Format(time.DateTime+" MST"), e.s.When(), now.Sub(e.fireAt(at)).Round(time.Second), why)
		if before := p.n - len(p.tail) + i; before > 0 {
			msg += fmt.Sprintf("; so were the %d before it, from %s", before, p.oldest.In(e.loc).Format(time.DateTime+" MST"))
		}
		sc.traces.record(store.Evaluation{RequestID: id, At: sc.clock.Now(), Via: viaSchedule, Scene: e.s.Scene, Source: "schedule",
			Outcome: outcomeSkipped, Reason: reasonMissed, Message: msg})
		break
	}
	sc.advance(e, p.latest(), firingID(e.s, p.latest()))
}

// fire handles one firing: runs it as a trigger, or records why not. It
// returns false when the trigger service could not take it (it is tried
// again after a back-off, as the same firing).
func (sc *scheduler) fire(ctx context.Context, e *scheduleEntry, instant time.Time, late time.Duration, runIt bool) bool {
	id := firingID(e.s, instant)
	// A firing handled before a crash, whose cursor was not yet written:
	// its mission or its record says so, and it is not handled again.
	done, tried := sc.firingState(ctx, id)
	if done {
		sc.advance(e, instant, id)
		return true
	}
	runIt = runIt || tried
	tr := scenes.Trigger{Scene: e.s.Scene, RequestID: id, Source: "schedule", Params: e.s.Params}
	if !runIt {
		msg := fmt.Sprintf("the firing of %s (%s) was missed by %s while the agent was away (or its clock jumped); catch_up = %q",
			instant.In(e.loc).Format(time.DateTime+" MST"), e.s.When(), late.Round(time.Second), e.s.CatchUp)
		switch e.s.CatchUp {
		case scenes.CatchUpOnce:
			msg += " runs only the latest missed firing, and none when one is due on time"
		case scenes.CatchUpAll:
			msg += fmt.Sprintf(" runs only the latest %d missed firings", scenes.MaxCatchUp)
		}
		sc.traces.record(store.Evaluation{RequestID: id, At: sc.clock.Now(), Via: viaSchedule, Scene: e.s.Scene, Source: tr.Source,
			Outcome: outcomeSkipped, Reason: reasonMissed, Message: msg})
		sc.advance(e, instant, id)
		return true
	}
	note := ""
	if late > onTimeGrace {
		note = fmt.Sprintf("Caught up %s late: the firing of %s was missed while the agent was away (catch_up = %q)",
			late.Round(time.Second), instant.In(e.loc).Format(time.DateTime+" MST"), e.s.CatchUp)
	}
	rep, err := sc.trig.callJob(ctx, triggerJob{trigger: &tr, via: viaSchedule, note: note})
	if err == nil && rep.Status == scenes.StatusRejected && transient(rep.Reason) {
		err = errors.New(rep.Message)
	}
	if err != nil {
		sc.mu.Lock()
		e.backoff = min(max(2*e.backoff, time.Second), scheduleRetryMax)
		e.retry = sc.clock.Now().Add(e.backoff)
		sc.mu.Unlock()
		if ctx.Err() == nil {
			sc.log.Warn("schedule: firing not taken; trying again", "schedule", e.s.ID(), "request", id, "in", e.backoff, "err", err)
		}
		return false
	}
	sc.log.Info("schedule fired", "schedule", e.s.ID(), "request", id, "status", rep.Status, "mission", rep.MissionID, "reason", rep.Reason)
	sc.advance(e, instant, id)
	return true
}

// handled reports whether a firing was decided: it has a mission, or a
// record of being skipped or rejected for good. A rejection that asks
// for the trigger again (overloaded, shutting down, internal) is not a
// decision: the firing is tried again.
func (sc *scheduler) handled(ctx context.Context, id string) bool {
	done, _ := sc.firingState(ctx, id)
	return done
}

// firingState says whether a firing was decided (handled), and whether
// it was tried and turned away for now (tried): a firing the agent was
// too busy or stopping to take runs when it is taken, however late.
func (sc *scheduler) firingState(ctx context.Context, id string) (done, tried bool) {
	if _, err := sc.lookup(ctx, id); err == nil {
		return true, true
	}
	tr, err := sc.traces.trace(ctx, id)
	if err != nil || len(tr.Evaluations) == 0 {
		return false, false
	}
	last := tr.Evaluations[len(tr.Evaluations)-1]
	return !transient(last.Reason), true
}

// transient says whether a rejection asks for the trigger again.
func transient(reason string) bool {
	return reason == scenes.ReasonOverloaded || reason == scenes.ReasonShuttingDown || reason == scenes.ReasonInternal
}

// advance moves e's cursor past instant, durably with the next batch of
// trace records.
func (sc *scheduler) advance(e *scheduleEntry, instant time.Time, id string) {
	sc.mu.Lock()
	e.cursor = instant
	if id != "" {
		e.last = id
	}
	e.next = e.when.Next(instant, e.loc)
	e.retry, e.backoff = time.Time{}, 0
	sc.mu.Unlock()
	sc.traces.cursor(e.key, instant, false)
}

// list describes every schedule with its next firings.
func (sc *scheduler) list(n int) []api.ScheduleItem {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	out := make([]api.ScheduleItem, 0, len(sc.entries))
	for _, e := range sc.entries {
		it := api.ScheduleItem{
			ID: e.s.ID(), Scene: e.s.Scene, Name: e.s.Name, When: e.s.When(), TimeZone: zoneName(e.loc),
			Jitter: e.s.Jitter.String(), CatchUp: string(e.s.CatchUp), CatchUpWindow: e.s.CatchUpWindow.String(),
			Cursor: e.cursor.UTC(), LastRequestID: e.last,
		}
		for t := e.next; !t.IsZero() && len(it.Next) < n; t = e.when.Next(t, e.loc) {
			it.Next = append(it.Next, api.Firing{At: e.fireAt(t).In(e.loc), Instant: t.In(e.loc), RequestID: firingID(e.s, t)})
		}
		out = append(out, it)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
