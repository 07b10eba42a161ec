package view

import (
	"strings"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/scenes"
)

func TestProgressLines(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 18, 2, 0, 0, time.Local)
	m := &driver.Mission{
		ID: "01a22e8635e600011f9956e3", Type: "go_home",
		Steps: []driver.Step{
			{ID: "s1", Kind: "device.command", Params: []byte(`{"device":"living-light","action":"turn_on","params":{"brightness":80}}`)},
			{ID: "s2", Kind: "delay", Params: []byte(`{"duration":"2s"}`)},
		},
		Results: []driver.StepResult{{Duration: driver.Duration(812 * time.Microsecond)}, {}},
		Meta:    driver.Metadata{Created: t0, Finished: t0.Add(2500 * time.Millisecond), Source: "alexa"},
		Error:   "step s2 failed: boom",
	}
	cases := []struct {
		ev   driver.Event
		want string
	}{
		{driver.Event{Input: driver.InSubmit, To: driver.StatePending}, "accepted (2 steps, from alexa)"},
		{driver.Event{Input: driver.InBeginStep, Step: 0, Attempt: 2}, "step 1/2 living-light turn_on brightness=80 ... (attempt 2)"},
		{driver.Event{Input: driver.InStepOK, Step: 0}, "step 1/2 living-light turn_on brightness=80 ok (812µs)"},
		{driver.Event{Input: driver.InStepError, Step: 0, Error: "ack timeout", Detail: "retryable", Backoff: driver.Duration(250 * time.Millisecond)}, "failed: ack timeout - retry in 250ms"},
		{driver.Event{Input: driver.InStepWait, Step: 0, Error: "device offline"}, "step 1/2 living-light turn_on brightness=80 waiting: device offline"},
		{driver.Event{Input: driver.InBeginStep, Step: 1, Attempt: 1}, "step 2/2 wait 2s ..."},
		{driver.Event{Input: driver.InStepWait, Step: 1, Error: "2s of 2s left", Code: scenes.DelayCode}, ""},
		{driver.Event{Input: driver.InCompensate, Step: 1, Error: "step s2 failed: boom", Code: "step_failed"}, "undoing completed steps"},
		{driver.Event{Input: driver.InCompensate, Step: 1, Error: "cancelled by operator", Code: "cancelled"}, "undoing completed steps: cancelled by operator"},
		{driver.Event{Input: driver.InCompBegin, Step: 0}, "undo step 1/2"},
		{driver.Event{Input: driver.InFail, To: driver.StateFailed}, "FAILED in 2.5s: step s2 failed: boom"},
		{driver.Event{Input: driver.InNext}, ""},
	}
	for _, c := range cases {
		c.ev.Time = t0
		got := ProgressLine(c.ev, m, time.Local)
		if c.want == "" {
			if got != "" {
				t.Errorf("%s: got %q, want no line", c.ev.Input, got)
			}
			continue
		}
		if c.ev.Code == "step_failed" && strings.Contains(got, "boom") {
			t.Errorf("%s: %q repeats the step's error", c.ev.Input, got)
		}
		if !strings.Contains(got, c.want) || !strings.Contains(got, "go_home") || !strings.Contains(got, "1f9956e3") {
			t.Errorf("%s: got %q, want it to contain %q", c.ev.Input, got, c.want)
		}
	}
	// The delay's wait is over: no second "..." line, then how long.
	m.Results[1] = driver.StepResult{Status: driver.StepSucceeded, Waits: 1, Started: t0, Finished: t0.Add(2001 * time.Millisecond)}
	if got := ProgressLine(driver.Event{Input: driver.InBeginStep, Step: 1, Attempt: 1, Time: t0}, m, time.Local); got != "" {
		t.Errorf("delay begun again: %q, want no line", got)
	}
	if got := ProgressLine(driver.Event{Input: driver.InStepOK, Step: 1, Time: t0}, m, time.Local); !strings.Contains(got, "step 2/2 wait 2s done (waited 2.001s)") {
		t.Errorf("delay over: %q", got)
	}
}
