package view

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/driver"
)

// ControlLine says what a control request did; pause and cancel of a
// mission with a step in flight take effect when that step ends.
func ControlLine(action string, it api.MissionItem) string {
	switch {
	case action == "priority":
		return fmt.Sprintf("mission %s: priority %d (%s)", it.ID, it.Priority, it.State)
	case action == "cancel" && it.State == driver.StateCompensating:
		return fmt.Sprintf("mission %s: cancelled; undoing its completed steps (%s)", it.ID, it.State)
	case action == "cancel" && it.Control.Cancel && !it.State.Terminal():
		return fmt.Sprintf("mission %s: cancel requested; it stops when the running step ends (%s)", it.ID, it.State)
	case action == "pause" && it.Control.Pause && it.State != driver.StatePaused:
		return fmt.Sprintf("mission %s: pause requested; it holds when the running step ends (%s)", it.ID, it.State)
	}
	return fmt.Sprintf("mission %s: %s", it.ID, it.State)
}

// List draws a page of missions as a table; again holds the flags
// (" -state FAILED -limit 20") that the hint for the next page repeats.
func List(list api.MissionList, loc *time.Location, again string) string {
	var b strings.Builder
	if len(list.Missions) == 0 {
		b.WriteString("no missions\n")
		return b.String()
	}
	tw := newTable(&b)
	tw.row("ID\tSCENE\tSTATE\tDONE\tCREATED\tDURATION\tSOURCE\tERROR\n")
	for _, m := range list.Missions {
		took := "-"
		if !m.Finished.IsZero() {
			took = span(m.Finished.Sub(m.Created))
		}
		progress := fmt.Sprintf("%d/%d", min(m.Done, m.Steps), m.Steps)
		if m.Undone > 0 {
			progress += fmt.Sprintf(", %d undone", m.Undone)
		}
		tw.row("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.ID, m.Scene, m.State, progress,
			m.Created.In(loc).Format("2006-01-02 15:04:05"), took, orDash(m.Source), oneLine(m.Error, 60))
	}
	tw.flush()
	trimmed := trimLines(b.String())
	b.Reset()
	b.WriteString(trimmed)
	if list.NextCursor != "" {
		fmt.Fprintf(&b, "more: agent missions list%s -cursor %s\n", again, list.NextCursor)
	}
	return b.String()
}

// oneLine shortens s to max runes on one line, for table cells.
func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > max {
		return string(r[:max-1]) + "…"
	}
	return s
}

// Devices draws the device inventory as a table.
func Devices(list api.DeviceList) string {
	var b strings.Builder
	tw := newTable(&b)
	tw.row("ID\tTYPE\tROOM\tNAME\tONLINE\tSTATE\n")
	for _, d := range list.Devices {
		online := "yes"
		if !d.Available {
			online = "NO"
		}
		state := "-"
		if d.State != nil {
			state = kv(d.State)
		}
		tw.row("%s\t%s\t%s\t%s\t%s\t%s\n", d.ID, d.Type, orDash(d.Room), orDash(d.Name), online, state)
	}
	tw.flush()
	var fresh, gone []string
	for _, a := range list.Announced {
		f := a.Found
		if a.Gone {
			gone = append(gone, fmt.Sprintf("  %s (%s %q), since %s", a.Device, f.Protocol, f.Address, a.Since.UTC().Format("2006-01-02 15:04 UTC")))
			continue
		}
		fresh = append(fresh, fmt.Sprintf("  %s %q: %s%s", f.Protocol, f.Address, f.Kind, orEmpty(" ("+f.Name+")", f.Name)))
	}
	if len(fresh) > 0 {
		fmt.Fprintf(&b, "\nannounced, not in the registry (agent devices discover writes their entries):\n%s\n", strings.Join(fresh, "\n"))
	}
	if len(gone) > 0 {
		fmt.Fprintf(&b, "\nin the registry, no longer announced by their ecosystem:\n%s\n", strings.Join(gone, "\n"))
	}
	return trimLines(b.String())
}

// orEmpty is s, or "" when v is empty.
func orEmpty(s, v string) string {
	if v == "" {
		return ""
	}
	return s
}

// Scenes draws the scenes and their parameters as a table.
func Scenes(list api.SceneList) string {
	var b strings.Builder
	tw := newTable(&b)
	tw.row("NAME\tMODE\tPRIORITY\tDEADLINE\tSTEPS\tPARAMS\tDESCRIPTION\n")
	for _, s := range list.Scenes {
		var ps []string
		for _, p := range s.Params {
			switch {
			case p.Required:
				ps = append(ps, p.Name+" (required)")
			case p.Default != nil:
				ps = append(ps, fmt.Sprintf("%s=%v", p.Name, p.Default))
			default:
				ps = append(ps, p.Name)
			}
		}
		sort.Strings(ps)
		tw.row("%s\t%s\t%d\t%s\t%d\t%s\t%s\n", s.Name, s.Mode, s.Priority, s.Deadline, s.Steps,
			orDash(strings.Join(ps, " ")), oneLine(orDash(s.Description), 60))
	}
	tw.flush()
	return trimLines(b.String())
}

// EventLine is one mission event for a terminal, its time in loc (`agent
// missions watch`).
func EventLine(ev driver.Event, loc *time.Location) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s  %-13s", ev.Time.In(loc).Format("15:04:05.000"), ev.Input)
	if ev.From != ev.To && ev.To != "" {
		fmt.Fprintf(&b, " %s -> %s", ev.From, ev.To)
	}
	if ev.StepID != "" {
		fmt.Fprintf(&b, "  step %s", ev.StepID)
		if ev.Attempt > 1 {
			fmt.Fprintf(&b, " (attempt %d)", ev.Attempt)
		}
	}
	if ev.Error != "" {
		fmt.Fprintf(&b, "  %s", ev.Error)
	}
	return b.String()
}
