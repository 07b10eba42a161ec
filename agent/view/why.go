package view

import (
	"fmt"
	"strings"
	"time"

	"github.com/sortie-edge/sortie/agent/api"
)

// Why draws the answer to "what happened to this trigger": the
// explanation, each evaluation kept, then the mission it started.
func Why(w api.Why, o Options) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Request %s: %s\n", w.RequestID, strings.ToUpper(w.Outcome))
	fmt.Fprintf(&b, "%s\n\n", w.Explanation)
	tw := newTable(&b)
	tw.row("WHEN\tVIA\tSOURCE\tSCENE\tOUTCOME\tREASON\tMISSION\n")
	for i, e := range w.Evaluations {
		if i == 1 && w.Dropped > 0 {
			tw.row("…\t\t\t\t%d more\t\t\n", w.Dropped)
		}
		tw.row("%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.At.In(o.loc()).Format(stampLayout), orDash(e.Via), orDash(e.Source),
			orDash(e.Scene), e.Outcome, orDash(e.Reason), orDash(e.MissionID))
	}
	tw.flush()
	for _, e := range w.Evaluations {
		if e.Message != "" && e.Reason != "" {
			fmt.Fprintf(&b, "  %s %s: %s\n", e.At.In(o.loc()).Format(stampLayout), e.Reason, e.Message)
		}
	}
	if w.Mission != nil && w.Mission.Mission != nil {
		b.WriteString("\n")
		b.WriteString(Mission(w.Mission.Mission, w.Mission.Timeline, o))
	}
	return trimLines(b.String())
}

// WhyList draws the latest trace records, one line each.
func WhyList(list api.WhyList, o Options) string {
	var b strings.Builder
	tw := newTable(&b)
	tw.row("WHEN\tREQUEST\tVIA\tSCENE\tOUTCOME\tREASON\tTIMES\n")
	for _, w := range list.Traces {
		last := w.Evaluations[len(w.Evaluations)-1]
		tw.row("%s\t%s\t%s\t%s\t%s\t%s\t%d\n", last.At.In(o.loc()).Format(stampLayout), w.RequestID, orDash(last.Via),
			orDash(last.Scene), last.Outcome, orDash(last.Reason), len(w.Evaluations)+int(w.Dropped))
	}
	tw.flush()
	if len(list.Traces) == 0 {
		b.WriteString("(none)\n")
	}
	return trimLines(b.String())
}

// Schedules draws the schedules and their next firings.
func Schedules(list api.ScheduleList) string {
	var b strings.Builder
	tw := newTable(&b)
	tw.row("SCHEDULE\tWHEN\tTIMEZONE\tCATCH-UP\tLAST HANDLED\tNEXT\tTHEN\n")
	const at = "2006-01-02 15:04:05 MST"
	for _, s := range list.Schedules {
		next, then := "never", "-"
		if len(s.Next) > 0 {
			next = s.Next[0].At.Format(at)
		}
		var rest []string
		for _, f := range s.Next[min(1, len(s.Next)):] {
			rest = append(rest, f.At.Format("2006-01-02 15:04"))
		}
		last := "-"
		if !s.Cursor.IsZero() {
			loc := time.UTC // the schedule's zone, as its next firing carries it
			if len(s.Next) > 0 {
				loc = s.Next[0].At.Location()
			}
			last = s.Cursor.In(loc).Format(at)
		}
		if len(rest) > 0 {
			then = strings.Join(rest, ", ")
		}
		catchUp := s.CatchUp
		if s.CatchUp != "skip" {
			catchUp += " within " + s.CatchUpWindow
		}
		when := s.When
		if s.Jitter != "" && s.Jitter != "0s" {
			when += " ±" + s.Jitter
		}
		tw.row("%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, when, s.TimeZone, catchUp, last, next, then)
	}
	tw.flush()
	if len(list.Schedules) == 0 {
		b.WriteString("(no scene has a schedule)\n")
	}
	return trimLines(b.String())
}
