package waterfall

import (
	"strings"
	"time"

	"github.com/sortie-edge/sortie/driver"
)

// Step is what the chart knows of one step besides its events. The hub
// knows only the ID; the agent also fills in Command and Device.
type Step struct {
	ID      string
	Command string
	Device  string
}

// Segment kinds.
const (
	KindRun     = "run"     // an attempt, from its begin to its outcome
	KindWait    = "wait"    // not ready: waiting without spending an attempt
	KindBackoff = "backoff" // after a failed attempt, before the retry
)

// Why a wait waited, from the wait's code.
const (
	WhyOffline = "offline" // the device is offline
	WhyDelay   = "delay"   // a delay step, waiting by design
	WhyState   = "state"   // wait_for: the device's state is not there yet
	WhyHeld    = "held"    // another mission holds the device, or its command is in flight
	WhyOther   = "other"
)

// Outcomes of a bar or a segment, besides the driver's step statuses
// (succeeded, failed, superseded, skipped, waiting, running, pending).
const (
	OutcomeUndone     = "undone"      // a compensation succeeded
	OutcomeLeftAlone  = "left_alone"  // an undo gave way: a newer mission changed the device since
	OutcomeUndoFailed = "undo_failed" // an undo gave up
	OutcomeRetry      = "retry"       // a failed attempt that was tried again
	OutcomeRecovered  = "recovered"   // an attempt cut by a restart, re-executed
	OutcomeNotRun     = "not_run"     // the step never began
)

// Chart is a mission's waterfall. Offsets are from Start, the mission's
// creation, in microseconds, so that a browser needs no duration parser.
type Chart struct {
	Start   time.Time `json:"start"`
	TotalUS int64     `json:"total_us"`
	// FailedUS is when the mission turned to compensation (the failure
	// or cancel), -1 when it never did.
	FailedUS int64 `json:"failed_us"`
	Bars     []Bar `json:"bars"`
}

// Bar is one step, one branch of a group or one compensation.
type Bar struct {
	// Step is the step's index; a compensation's bar has the index of
	// the step it undoes.
	Step    int    `json:"step"`
	ID      string `json:"id"`
	Command string `json:"command,omitempty"`
	Device  string `json:"device,omitempty"`
	// Group is the parallel group's ID for a branch.
	Group string `json:"group,omitempty"`
	// Undo marks a compensation's bar.
	Undo     bool   `json:"undo,omitempty"`
	StartUS  int64  `json:"start_us"`
	EndUS    int64  `json:"end_us"`
	Outcome  string `json:"outcome"`
	Attempts int    `json:"attempts,omitempty"`
	// Reason is the last error or wait's message, Code its code.
	Reason string `json:"reason,omitempty"`
	Code   string `json:"code,omitempty"`
	// TakenBy is the mission a superseded or skipped step (or an undo
	// left alone) gave way to, when its reason names it.
	TakenBy  string    `json:"taken_by,omitempty"`
	Segments []Segment `json:"segments"`
}

// Segment is one stretch of a bar.
type Segment struct {
	Kind    string `json:"kind"`
	StartUS int64  `json:"start_us"`
	EndUS   int64  `json:"end_us"`
	Attempt int    `json:"attempt,omitempty"`
	Outcome string `json:"outcome,omitempty"`
	Why     string `json:"why,omitempty"` // a wait's cause
	Reason  string `json:"reason,omitempty"`
	Code    string `json:"code,omitempty"`
}

// Failure reports whether an outcome is a failure (drawn in red), as
// opposed to a success or a note (superseded, skipped, left alone,
// waiting).
func Failure(outcome string) bool {
	return outcome == string(driver.StepFailed) || outcome == OutcomeUndoFailed || outcome == OutcomeRetry
}

// Build derives the chart of a mission created at start from its steps
// and events (in seq order). A segment still open at the end (a step
// running or waiting) ends at now, or at the last event when now is
// zero or earlier. Steps named by events but not in steps get a bar.
func Build(steps []Step, evs []driver.Event, start, now time.Time) Chart {
	c := Chart{Start: start, FailedUS: -1}
	us := func(t time.Time) int64 { return max(0, t.Sub(start).Microseconds()) }
	end := int64(0)
	for _, ev := range evs {
		end = max(end, us(ev.Time))
	}
	if !now.IsZero() {
		end = max(end, us(now))
	}
	n := len(steps)
	for _, ev := range evs {
		n = max(n, ev.Step+1)
	}
	fwd := make([]Bar, n)
	for i := range fwd {
		fwd[i] = Bar{Step: i, Outcome: OutcomeNotRun}
		if i < len(steps) {
			fwd[i].ID, fwd[i].Command, fwd[i].Device = steps[i].ID, steps[i].Command, steps[i].Device
		}
	}
	undo := map[int]*Bar{}
	var undoOrder []int
	prev := int64(0) // the previous event's offset
	for _, ev := range evs {
		at := us(ev.Time)
		since := prev
		prev = at
		if ev.Input == driver.InCompensate && c.FailedUS < 0 {
			c.FailedUS = at
		}
		if ev.Step < 0 || ev.Step >= n {
			continue
		}
		if ev.Input == driver.InNote || ev.Input == driver.InCompensate || ev.Input == driver.InNext ||
			ev.Input == driver.InGroupBegin || ev.Input == driver.InGroupOK || ev.Input == driver.InGroupFail ||
			ev.Input == driver.InFail || ev.Input == driver.InCancel || ev.Input == driver.InComplete {
			continue
		}
		b := &fwd[ev.Step]
		if ev.Input == driver.InCompBegin || ev.Input == driver.InCompResult ||
			ev.From == driver.StateCompensating && ev.Input == driver.InRecover {
			if undo[ev.Step] == nil {
				undo[ev.Step] = &Bar{Step: ev.Step, ID: b.ID, Command: b.Command, Device: b.Device, Undo: true, Outcome: string(driver.StepRunning)}
				undoOrder = append(undoOrder, ev.Step)
			}
			b = undo[ev.Step]
		}
		if ev.StepID != "" && b.ID == "" {
			b.ID = ev.StepID
		}
		if ev.Group != "" {
			b.Group = ev.Group
		}
		b.Attempts = max(b.Attempts, ev.Attempt)
		apply(b, ev, at, since)
	}
	c.Bars = append(c.Bars, fwd...)
	for _, i := range undoOrder {
		c.Bars = append(c.Bars, *undo[i])
	}
	for i := range c.Bars {
		b := &c.Bars[i]
		if b.Segments == nil {
			b.Segments = []Segment{}
		}
		for j := range b.Segments {
			s := &b.Segments[j]
			if s.EndUS < 0 { // still open
				s.EndUS = max(end, s.StartUS)
			}
			if j == 0 {
				b.StartUS = s.StartUS
			}
			b.EndUS = max(b.EndUS, s.EndUS)
		}
		if b.Undo && b.Outcome == string(driver.StepRunning) && len(b.Segments) > 0 && b.Segments[len(b.Segments)-1].Kind == KindWait {
			b.Outcome = string(driver.StepWaiting)
		}
		b.TakenBy = takenBy(b.Outcome, b.Reason)
	}
	c.TotalUS = end
	for _, b := range c.Bars {
		c.TotalUS = max(c.TotalUS, b.EndUS)
	}
	return c
}

// apply folds one event of a step (or of its undo) into its bar; since
// is the previous event's offset.
func apply(b *Bar, ev driver.Event, at, since int64) {
	open := func() *Segment {
		if n := len(b.Segments); n > 0 && b.Segments[n-1].EndUS < 0 {
			return &b.Segments[n-1]
		}
		return nil
	}
	closeOpen := func(outcome string) {
		if s := open(); s != nil {
			s.EndUS = max(at, s.StartUS) // a clock stepped back ends it, never inverts it
			if s.Kind == KindRun && s.Outcome == "" {
				s.Outcome = outcome
			}
		}
	}
	// A backoff ends when the next attempt begins, however late or early.
	endBackoff := func() {
		if n := len(b.Segments); n > 0 && b.Segments[n-1].Kind == KindBackoff && b.Segments[n-1].EndUS > at {
			b.Segments[n-1].EndUS = max(at, b.Segments[n-1].StartUS)
		}
	}
	// An outcome with no attempt open: a timeline without the begin
	// (an undo from agents that recorded none, a delay ending where it
	// waited). The attempt ran after the previous event, or after the
	// wait it ends.
	if ev.Input == driver.InStepOK || ev.Input == driver.InStepError || ev.Input == driver.InCompResult {
		if s := open(); s != nil && s.Kind != KindRun {
			s.EndUS = max(at, s.StartUS)
		}
		if open() == nil {
			start := since
			if s := last(b); s != nil {
				start = max(start, s.EndUS)
			}
			b.Segments = append(b.Segments, Segment{Kind: KindRun, StartUS: min(start, at), EndUS: -1, Attempt: ev.Attempt})
		}
	}
	switch ev.Input {
	case driver.InBeginStep, driver.InCompBegin, driver.InRecover:
		if ev.Input == driver.InRecover {
			closeOpen(OutcomeRecovered)
		} else {
			closeOpen("")
		}
		endBackoff()
		b.Segments = append(b.Segments, Segment{Kind: KindRun, StartUS: at, EndUS: -1, Attempt: ev.Attempt})
		b.Outcome = string(driver.StepRunning)
	case driver.InStepOK:
		closeOpen(string(driver.StepSucceeded))
		b.Outcome, b.Reason, b.Code = string(driver.StepSucceeded), "", ""
	case driver.InStepWait:
		closeOpen(string(driver.StepWaiting))
		b.wait(ev, at)
	case driver.InStepError, driver.InCompResult:
		outcome := outcomeOf(ev)
		if outcome == string(driver.StepWaiting) {
			closeOpen(outcome)
			b.wait(ev, at)
			return
		}
		closeOpen(outcome)
		if s := last(b); s != nil && s.Kind == KindRun {
			s.Reason, s.Code = ev.Error, ev.Code
		}
		b.Outcome, b.Reason, b.Code = outcome, ev.Error, ev.Code
		if outcome == OutcomeUndone {
			b.Reason, b.Code = "", ""
		}
		if ev.Backoff > 0 {
			b.Segments = append(b.Segments, Segment{Kind: KindBackoff, StartUS: at, EndUS: at + ev.Backoff.D().Microseconds(), Attempt: ev.Attempt})
		}
	case driver.InRetry:
		closeOpen("")
	}
}

// wait opens a not-ready wait, which lasts until the next attempt.
func (b *Bar) wait(ev driver.Event, at int64) {
	b.Segments = append(b.Segments, Segment{Kind: KindWait, StartUS: at, EndUS: -1, Attempt: ev.Attempt, Why: why(ev.Code), Reason: ev.Error, Code: ev.Code})
	b.Outcome, b.Reason, b.Code = string(driver.StepWaiting), ev.Error, ev.Code
}

func last(b *Bar) *Segment {
	if n := len(b.Segments); n > 0 {
		return &b.Segments[n-1]
	}
	return nil
}

// outcomeOf names the outcome of a step_error or comp_result event.
func outcomeOf(ev driver.Event) string {
	notReady := ev.Detail == driver.NotReady.String()
	if ev.Input == driver.InCompResult {
		switch {
		case ev.Detail == "compensated" || ev.Detail == "undone" || ev.Error == "" && ev.Detail == "":
			return OutcomeUndone
		case ev.Detail == "left alone" || ev.Code == driver.CodeSuperseded:
			return OutcomeLeftAlone
		case notReady:
			return string(driver.StepWaiting)
		case ev.Detail == "compensation failed":
			return OutcomeUndoFailed
		}
		return OutcomeRetry
	}
	switch {
	case ev.Code == driver.CodeSuperseded:
		return string(driver.StepSuperseded)
	case ev.Code == driver.CodeSkipped:
		return string(driver.StepSkipped)
	case notReady:
		return string(driver.StepWaiting)
	case ev.Backoff > 0 || strings.HasPrefix(ev.Detail, "retry in "):
		return OutcomeRetry
	}
	return string(driver.StepFailed)
}

// why classifies a not-ready wait by its code. The codes are the
// devices' and scenes' (devices/handlers.go, devices/owners.go,
// scenes/delay.go); this package names them rather than importing them.
func why(code string) string {
	switch code {
	case "device_offline":
		return WhyOffline
	case "delay":
		return WhyDelay
	case "waiting_state":
		return WhyState
	case "device_held", "newer_command_in_flight":
		return WhyHeld
	}
	return WhyOther
}

// takenBy finds the mission a step gave way to in its reason ("... by
// newer mission ID; left as it is", "... held by live mission ID ...").
func takenBy(outcome, reason string) string {
	switch outcome {
	case string(driver.StepSuperseded), string(driver.StepSkipped), OutcomeLeftAlone:
	default:
		return ""
	}
	_, rest, ok := strings.Cut(reason, " mission ")
	if !ok {
		return ""
	}
	id, _, _ := strings.Cut(rest, " ")
	return strings.TrimRight(id, ";,.:)")
}
