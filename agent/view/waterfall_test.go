package view

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/driver/waterfall"
)

// TestRenderWaterfall pins the text waterfall of the failed mission: the
// offline waits and the retry's backoff of step 2, the three attempts of
// the jammed lock, the skipped delay, and the two undos after the
// failure, in the order they ran; plain and in colour.
func TestRenderWaterfall(t *testing.T) {
	m, evs := failedMission()
	c := api.Waterfall(m, evs, at(9000))
	golden(t, "show_failed_waterfall.golden", Mission(m, evs, Options{Now: at(9000), Waterfall: c}))
	golden(t, "waterfall_color.golden", Waterfall(c, WaterfallOptions{Color: true, Width: 40}))
}

// TestWaterfallNotesAreNotRed draws a mission whose undo was left alone
// because a newer mission changed the device: only the jammed lock is
// red; the undo left alone is a note, in yellow, naming that mission.
func TestWaterfallNotesAreNotRed(t *testing.T) {
	m, evs := failedMission()
	last := len(evs) - 2 // the undo of step 1
	evs[last].Detail, evs[last].Code = "left alone", driver.CodeSuperseded
	evs[last].Error = "living-light was changed since by newer mission m-new; left as it is"
	m.Results[0].Status = driver.StepSuperseded
	m.Undo[0] = driver.StepResult{Status: driver.StepSucceeded, Attempts: 1, Error: evs[last].Error, Code: driver.CodeSuperseded}
	c := api.Waterfall(m, evs, time.Time{})
	out := Mission(m, evs, Options{Color: true, Waterfall: c})
	for _, line := range strings.Split(out, "\n") {
		red := strings.Contains(line, ansiRed)
		switch {
		case strings.Contains(line, "left alone") || strings.Contains(line, "left as it is"):
			if red || !strings.Contains(line, ansiYellow) {
				t.Errorf("a note drawn as an error (or not as a note): %q", line)
			}
		case strings.Contains(line, "3-front-door") && strings.Contains(line, "│"):
			if !red {
				t.Errorf("the failed step is not red: %q", line)
			}
		}
	}
	if !strings.Contains(out, "(device taken by mission m-new)") {
		t.Errorf("the undo left alone does not name the mission that took the device:\n%s", out)
	}
}

// TestWaterfallFiveHundredSteps draws a 500-step mission: one row per
// step, in order, each with its bar.
func TestWaterfallFiveHundredSteps(t *testing.T) {
	c := bigChart(500)
	out := Waterfall(c, WaterfallOptions{})
	rows := 0
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "│") {
			want := fmt.Sprintf("s%03d ", rows+1)
			if !strings.HasPrefix(strings.TrimSpace(line), want) || !strings.ContainsRune(line, cellRun) {
				t.Fatalf("row %d = %q, want step %s with a bar", rows, line, want)
			}
			rows++
		}
	}
	if rows != 500 {
		t.Errorf("%d rows, want 500", rows)
	}
}

func bigChart(n int) *waterfall.Chart {
	steps := make([]waterfall.Step, n)
	var evs []driver.Event
	for i := range steps {
		steps[i].ID = fmt.Sprintf("s%03d", i+1)
		evs = append(evs,
			driver.Event{Input: driver.InBeginStep, Step: i, Attempt: 1, Time: at(i * 10)},
			driver.Event{Input: driver.InStepOK, Step: i, Attempt: 1, Time: at(i*10 + 7)})
	}
	c := waterfall.Build(steps, evs, t0, time.Time{})
	return &c
}

func BenchmarkWaterfall500(b *testing.B) {
	c := bigChart(500)
	for b.Loop() {
		Waterfall(c, WaterfallOptions{Color: true})
	}
}
