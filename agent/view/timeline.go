package view

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/driver/waterfall"
	"github.com/sortie-edge/sortie/scenes"
)

// Options says how missions are drawn for a terminal.
type Options struct {
	// Verbose appends every event of the timeline.
	Verbose bool
	// Loc is the zone times are shown in; nil means UTC.
	Loc *time.Location
	// Now dates unfinished missions ("running for 3s"); zero leaves it out.
	Now time.Time
	// Color paints failures red and notes (waits, steps that gave way to
	// another mission, undos left alone) yellow, for a terminal.
	Color bool
	// Waterfall, when set, is drawn after the steps (see Waterfall).
	Waterfall *waterfall.Chart
}

// paint wraps s in an ANSI colour when o.Color is set.
func (o Options) paint(code, s string) string {
	if !o.Color || code == "" {
		return s
	}
	return code + s + ansiReset
}

func (o Options) loc() *time.Location {
	if o.Loc == nil {
		return time.UTC
	}
	return o.Loc
}

// stampLayout is how absolute times are shown.
const stampLayout = "2006-01-02 15:04:05.000 MST"

// Mission draws a mission and its timeline for people: a header,
// then each step with its outcome and the story of its attempts (failed
// attempts with their backoff, not-ready waits, recoveries), then the
// compensations that undid steps, then (Verbose) every event. It is a
// pure function of its arguments, so it can be golden-tested.
func Mission(m *driver.Mission, evs []driver.Event, o Options) string {
	var b strings.Builder
	renderHeader(&b, m, o)
	notes := stepNotes(m, evs)
	if m.State.Terminal() || m.State == driver.StateCompensating {
		b.WriteString("\nSteps\n")
	} else {
		fmt.Fprintf(&b, "\nSteps (at %d of %d)\n", min(m.Progress.Step+1, len(m.Steps)), len(m.Steps))
	}
	for i, st := range m.Steps {
		r := driver.StepResult{Status: driver.StepPending}
		if i < len(m.Results) {
			r = m.Results[i]
		}
		current := !m.State.Terminal() && m.State != driver.StateCompensating && i == m.Progress.Step
		mark := ""
		if current {
			mark = "  <- current"
		}
		fmt.Fprintf(&b, "  %d. %s: %s%s\n", i+1, st.ID, stepLabel(st), mark)
		fmt.Fprintf(&b, "     %s\n", o.paint(statusColour(r.Status), resultLine(r, st.ContinueOnError, st.Kind == scenes.DelayKind)))
		writeNotes(&b, notes.forward[i], r, o)
	}
	if order := undoOrder(m, evs); len(order) > 0 {
		b.WriteString("\nUndo (compensations, in the order they ran)\n")
		for _, i := range order {
			u := m.Undo[i]
			fmt.Fprintf(&b, "  %d. %s: undo: %s\n", i+1, m.Steps[i].ID, undoLabel(m.Steps[i]))
			fmt.Fprintf(&b, "     %s\n", o.paint(undoColour(u, m.Results[i].Status), resultLine(u, false, false)))
			writeNotes(&b, notes.undo[i], u, o)
		}
	}
	if o.Waterfall != nil {
		b.WriteString(Waterfall(o.Waterfall, WaterfallOptions{Color: o.Color}))
	}
	if o.Verbose {
		renderEvents(&b, m, evs)
	}
	return b.String()
}

func renderHeader(b *strings.Builder, m *driver.Mission, o Options) {
	tw := newTable(b)
	stamp := func(t time.Time) string { return t.In(o.loc()).Format(stampLayout) }
	row := func(k, format string, args ...any) { tw.row("%s\t%s\n", k, fmt.Sprintf(format, args...)) }
	row("Mission", "%s", m.ID)
	row("Scene", "%s  (priority %d)", m.Type, m.Priority)
	state := string(m.State)
	if m.Reason != "" {
		state += "  (" + m.Reason + ")"
	}
	if m.Control.Cancel && !m.State.Terminal() {
		state += "  cancel requested"
	} else if m.Control.Pause && m.State != driver.StatePaused {
		state += "  pause requested"
	}
	row("State", "%s", state)
	if m.Meta.Source != "" || m.Meta.RequestKey != "" {
		row("Source", "%s  (request %s)", orDash(m.Meta.Source), orDash(m.Meta.RequestKey))
	}
	row("Trace", "%s", m.Meta.TraceID)
	row("Created", "%s", stamp(m.Meta.Created))
	if !m.Meta.Started.IsZero() {
		row("Started", "%s  (%s)", stamp(m.Meta.Started), rel(m.Meta.Started.Sub(m.Meta.Created)))
	}
	switch {
	case !m.Meta.Finished.IsZero():
		row("Finished", "%s  (%s)", stamp(m.Meta.Finished), rel(m.Meta.Finished.Sub(m.Meta.Created)))
		row("Duration", "%s", span(m.Meta.Finished.Sub(m.Meta.Created)))
	case !o.Now.IsZero():
		row("Duration", "%s so far", span(o.Now.Sub(m.Meta.Created)))
	}
	if !m.Meta.Deadline.IsZero() {
		row("Deadline", "%s", stamp(m.Meta.Deadline))
	}
	if m.Progress.Gen > 0 {
		row("Retried", "%s by an operator", times(m.Progress.Gen))
	}
	if m.Error != "" {
		row("Error", "%s", o.paint(ansiRed, m.Error))
	}
	tw.flush()
}

// resultLine summarises one step (or compensation) result. A delay step
// waits by design, without running: its waits are not "not ready" and
// its run time says nothing, so it shows how long it waited instead.
func resultLine(r driver.StepResult, continueOnError, delay bool) string {
	parts := []string{string(r.Status)}
	if r.Status == driver.StepFailed && continueOnError {
		parts[0] += " (on_error = continue)"
	}
	if delay {
		if r.Status == driver.StepSucceeded && !r.Started.IsZero() && r.Finished.After(r.Started) {
			parts = append(parts, "waited "+span(r.Finished.Sub(r.Started)))
		}
		return strings.Join(parts, "  ")
	}
	var facts []string
	if r.Attempts > 0 {
		facts = append(facts, plural(r.Attempts, "attempt"))
	}
	if r.Waits > 0 {
		facts = append(facts, plural(r.Waits, "not-ready wait"))
	}
	if r.Duration > 0 {
		facts = append(facts, span(r.Duration.D()))
	}
	if r.LateAcks > 0 {
		facts = append(facts, plural(r.LateAcks, "late ack")+" ignored")
	}
	if len(facts) > 0 {
		parts = append(parts, strings.Join(facts, ", "))
	}
	return strings.Join(parts, "  ")
}

// note is one line of a step's story, possibly standing for several
// identical not-ready waits in a row.
type note struct {
	at    time.Duration // since the mission was created
	last  time.Duration
	text  string
	bad   bool // a failure (red), not a note
	count int
	key   string // equal keys in a row collapse
}

type notes struct {
	forward map[int][]note
	undo    map[int][]note
}

// stepNotes turns the events into per-step stories. Events of earlier
// runs (before an operator retry) are labelled with their run.
func stepNotes(m *driver.Mission, evs []driver.Event) notes {
	ns := notes{forward: map[int][]note{}, undo: map[int][]note{}}
	retried := false
	for _, ev := range evs {
		if ev.Input == driver.InRetry {
			retried = true
		}
	}
	run := 1
	add := func(to map[int][]note, ev driver.Event, text, key string, bad bool) {
		if retried {
			text = fmt.Sprintf("[run %d] %s", run, text)
			if key != "" { // an empty key means "never collapse"
				key = fmt.Sprintf("%d/%s", run, key)
			}
		}
		at := ev.Time.Sub(m.Meta.Created)
		list := to[ev.Step]
		if n := len(list); n > 0 && key != "" && list[n-1].key == key {
			list[n-1].count++
			list[n-1].last = at
			return
		}
		to[ev.Step] = append(list, note{at: at, last: at, text: text, bad: bad, count: 1, key: key})
	}
	for _, ev := range evs {
		undo := ev.From == driver.StateCompensating || ev.Input == driver.InCompBegin || ev.Input == driver.InCompResult
		target := ns.forward
		if undo {
			target = ns.undo
		}
		switch ev.Input {
		case driver.InRetry:
			run++
			add(ns.forward, ev, "retried by an operator "+strings.TrimPrefix(ev.Detail, "retry "), "", false)
		case driver.InStepWait:
			if ev.Code == scenes.DelayCode {
				continue // the step's label and result say it
			}
			msg := ev.Error + codeSuffix(ev.Code)
			add(target, ev, "not ready, waiting: "+msg, "wait/"+msg, false)
		case driver.InStepError, driver.InCompResult:
			if ev.Input == driver.InCompResult && ev.Error == "" {
				continue // the outcome line says it
			}
			text, key := failureNote(ev)
			add(target, ev, text, key, key == "" && ev.Detail != driver.GaveWay.String() && ev.Detail != "left alone")
		case driver.InRecover:
			add(target, ev, "recovered after a restart; re-executed with the same idempotency key", "", false)
		case driver.InNext:
			if strings.HasPrefix(ev.Detail, "continue_on_error") {
				add(ns.forward, ev, "failed; the mission went on (on_error = continue)", "", true)
			}
		}
	}
	return ns
}

// failureNote words one failed attempt: a retry with its backoff, a
// not-ready wait (which spends no attempt) or a final failure.
func failureNote(ev driver.Event) (text, key string) {
	msg := ev.Error + codeSuffix(ev.Code)
	what := "attempt"
	if ev.Input == driver.InCompResult {
		what = "undo attempt"
	}
	switch {
	case ev.Detail == driver.GaveWay.String() || ev.Detail == "left alone":
		// Not a failure: the step (or undo) gave way to another mission.
		verb := map[string]string{driver.CodeSuperseded: "superseded", driver.CodeSkipped: "skipped"}[ev.Code]
		if ev.Input == driver.InCompResult {
			verb = "undo left alone"
		}
		return fmt.Sprintf("%s %d %s: %s", what, ev.Attempt, verb, strings.TrimPrefix(ev.Error, ev.Code+": ")), ""
	case ev.Detail == driver.NotReady.String() || ev.Detail == "not_ready":
		return "not ready, waiting: " + msg, "wait/" + msg
	case ev.Backoff > 0:
		return fmt.Sprintf("%s %d failed: %s; retry in %s", what, ev.Attempt, msg, ev.Backoff.D().Round(time.Millisecond)), ""
	case strings.HasPrefix(ev.Detail, "retry in "): // events recorded before Backoff existed
		return fmt.Sprintf("%s %d failed: %s; %s", what, ev.Attempt, msg, ev.Detail), ""
	case ev.Detail == "compensation failed":
		return "undo gave up: " + msg, ""
	default:
		return fmt.Sprintf("%s %d failed (%s): %s", what, ev.Attempt, orDash(ev.Detail), msg), ""
	}
}

// writeNotes writes a step's story, then its last error unless the
// story already ends with it.
func writeNotes(b *strings.Builder, ns []note, r driver.StepResult, o Options) {
	for _, n := range ns {
		colour := ansiYellow
		if n.bad {
			colour = ansiRed
		}
		if n.count > 1 {
			fmt.Fprintf(b, "     %-9s %s\n", rel(n.at), o.paint(colour, fmt.Sprintf("%s  (x%d until %s)", n.text, n.count, rel(n.last))))
			continue
		}
		fmt.Fprintf(b, "     %-9s %s\n", rel(n.at), o.paint(colour, n.text))
	}
	if r.Error == "" || r.Status == driver.StepSucceeded {
		return
	}
	if len(ns) == 0 || !strings.Contains(ns[len(ns)-1].text, r.Error) {
		fmt.Fprintf(b, "     %s\n", o.paint(statusColour(r.Status), fmt.Sprintf("last error%s: %s", codeSuffix(r.Code), r.Error)))
	}
}

// statusColour is red for a failed step only: a step that gave way, was
// skipped or waits is a note.
func statusColour(s driver.StepStatus) string {
	switch s {
	case driver.StepFailed:
		return ansiRed
	case driver.StepSucceeded:
		return ansiGreen
	case driver.StepCompensated:
		return ansiPurple
	case driver.StepPending:
		return ""
	}
	return ansiYellow
}

// undoColour colours an undo's result: an undo left alone (its step is
// superseded) is a note, an undo that gave up a failure.
func undoColour(u driver.StepResult, step driver.StepStatus) string {
	switch {
	case step == driver.StepSuperseded:
		return ansiYellow
	case u.Status == driver.StepFailed:
		return ansiRed
	case u.Status == driver.StepSucceeded:
		return ansiPurple
	}
	return ""
}

// undoOrder lists the steps that have a compensation result, in the
// order their compensations began (reverse step order by design).
func undoOrder(m *driver.Mission, evs []driver.Event) []int {
	seen := map[int]bool{}
	var order []int
	has := func(i int) bool { return i >= 0 && i < len(m.Undo) && m.Undo[i].Status != "" && i < len(m.Steps) }
	for _, ev := range evs {
		if ev.Input == driver.InCompBegin && has(ev.Step) && !seen[ev.Step] {
			seen[ev.Step] = true
			order = append(order, ev.Step)
		}
	}
	for i := len(m.Undo) - 1; i >= 0; i-- {
		if has(i) && !seen[i] {
			order = append(order, i)
		}
	}
	return order
}

// undoLabel says what undoing a step does.
func undoLabel(st driver.Step) string {
	c := st.Compensate
	if c == nil {
		return "-"
	}
	if c.Kind == devices.KindRestore {
		var p devices.RestoreParams
		_ = json.Unmarshal(c.Params, &p)
		if p.Device == "" {
			p.Device, _ = devices.ParamsTarget(st.Params)
		}
		return "restore " + p.Device + " to its state before the step"
	}
	return stepLabel(driver.Step{ID: st.ID, Kind: c.Kind, Params: c.Params})
}

// renderEvents lists every event with its time since creation.
func renderEvents(b *strings.Builder, m *driver.Mission, evs []driver.Event) {
	fmt.Fprintf(b, "\nEvents (%d)\n", len(evs))
	var table strings.Builder
	tw := newTable(&table)
	tw.row("  SEQ\tTIME\tINPUT\tTRANSITION\tSTEP\tATTEMPT\tNOTE\n")
	for _, ev := range evs {
		step, attempt := "", ""
		switch {
		case ev.Input == driver.InGroupBegin || ev.Input == driver.InGroupOK || ev.Input == driver.InGroupFail:
			step = "group " + ev.Group
		case ev.StepID != "":
			step = ev.StepID
		case ev.Step >= 0 && ev.Step < len(m.Steps):
			step = m.Steps[ev.Step].ID
		}
		if ev.Attempt > 0 {
			attempt = fmt.Sprint(ev.Attempt)
		}
		transition := string(ev.To)
		if ev.From != "" && ev.From != ev.To {
			transition = string(ev.From) + " -> " + string(ev.To)
		}
		var noteParts []string
		if ev.Detail != "" && ev.Detail != ev.Error {
			d := ev.Detail
			if ev.Backoff > 0 {
				if d == "retry" {
					d = "retry in " + ev.Backoff.D().Round(time.Millisecond).String()
				} else {
					d += ", retry in " + ev.Backoff.D().Round(time.Millisecond).String()
				}
			}
			noteParts = append(noteParts, d)
		}
		if ev.Error != "" {
			noteParts = append(noteParts, ev.Error+codeSuffix(ev.Code))
		}
		tw.row("  %d\t%s\t%s\t%s\t%s\t%s\t%s\n", ev.Seq, rel(ev.Time.Sub(m.Meta.Created)), ev.Input, transition,
			orDash(step), orDash(attempt), strings.Join(noteParts, ": "))
	}
	tw.flush()
	b.WriteString(trimLines(table.String()))
}

// rel shows an offset from the mission's creation: "+1.234s".
func rel(d time.Duration) string {
	if d < 0 {
		return "-" + span(-d)
	}
	return "+" + span(d)
}

// span shows a duration to the millisecond, or to the second past a
// minute.
func span(d time.Duration) string {
	switch {
	case d >= time.Minute:
		return d.Round(time.Second).String()
	case d >= time.Second:
		return d.Round(time.Millisecond).String()
	case d >= time.Millisecond:
		// A device step takes a millisecond or less: "0s" would hide it.
		return d.Round(10 * time.Microsecond).String()
	default:
		return d.Round(time.Microsecond).String()
	}
}

func codeSuffix(code string) string {
	if code == "" {
		return ""
	}
	return " [" + code + "]"
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func times(n int) string {
	if n == 1 {
		return "once"
	}
	return fmt.Sprintf("%d times", n)
}

// table is a tabwriter over a strings.Builder. A write to memory cannot
// fail, so its rows and its flush drop the error here, once, instead of
// at every call.
type table struct{ tw *tabwriter.Writer }

func newTable(b *strings.Builder) table {
	return table{tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)}
}

// row writes one formatted row; cells are separated by tabs and the row
// ends with a newline.
func (t table) row(format string, args ...any) { _, _ = fmt.Fprintf(t.tw, format, args...) }

// flush aligns the rows written so far into the builder.
func (t table) flush() { _ = t.tw.Flush() }

// trimLines drops trailing spaces, which tabwriter leaves on rows whose
// last cell is empty.
func trimLines(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " ")
	}
	return strings.Join(lines, "\n")
}
