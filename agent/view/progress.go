package view

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/scenes"
)

// Progress prints mission events as readable lines for a terminal: the
// `make run` demo and anyone watching an agent by hand. It is a
// driver.Observer; it writes synchronously but only small lines, under a
// mutex, to its writer.
type Progress struct {
	mu  sync.Mutex
	out io.Writer
}

// NewProgress returns a Progress writing to out.
func NewProgress(out io.Writer) *Progress { return &Progress{out: out} }

// stepLabel describes a step from its params: "living-ac set target=24".
func stepLabel(s driver.Step) string {
	var p struct {
		Device   string         `json:"device"`
		Action   string         `json:"action"`
		Params   map[string]any `json:"params"`
		Duration string         `json:"duration"`
		State    map[string]any `json:"state"`
	}
	_ = json.Unmarshal(s.Params, &p)
	switch {
	case s.Kind == "delay":
		return "wait " + p.Duration
	case p.State != nil && p.Device != "":
		return p.Device + " until " + kv(p.State)
	case p.Device != "":
		label := p.Device + " " + p.Action
		if len(p.Params) > 0 {
			label += " " + kv(p.Params)
		}
		return label
	}
	if s.Name != "" {
		return s.Name
	}
	return s.ID
}

func kv(m map[string]any) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	// Sorted for stable output.
	for i := 1; i < len(keys); i++ {
		for j := i; j > 0 && keys[j] < keys[j-1]; j-- {
			keys[j], keys[j-1] = keys[j-1], keys[j]
		}
	}
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%v", k, m[k])
	}
	return strings.Join(parts, " ")
}

func shortID(id string) string {
	if len(id) > 8 {
		return id[len(id)-8:]
	}
	return id
}

// ProgressLine renders one event of m as the progress view does, its
// time in loc, or "" for an event not worth a line: the CLI's trigger
// -wait and missions watch print these.
func ProgressLine(ev driver.Event, m *driver.Mission, loc *time.Location) string {
	n := len(m.Steps)
	step := func(i int) string { return stepOf(m, i) }
	// A delay step waits by design (begin, wait, begin again, ok): one
	// line when it starts and one when it is over say it all.
	delay := ev.Step >= 0 && ev.Step < n && m.Steps[ev.Step].Kind == scenes.DelayKind
	var r driver.StepResult
	if ev.Step >= 0 && ev.Step < len(m.Results) {
		r = m.Results[ev.Step]
	}
	var msg string
	switch {
	case delay && ev.Input == driver.InStepWait && ev.Code == scenes.DelayCode,
		delay && ev.Input == driver.InBeginStep && r.Waits > 0:
		return ""
	case delay && ev.Input == driver.InStepOK:
		msg = step(ev.Step) + " done"
		if !r.Started.IsZero() && r.Finished.After(r.Started) {
			msg += " (waited " + span(r.Finished.Sub(r.Started)) + ")"
		}
	case ev.Input == driver.InSubmit:
		msg = fmt.Sprintf("accepted (%d steps, from %s)", n, orDash(m.Meta.Source))
		if ev.To == driver.StatePaused {
			msg += ", queued behind the previous run"
		}
	case ev.Input == driver.InStart:
		msg = "started"
	case ev.Input == driver.InGroupBegin:
		g0, g1 := driver.GroupBounds(m.Steps, ev.Step)
		msg = fmt.Sprintf("steps %d-%d/%d at once (%s) ...", g0+1, g1, n, ev.Detail)
	case ev.Input == driver.InGroupOK, ev.Input == driver.InGroupFail:
		msg = ev.Detail
	case ev.Input == driver.InBeginStep:
		msg = step(ev.Step) + " ..."
		if ev.Attempt > 1 {
			msg += fmt.Sprintf(" (attempt %d)", ev.Attempt)
		}
	case ev.Input == driver.InStepOK:
		msg = step(ev.Step) + " ok"
		if ev.Step < len(m.Results) {
			msg += fmt.Sprintf(" (%s)", roundDur(m.Results[ev.Step].Duration.D()))
		}
	case ev.Input == driver.InStepError && ev.Detail == driver.GaveWay.String():
		msg = step(ev.Step) + " " + ev.Code + ": " + strings.TrimPrefix(ev.Error, ev.Code+": ")
	case ev.Input == driver.InNote:
		msg = ev.Detail
	case ev.Input == driver.InStepError:
		msg = step(ev.Step) + " failed: " + ev.Error + codeSuffix(ev.Code)
		if ev.Backoff > 0 {
			msg += " - retry in " + ev.Backoff.D().Round(time.Millisecond).String()
		}
	case ev.Input == driver.InStepWait:
		msg = step(ev.Step) + " waiting: " + ev.Error
	case ev.Input == driver.InRecover:
		msg = step(ev.Step) + " recovered after restart (" + ev.Detail + ")"
	case ev.Input == driver.InPause:
		msg = "paused"
	case ev.Input == driver.InResume:
		msg = "resumed"
	case ev.Input == driver.InCompensate:
		msg = "undoing completed steps"
		if ev.Code != "step_failed" {
			msg += ": " + ev.Error // the line before says why a step failed
		}
	case ev.Input == driver.InCompBegin:
		msg = "undo " + step(ev.Step) + " ..."
	case ev.Input == driver.InCompResult:
		msg = "undo " + step(ev.Step) + " " + ev.Detail
		if ev.Error != "" {
			msg += ": " + ev.Error
		}
	case ev.Input == driver.InRetry:
		msg = "retrying: " + ev.Detail
	case ev.Input == driver.InReprioritise:
		msg = ev.Detail
	case ev.Input == driver.InComplete, ev.Input == driver.InFail, ev.Input == driver.InCancel:
		took := m.Meta.Finished.Sub(m.Meta.Created).Round(time.Millisecond)
		msg = fmt.Sprintf("%s in %s", ev.To, took)
		if m.Error != "" {
			msg += ": " + m.Error
		}
	default:
		return ""
	}
	return fmt.Sprintf("%s  %-12s %s  %s", ev.Time.In(loc).Format("15:04:05.000"), m.Type, shortID(m.ID), msg)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// Observe implements driver.Observer.
func (p *Progress) Observe(ev driver.Event, m *driver.Mission) {
	line := ProgressLine(ev, m, time.Local)
	if line == "" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// An observer cannot return an error, and a lost progress line (a
	// closed terminal) is no reason to stop the mission: drop it.
	_, _ = fmt.Fprintln(p.out, line)
}

// roundDur keeps two or three significant digits: 812µs, 4.2ms, 1.35s.
func roundDur(d time.Duration) time.Duration {
	switch {
	case d < time.Millisecond:
		return d.Round(time.Microsecond)
	case d < time.Second:
		return d.Round(100 * time.Microsecond)
	default:
		return d.Round(10 * time.Millisecond)
	}
}

// stepOf names step i of m for a progress line ("" out of range). It is
// kept out of line: inlined at each of progressLine's cases it cost the
// gateway's binary kilobytes.
//
//go:noinline
func stepOf(m *driver.Mission, i int) string {
	if i < 0 || i >= len(m.Steps) {
		return ""
	}
	return fmt.Sprintf("step %d/%d %s", i+1, len(m.Steps), stepLabel(m.Steps[i]))
}
