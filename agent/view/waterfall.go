package view

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/driver/waterfall"
)

// Cells of the text waterfall.
const (
	cellRun     = '█'
	cellUndo    = '◂' // a compensation runs backwards
	cellWait    = '░'
	cellBackoff = '·'
)

// ANSI colours: red is for what failed; notes (superseded, skipped, left
// alone, waiting) are yellow, so they never read as errors.
const (
	ansiRed    = "\x1b[31m"
	ansiGreen  = "\x1b[32m"
	ansiYellow = "\x1b[33m"
	ansiBlue   = "\x1b[34m"
	ansiPurple = "\x1b[35m"
	ansiDim    = "\x1b[2m"
	ansiReset  = "\x1b[0m"
)

// WaterfallOptions says how a waterfall is drawn.
type WaterfallOptions struct {
	// Width is the time axis in columns; zero means 48.
	Width int
	// Color draws with ANSI colours (for a terminal that is not
	// NO_COLOR).
	Color bool
}

// Waterfall draws a mission's chart as text: a row per bar (steps in
// order, each branch of a parallel group marked ‖, then the undos in the
// order they ran, after the failure), its segments on a shared time axis
// (█ an attempt, ░ a not-ready wait, · a retry's backoff, ◂ an undo),
// and its outcome. Each bar takes at least one column, so a step of a
// microsecond next to a delay of minutes still shows.
func Waterfall(c *waterfall.Chart, o WaterfallOptions) string {
	if c == nil || len(c.Bars) == 0 {
		return ""
	}
	w := o.Width
	if w <= 0 {
		w = 48
	}
	total := max(c.TotalUS, 1)
	col := func(us int64) int { return min(w-1, int(us*int64(w)/total)) }
	paint := func(code, s string) string {
		if !o.Color || code == "" || s == "" {
			return s
		}
		return code + s + ansiReset
	}
	labels := make([]string, len(c.Bars))
	lw := 0
	for i, b := range c.Bars {
		l := b.ID
		if l == "" {
			l = fmt.Sprintf("step %d", b.Step+1)
		}
		switch {
		case b.Undo:
			l = "undo " + l
		case b.Group != "":
			l = "‖ " + l
		}
		labels[i] = l
		lw = max(lw, utf8.RuneCountInString(l))
	}
	lw = min(lw, 28)
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nWaterfall  (%s; %c attempt  %c waiting  %c backoff  %c undo", span(time.Duration(c.TotalUS)*time.Microsecond), cellRun, cellWait, cellBackoff, cellUndo)
	if c.FailedUS >= 0 {
		sb.WriteString("  × failed")
	}
	sb.WriteString(")\n")
	cells := make([]rune, w)
	colours := make([]string, w)
	for i, b := range c.Bars {
		for k := range cells {
			cells[k], colours[k] = ' ', ""
		}
		for _, s := range b.Segments {
			r, code := cellRun, outcomeColour(s.Outcome)
			switch {
			case s.Kind == waterfall.KindWait:
				r, code = cellWait, ansiYellow
			case s.Kind == waterfall.KindBackoff:
				r, code = cellBackoff, ansiDim
			case b.Undo:
				r = cellUndo
			}
			for k := col(s.StartUS); k <= max(col(s.StartUS), col(s.EndUS-1)); k++ {
				// An attempt wins its column from a wait or a backoff.
				if cells[k] == ' ' || cells[k] == cellWait || cells[k] == cellBackoff {
					cells[k], colours[k] = r, code
				}
			}
		}
		sb.WriteString("  ")
		sb.WriteString(pad(labels[i], lw))
		sb.WriteString(" │")
		for k := 0; k < w; {
			j := k
			for j < w && colours[j] == colours[k] {
				j++
			}
			sb.WriteString(paint(colours[k], string(cells[k:j])))
			k = j
		}
		sb.WriteString("│ ")
		sb.WriteString(paint(outcomeColour(b.Outcome), barOutcome(b)))
		sb.WriteString("\n")
	}
	axis := []rune(strings.Repeat("─", w))
	if c.FailedUS >= 0 {
		axis[col(c.FailedUS)] = '×'
	}
	fmt.Fprintf(&sb, "  %s └%s┘\n", strings.Repeat(" ", lw), paint("", string(axis)))
	end := span(time.Duration(c.TotalUS) * time.Microsecond)
	fmt.Fprintf(&sb, "  %s  0%s%s\n", strings.Repeat(" ", lw), strings.Repeat(" ", max(1, w-1-len(end))), end)
	return sb.String()
}

// barOutcome is the text after a bar: its outcome, attempts and time,
// and why it failed, gave way or waits.
func barOutcome(b waterfall.Bar) string {
	out := strings.ReplaceAll(b.Outcome, "_", " ")
	if b.Outcome == waterfall.OutcomeNotRun {
		return out
	}
	var facts []string
	if b.Attempts > 1 {
		facts = append(facts, plural(b.Attempts, "attempt"))
	}
	if b.EndUS > b.StartUS {
		facts = append(facts, span(time.Duration(b.EndUS-b.StartUS)*time.Microsecond))
	}
	if len(facts) > 0 {
		out += "  " + strings.Join(facts, ", ")
	}
	if b.TakenBy != "" {
		out += "  (device taken by mission " + b.TakenBy + ")"
	} else if b.Reason != "" && b.Outcome != string(driver.StepSucceeded) {
		out += "  " + b.Reason + codeSuffix(b.Code)
	}
	return out
}

// outcomeColour is red for a failure only; notes are yellow.
func outcomeColour(outcome string) string {
	switch {
	case waterfall.Failure(outcome):
		return ansiRed
	case outcome == string(driver.StepSucceeded):
		return ansiGreen
	case outcome == waterfall.OutcomeUndone:
		return ansiPurple
	case outcome == string(driver.StepRunning):
		return ansiBlue
	case outcome == waterfall.OutcomeNotRun || outcome == waterfall.OutcomeRecovered:
		return ansiDim
	case outcome == "":
		return ""
	}
	return ansiYellow
}

// pad cuts or pads s to n columns.
func pad(s string, n int) string {
	if k := utf8.RuneCountInString(s); k > n {
		r := []rune(s)
		return string(r[:n-1]) + "…"
	} else if k < n {
		return s + strings.Repeat(" ", n-k)
	}
	return s
}
