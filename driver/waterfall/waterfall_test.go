package waterfall

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
)

var t0 = time.Date(2026, 12, 6, 21, 0, 0, 0, time.UTC)

// tl builds a timeline: each event at t0 plus ms milliseconds.
type tl []driver.Event

func (l tl) add(ms int, ev driver.Event) tl {
	ev.Seq, ev.Time = uint64(len(l)+1), t0.Add(time.Duration(ms)*time.Millisecond)
	return append(l, ev)
}

func ev(in driver.Input, step, attempt int) driver.Event {
	return driver.Event{Input: in, Step: step, Attempt: attempt}
}

func with(e driver.Event, f func(*driver.Event)) driver.Event { f(&e); return e }

// shape is a bar as a test reads it: "id outcome start-end kinds".
func shape(b Bar) string {
	s := fmt.Sprintf("%s undo=%v %s %d-%dms", b.ID, b.Undo, b.Outcome, b.StartUS/1000, b.EndUS/1000)
	for _, g := range b.Segments {
		s += fmt.Sprintf(" %s", g.Kind)
		if g.Why != "" {
			s += "(" + g.Why + ")"
		}
		if g.Outcome != "" {
			s += ":" + g.Outcome
		}
	}
	return s
}

func TestBuildDrawsEachStepAttemptWaitAndUndo(t *testing.T) {
	steps := []Step{{ID: "1-light", Command: "turn_on", Device: "light"}, {ID: "2-ac"}, {ID: "3-lock"}, {ID: "4-delay"}}
	superseded := "bedroom-curtain was changed since by newer mission m-new; left as it is"
	cases := []struct {
		name     string
		evs      tl
		now      time.Time
		want     []string
		failedMS int64
		takenBy  string
	}{
		{
			name: "compensated after a permanent failure, undo in reverse after it",
			evs: tl{}.
				add(0, ev(driver.InStart, -1, 0)).
				add(1, ev(driver.InBeginStep, 0, 1)).add(5, ev(driver.InStepOK, 0, 1)).
				add(6, ev(driver.InBeginStep, 1, 1)).
				add(10, with(ev(driver.InStepWait, 1, 1), func(e *driver.Event) { e.Code, e.Error = "device_offline", "device ac is offline" })).
				add(100, ev(driver.InBeginStep, 1, 1)).
				add(400, with(ev(driver.InStepError, 1, 1), func(e *driver.Event) {
					e.Code, e.Detail, e.Error, e.Backoff = "ack_timeout", "retryable", "ack timeout", driver.Duration(200*time.Millisecond)
				})).
				add(550, ev(driver.InBeginStep, 1, 2)).add(560, ev(driver.InStepOK, 1, 2)).
				add(561, ev(driver.InBeginStep, 2, 1)).
				add(600, with(ev(driver.InStepError, 2, 1), func(e *driver.Event) { e.Code, e.Detail, e.Error = "jammed", "permanent", "jammed" })).
				add(600, with(ev(driver.InCompensate, 2, 0), func(e *driver.Event) { e.Error = "step 3-lock failed: jammed" })).
				add(601, ev(driver.InCompBegin, 1, 1)).add(650, with(ev(driver.InCompResult, 1, 1), func(e *driver.Event) { e.Detail = "compensated" })).
				add(651, ev(driver.InCompBegin, 0, 1)).
				add(700, with(ev(driver.InCompResult, 0, 1), func(e *driver.Event) {
					e.Detail, e.Code, e.Error = "left alone", driver.CodeSuperseded, superseded
				})).
				add(701, ev(driver.InFail, -1, 0)),
			want: []string{
				"1-light undo=false succeeded 1-5ms run:succeeded",
				"2-ac undo=false succeeded 6-560ms run:waiting wait(offline) run:retry backoff run:succeeded",
				"3-lock undo=false failed 561-600ms run:failed",
				"4-delay undo=false not_run 0-0ms",
				"2-ac undo=true undone 601-650ms run:undone",
				"1-light undo=true left_alone 651-700ms run:left_alone",
			},
			failedMS: 600,
			takenBy:  "m-new",
		},
		{
			name: "parallel branches overlap, one fails",
			evs: tl{}.
				add(0, with(ev(driver.InGroupBegin, 0, 0), func(e *driver.Event) { e.Group = "1-parallel" })).
				add(1, with(ev(driver.InBeginStep, 0, 1), func(e *driver.Event) { e.Group = "1-parallel" })).
				add(1, with(ev(driver.InBeginStep, 1, 1), func(e *driver.Event) { e.Group = "1-parallel" })).
				add(1, with(ev(driver.InBeginStep, 2, 1), func(e *driver.Event) { e.Group = "1-parallel" })).
				add(20, with(ev(driver.InStepOK, 1, 1), func(e *driver.Event) { e.Group = "1-parallel" })).
				add(30, with(ev(driver.InStepError, 0, 1), func(e *driver.Event) {
					e.Group, e.Detail, e.Error, e.Code = "1-parallel", "permanent", "jammed", "jammed"
				})).
				add(40, with(ev(driver.InStepOK, 2, 1), func(e *driver.Event) { e.Group = "1-parallel" })),
			want: []string{
				"1-light undo=false failed 1-30ms run:failed",
				"2-ac undo=false succeeded 1-20ms run:succeeded",
				"3-lock undo=false succeeded 1-40ms run:succeeded",
				"4-delay undo=false not_run 0-0ms",
			},
			failedMS: -1,
		},
		{
			name: "superseded step names the mission that took the device",
			evs: tl{}.
				add(1, ev(driver.InBeginStep, 0, 1)).
				add(3, with(ev(driver.InStepError, 0, 1), func(e *driver.Event) {
					e.Code, e.Detail, e.Error = driver.CodeSuperseded, "gave_way", "superseded: light was commanded by newer mission m-7"
				})),
			want:     []string{"1-light undo=false superseded 1-3ms run:superseded", "2-ac undo=false not_run 0-0ms", "3-lock undo=false not_run 0-0ms", "4-delay undo=false not_run 0-0ms"},
			failedMS: -1,
			takenBy:  "m-7",
		},
		{
			name: "outcomes without their begins run after the previous event",
			evs: tl{}.
				add(1, ev(driver.InBeginStep, 3, 1)).
				add(2, with(ev(driver.InStepWait, 3, 1), func(e *driver.Event) { e.Code, e.Error = "delay", "waiting 2s" })).
				add(2002, ev(driver.InStepOK, 3, 1)).
				add(2010, with(ev(driver.InCompensate, 3, 0), func(e *driver.Event) { e.Error = "cancelled" })).
				add(2040, with(ev(driver.InCompResult, 1, 1), func(e *driver.Event) { e.Detail = "undone" })).
				add(2070, with(ev(driver.InCompResult, 0, 1), func(e *driver.Event) { e.Detail = "undone" })),
			want: []string{
				"1-light undo=false not_run 0-0ms", "2-ac undo=false not_run 0-0ms", "3-lock undo=false not_run 0-0ms",
				"4-delay undo=false succeeded 1-2002ms run:waiting wait(delay) run:succeeded",
				"2-ac undo=true undone 2010-2040ms run:undone",
				"1-light undo=true undone 2040-2070ms run:undone",
			},
			failedMS: 2010,
		},
		{
			name: "a running step and a delay's wait end at now",
			evs: tl{}.
				add(1, ev(driver.InBeginStep, 0, 1)).add(2, ev(driver.InStepOK, 0, 1)).
				add(3, ev(driver.InBeginStep, 3, 1)).
				add(4, with(ev(driver.InStepWait, 3, 1), func(e *driver.Event) { e.Code, e.Error = "delay", "2s of 2s left" })),
			now:      t0.Add(time.Second),
			want:     []string{"1-light undo=false succeeded 1-2ms run:succeeded", "2-ac undo=false not_run 0-0ms", "3-lock undo=false not_run 0-0ms", "4-delay undo=false waiting 3-1000ms run:waiting wait(delay)"},
			failedMS: -1,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := Build(steps, tc.evs, t0, tc.now)
			if len(c.Bars) != len(tc.want) {
				for _, b := range c.Bars {
					t.Log(shape(b))
				}
				t.Fatalf("%d bars, want %d", len(c.Bars), len(tc.want))
			}
			taken := ""
			for i, b := range c.Bars {
				if got := shape(b); got != tc.want[i] {
					t.Errorf("bar %d = %q, want %q", i, got, tc.want[i])
				}
				if b.TakenBy != "" {
					taken = b.TakenBy
				}
				for _, s := range b.Segments {
					if s.EndUS < s.StartUS || s.EndUS > c.TotalUS {
						t.Errorf("bar %d segment %+v outside 0..%d", i, s, c.TotalUS)
					}
				}
			}
			if got := c.FailedUS; got != tc.failedMS*1000 && (got >= 0 || tc.failedMS >= 0) {
				t.Errorf("FailedUS = %d, want %d ms", got, tc.failedMS)
			}
			if taken != tc.takenBy {
				t.Errorf("TakenBy = %q, want %q", taken, tc.takenBy)
			}
			if c.Bars[0].Command != "turn_on" || c.Bars[0].Device != "light" {
				t.Errorf("bar 0 = %+v, want the step's command and device", c.Bars[0])
			}
		})
	}
}

// bigTimeline is a 500-step mission whose every step retried once.
func bigTimeline(n int) ([]Step, []driver.Event) {
	steps := make([]Step, n)
	var l tl
	ms := 0
	for i := range steps {
		steps[i] = Step{ID: fmt.Sprintf("%d-light-%d", i+1, i)}
		l = l.add(ms, ev(driver.InBeginStep, i, 1))
		l = l.add(ms+2, with(ev(driver.InStepError, i, 1), func(e *driver.Event) { e.Detail, e.Backoff = "retryable", driver.Duration(time.Millisecond) }))
		l = l.add(ms+3, ev(driver.InBeginStep, i, 2))
		l = l.add(ms+4, ev(driver.InStepOK, i, 2))
		ms += 5
	}
	return steps, l
}

func TestBuildFiveHundredStepsInOrder(t *testing.T) {
	steps, evs := bigTimeline(500)
	c := Build(steps, evs, t0, time.Time{})
	if len(c.Bars) != 500 {
		t.Fatalf("%d bars, want 500", len(c.Bars))
	}
	for i, b := range c.Bars {
		if b.Step != i || len(b.Segments) != 3 || b.Outcome != "succeeded" || b.Attempts != 2 {
			t.Fatalf("bar %d = %s, want step %d succeeded after run, backoff, run", i, shape(b), i)
		}
		if i > 0 && b.StartUS < c.Bars[i-1].EndUS {
			t.Fatalf("bar %d starts before bar %d ends", i, i-1)
		}
	}
	if c.TotalUS != 2499*1000 {
		t.Errorf("TotalUS = %d, want 2499 ms", c.TotalUS)
	}
}

func TestBuildIgnoresEventsOutsideItsSteps(t *testing.T) {
	// Events from a later agent, or damaged ones, never panic.
	evs := tl{}.add(0, ev(driver.InBeginStep, -3, 1)).add(1, ev(driver.InStepOK, 0, 1)).add(2, ev(driver.InCompResult, 0, 1))
	c := Build(nil, evs, t0, time.Time{})
	if len(c.Bars) != 2 || c.Bars[0].Outcome != "succeeded" || !c.Bars[1].Undo {
		t.Errorf("bars = %+v", c.Bars)
	}
}

func BenchmarkBuild500(b *testing.B) {
	steps, evs := bigTimeline(500)
	for b.Loop() {
		Build(steps, evs, t0, time.Time{})
	}
}

// FuzzBuild feeds Build timelines decoded from arbitrary JSON: whatever
// an agent sends the hub, the chart is drawn without a panic and every
// segment lies within it.
func FuzzBuild(f *testing.F) {
	steps, evs := bigTimeline(3)
	seed, _ := json.Marshal(evs)
	f.Add(seed, 3)
	f.Add([]byte(`[{"input":"comp_result","step":0},{"input":"begin_step","step":7,"time":"2026-12-06T21:00:01Z"}]`), 0)
	f.Fuzz(func(t *testing.T, data []byte, n int) {
		var evs []driver.Event
		if json.Unmarshal(data, &evs) != nil || n < 0 || n > 1000 {
			return
		}
		for i := range evs {
			if evs[i].Step > 10000 {
				return // an index that large would only allocate
			}
		}
		c := Build(steps[:min(n, len(steps))], evs, t0, time.Time{})
		for _, b := range c.Bars {
			for _, s := range b.Segments {
				if s.EndUS < s.StartUS || s.EndUS > c.TotalUS || s.StartUS < 0 {
					t.Fatalf("segment %+v outside 0..%d", s, c.TotalUS)
				}
			}
		}
	})
}

func TestBuildKeepsSegmentsWhenTheClockStepsBack(t *testing.T) {
	evs := tl{}.add(10, ev(driver.InBeginStep, 0, 1)).add(4, ev(driver.InStepOK, 0, 1))
	c := Build([]Step{{ID: "a"}}, evs, t0, time.Time{})
	if s := c.Bars[0].Segments[0]; s.EndUS < s.StartUS {
		t.Errorf("segment %+v ends before it starts", s)
	}
}
