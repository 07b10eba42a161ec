package driver

import (
	"strings"
	"testing"
	"time"
)

// TestSettle is the table of what settle does to a mission at rest: the
// transition it takes on the transaction (state reached, events fired)
// and what the worker does next. settle reads and changes only the
// transaction, so each case is a mission and a clock.
func TestSettle(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	two := func(mut func(m *Mission)) *Mission {
		m := &Mission{
			ID: "m", Type: "t", State: StateRunning,
			Steps:   steps("a!", "b"),
			Results: []StepResult{{Status: StepPending}, {Status: StepPending}},
		}
		mut(m)
		return m
	}
	for _, c := range []struct {
		name   string
		m      *Mission
		act    action
		state  State
		inputs string // the events' inputs, in order
	}{
		{"pending starts and begins its first step", two(func(m *Mission) { m.State = StatePending }),
			actExec, StateStepRunning, "start begin_step"},
		{"pending, cancelled before start", two(func(m *Mission) { m.State = StatePending; m.Control.Cancel = true }),
			actRest, StateCancelled, "cancel"},
		{"pending, paused before start", two(func(m *Mission) { m.State = StatePending; m.Control.Pause = true }),
			actRest, StatePaused, "pause"},
		{"pending past its deadline", two(func(m *Mission) { m.State = StatePending; m.Meta.Deadline = now }),
			actRest, StateFailed, "fail"},
		{"a step succeeded: the next one begins", two(func(m *Mission) {
			m.State = StateStepSucceeded
			m.Results[0].Status = StepSucceeded
		}), actExec, StateStepRunning, "next begin_step"},
		{"the last step succeeded: complete", two(func(m *Mission) {
			m.State, m.Progress.Step = StateStepSucceeded, 1
			m.Results[0].Status, m.Results[1].Status = StepSucceeded, StepSucceeded
		}), actRest, StateSucceeded, "next complete"},
		{"a retry not yet due rests", two(func(m *Mission) {
			m.State, m.Due = StateStepFailed, now.Add(time.Second)
			m.Results[0].Attempts = 1
		}), actRest, StateStepFailed, ""},
		{"a due retry begins the next attempt", two(func(m *Mission) {
			m.State, m.Due = StateStepFailed, now
			m.Results[0].Attempts = 1
		}), actExec, StateStepRunning, "begin_step"},
		{"cancelled at a boundary with a step done: compensate", two(func(m *Mission) {
			m.State, m.Progress.Step = StateRunning, 1
			m.Results[0].Status = StepSucceeded
			m.Control.Cancel = true
		}), actRest, StateCompensating, "compensate"},
		{"paused at a boundary", two(func(m *Mission) { m.Control.Pause = true }),
			actRest, StatePaused, "pause"},
		{"running past its deadline, nothing to undo", two(func(m *Mission) { m.Meta.Deadline = now.Add(-time.Second) }),
			actRest, StateFailed, "fail"},
		{"paused rests, even with a deadline ahead", two(func(m *Mission) {
			m.State, m.Meta.Deadline = StatePaused, now.Add(time.Hour)
		}), actRest, StatePaused, ""},
		{"a step in flight is executed", two(func(m *Mission) { m.State = StateStepRunning }),
			actExec, StateStepRunning, ""},
		{"compensating begins the undo of the last done step", two(func(m *Mission) {
			m.State, m.Progress.Undo = StateCompensating, 1
			m.Results[0].Status = StepSucceeded
			m.Undo = make([]StepResult, 2)
		}), actCompExc, StateCompensating, "comp_begin"},
		{"compensating with nothing left ends as its cause", two(func(m *Mission) {
			m.State, m.Progress.Undo, m.Progress.Cause = StateCompensating, -1, StateCancelled
			m.Undo = make([]StepResult, 2)
		}), actRest, StateCancelled, "cancel"},
	} {
		t.Run(c.name, func(t *testing.T) {
			d, _, _, _ := fixture(t, Options{})
			tx := &txn{m: c.m, now: now}
			act, err := d.settle(tx)
			if err != nil {
				t.Fatal(err)
			}
			var inputs []string
			for _, ev := range tx.events {
				inputs = append(inputs, string(ev.Input))
			}
			if act != c.act || tx.m.State != c.state || strings.Join(inputs, " ") != c.inputs {
				t.Errorf("settle: action %d, state %s, events %q; want %d, %s, %q", act, tx.m.State, inputs, c.act, c.state, c.inputs)
			}
		})
	}
}
