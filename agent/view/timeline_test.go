package view

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/scenes"
)

var update = flag.Bool("update", false, "rewrite the golden files of the CLI output tests")

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		out := filepath.Join(t.TempDir(), name)
		_ = os.WriteFile(out, []byte(got), 0o644)
		t.Errorf("output differs from %s (got written to %s):\n%s", path, out, got)
	}
}

// t0 is the creation time of the golden missions.
var t0 = time.Date(2025, 3, 1, 21, 30, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func rawJSON(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}

// failedMission is a mission whose third step jammed: the second step
// waited for an offline device and retried a lost ack; compensation
// undid the first two steps in reverse, one of them after a retry.
func failedMission() (*driver.Mission, []driver.Event) {
	restore := &driver.Compensation{Kind: "device.restore"}
	m := &driver.Mission{
		ID: "0195508a1f400001c0ffee00", Type: "movie_night", Priority: 55, State: driver.StateFailed,
		Reason: "step_failed", Error: "step 3-front-door failed: gave up after 3 attempts: device jammed",
		Steps: []driver.Step{
			{ID: "1-living-light", Kind: "device.command", Params: rawJSON(map[string]any{"device": "living-light", "action": "turn_on", "params": map[string]any{"brightness": 20}}), Compensate: restore},
			{ID: "2-living-ac", Kind: "device.command", Params: rawJSON(map[string]any{"device": "living-ac", "action": "set", "params": map[string]any{"power": "on", "target": 22}}), Compensate: restore},
			{ID: "3-front-door", Kind: "device.command", Params: rawJSON(map[string]any{"device": "front-door", "action": "lock"})},
			{ID: "4-delay", Kind: "delay", Params: rawJSON(map[string]any{"duration": "2s"})},
		},
		Results: []driver.StepResult{
			{Status: driver.StepCompensated, Attempts: 1, Duration: driver.Duration(124 * time.Millisecond)},
			{Status: driver.StepCompensated, Attempts: 2, Waits: 2, Duration: driver.Duration(410 * time.Millisecond), LateAcks: 1},
			{Status: driver.StepFailed, Attempts: 3, Duration: driver.Duration(300 * time.Millisecond), Error: "gave up after 3 attempts: device jammed", Code: "jammed"},
			{Status: driver.StepSkipped},
		},
		Undo: []driver.StepResult{
			{Status: driver.StepSucceeded, Attempts: 1, Duration: driver.Duration(90 * time.Millisecond)},
			{Status: driver.StepSucceeded, Attempts: 2, Duration: driver.Duration(490 * time.Millisecond)},
			{}, {},
		},
		Progress: driver.Progress{Step: 2, Undo: -1, Cause: driver.StateFailed},
		Meta: driver.Metadata{
			Created: t0, Started: at(5), Updated: at(4310), Finished: at(4310), Deadline: at(180000),
			TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", RequestKey: "r-movie", Source: "alexa",
		},
	}
	type e = driver.Event
	evs := []e{
		{Input: driver.InSubmit, To: driver.StatePending, Step: -1, Detail: "alexa"},
		{Input: driver.InStart, From: driver.StatePending, To: driver.StateRunning, Step: -1, Time: at(5)},
		{Input: driver.InBeginStep, From: driver.StateRunning, To: driver.StateStepRunning, Step: 0, Attempt: 1, Time: at(6)},
		{Input: driver.InStepOK, From: driver.StateStepRunning, To: driver.StateStepSucceeded, Step: 0, Attempt: 1, Time: at(130)},
		{Input: driver.InNext, From: driver.StateStepSucceeded, To: driver.StateRunning, Step: 0, Time: at(131)},
		{Input: driver.InBeginStep, From: driver.StateRunning, To: driver.StateStepRunning, Step: 1, Attempt: 1, Time: at(132)},
		{Input: driver.InStepWait, From: driver.StateStepRunning, To: driver.StateRunning, Step: 1, Attempt: 1, Time: at(140), Error: "device living-ac is offline", Code: "device_offline"},
		{Input: driver.InBeginStep, From: driver.StateRunning, To: driver.StateStepRunning, Step: 1, Attempt: 1, Time: at(1140)},
		{Input: driver.InStepWait, From: driver.StateStepRunning, To: driver.StateRunning, Step: 1, Attempt: 1, Time: at(1150), Error: "device living-ac is offline", Code: "device_offline"},
		{Input: driver.InBeginStep, From: driver.StateRunning, To: driver.StateStepRunning, Step: 1, Attempt: 1, Time: at(2000)},
		{Input: driver.InStepError, From: driver.StateStepRunning, To: driver.StateStepFailed, Step: 1, Attempt: 1, Time: at(2300), Detail: "retryable", Backoff: driver.Duration(200 * time.Millisecond), Error: "ack timeout after 300ms", Code: "ack_timeout"},
		{Input: driver.InBeginStep, From: driver.StateStepFailed, To: driver.StateStepRunning, Step: 1, Attempt: 2, Time: at(2500)},
		{Input: driver.InStepOK, From: driver.StateStepRunning, To: driver.StateStepSucceeded, Step: 1, Attempt: 2, Time: at(2600)},
		{Input: driver.InNext, From: driver.StateStepSucceeded, To: driver.StateRunning, Step: 1, Time: at(2601)},
		{Input: driver.InBeginStep, From: driver.StateRunning, To: driver.StateStepRunning, Step: 2, Attempt: 1, Time: at(2602)},
		{Input: driver.InStepError, From: driver.StateStepRunning, To: driver.StateStepFailed, Step: 2, Attempt: 1, Time: at(2700), Detail: "retryable", Backoff: driver.Duration(200 * time.Millisecond), Error: "device jammed", Code: "jammed"},
		{Input: driver.InBeginStep, From: driver.StateStepFailed, To: driver.StateStepRunning, Step: 2, Attempt: 2, Time: at(2900)},
		{Input: driver.InStepError, From: driver.StateStepRunning, To: driver.StateStepFailed, Step: 2, Attempt: 2, Time: at(3000), Detail: "retryable", Backoff: driver.Duration(400 * time.Millisecond), Error: "device jammed", Code: "jammed"},
		{Input: driver.InBeginStep, From: driver.StateStepFailed, To: driver.StateStepRunning, Step: 2, Attempt: 3, Time: at(3400)},
		{Input: driver.InStepError, From: driver.StateStepRunning, To: driver.StateStepFailed, Step: 2, Attempt: 3, Time: at(3500), Detail: "retryable", Error: "gave up after 3 attempts: device jammed", Code: "jammed"},
		{Input: driver.InCompensate, From: driver.StateStepFailed, To: driver.StateCompensating, Step: 2, Time: at(3500), Error: "step 3-front-door failed: gave up after 3 attempts: device jammed", Code: "jammed"},
		{Input: driver.InCompBegin, From: driver.StateCompensating, To: driver.StateCompensating, Step: 1, Attempt: 1, Time: at(3510), Detail: "compensation"},
		{Input: driver.InCompResult, From: driver.StateCompensating, To: driver.StateCompensating, Step: 1, Attempt: 1, Time: at(3900), Detail: "retry", Backoff: driver.Duration(200 * time.Millisecond), Error: "ack timeout after 300ms", Code: "ack_timeout"},
		{Input: driver.InCompBegin, From: driver.StateCompensating, To: driver.StateCompensating, Step: 1, Attempt: 2, Time: at(4100), Detail: "compensation"},
		{Input: driver.InCompResult, From: driver.StateCompensating, To: driver.StateCompensating, Step: 1, Attempt: 2, Time: at(4200), Detail: "compensated"},
		{Input: driver.InCompBegin, From: driver.StateCompensating, To: driver.StateCompensating, Step: 0, Attempt: 1, Time: at(4210), Detail: "compensation"},
		{Input: driver.InCompResult, From: driver.StateCompensating, To: driver.StateCompensating, Step: 0, Attempt: 1, Time: at(4300), Detail: "compensated"},
		{Input: driver.InFail, From: driver.StateCompensating, To: driver.StateFailed, Step: -1, Time: at(4310)},
	}
	for i := range evs {
		evs[i].MissionID, evs[i].Seq, evs[i].Type = m.ID, uint64(i+1), m.Type
		if evs[i].Time.IsZero() {
			evs[i].Time = t0
		}
		if s := evs[i].Step; s >= 0 {
			evs[i].StepID = m.Steps[s].ID
		}
	}
	return m, evs
}

func TestRenderFailedMission(t *testing.T) {
	m, evs := failedMission()
	golden(t, "show_failed.golden", Mission(m, evs, Options{Now: at(9000)}))
	golden(t, "show_failed_verbose.golden", Mission(m, evs, Options{Verbose: true, Now: at(9000)}))
}

// TestRenderRunningMission draws a live mission: the current step, a
// pending pause and its age, and an earlier run's failure after an
// operator retry.
func TestRenderRunningMission(t *testing.T) {
	m := &driver.Mission{
		ID: "0195508a1f400002c0ffee00", Type: "go_home", Priority: 60, State: driver.StateStepRunning,
		Steps: []driver.Step{
			{ID: "living-light-on", Kind: "device.command", Params: rawJSON(map[string]any{"device": "living-light", "action": "turn_on"})},
			{ID: "2-wait-door", Kind: "device.wait_state", Params: rawJSON(map[string]any{"device": "front-door", "state": map[string]any{"lock": "locked"}})},
		},
		Results: []driver.StepResult{
			{Status: driver.StepSucceeded, Attempts: 1, Duration: driver.Duration(80 * time.Millisecond)},
			{Status: driver.StepRunning, Attempts: 1},
		},
		Progress: driver.Progress{Step: 1, Attempt: 1, Gen: 1},
		Control:  driver.Control{Pause: true},
		Meta:     driver.Metadata{Created: t0, Started: at(2), Updated: at(6000), TraceID: "trace-2"},
	}
	evs := []driver.Event{
		{Seq: 1, Input: driver.InSubmit, To: driver.StatePending, Step: -1, Time: t0},
		{Seq: 2, Input: driver.InBeginStep, From: driver.StateRunning, To: driver.StateStepRunning, Step: 0, StepID: "living-light-on", Attempt: 1, Time: at(3)},
		{Seq: 3, Input: driver.InStepError, From: driver.StateStepRunning, To: driver.StateStepFailed, Step: 0, StepID: "living-light-on", Attempt: 1, Time: at(50), Detail: "permanent", Error: "bad brightness", Code: "invalid_param"},
		{Seq: 4, Input: driver.InFail, From: driver.StateStepFailed, To: driver.StateFailed, Step: -1, Time: at(51)},
		{Seq: 5, Input: driver.InRetry, From: driver.StateFailed, To: driver.StateRunning, Step: 0, Time: at(5000), Detail: "retry from step living-light-on"},
		{Seq: 6, Input: driver.InBeginStep, From: driver.StateRunning, To: driver.StateStepRunning, Step: 0, StepID: "living-light-on", Attempt: 1, Time: at(5001)},
		{Seq: 7, Input: driver.InStepOK, From: driver.StateStepRunning, To: driver.StateStepSucceeded, Step: 0, StepID: "living-light-on", Attempt: 1, Time: at(5081)},
		{Seq: 8, Input: driver.InBeginStep, From: driver.StateRunning, To: driver.StateStepRunning, Step: 1, StepID: "2-wait-door", Attempt: 1, Time: at(5100)},
	}
	got := Mission(m, evs, Options{Now: at(6500)})
	golden(t, "show_running.golden", got)
	for _, want := range []string{"pause requested", "<- current", "[run 1] attempt 1 failed (permanent)", "6.5s so far", "Retried   once"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

// TestRenderKeepsAttemptsAfterRetry: after an operator retry, the first
// run's attempts are still listed one by one, not folded into one line.
func TestRenderKeepsAttemptsAfterRetry(t *testing.T) {
	m, evs := failedMission()
	evs = append(evs, driver.Event{MissionID: m.ID, Seq: uint64(len(evs) + 1), Input: driver.InRetry, From: driver.StateFailed, To: driver.StateRunning, Step: 0, Time: at(5000), Detail: "retry from step 1-living-light"})
	out := Mission(m, evs, Options{Now: at(9000)})
	for _, want := range []string{"[run 1] attempt 1 failed: device jammed", "[run 1] attempt 2 failed: device jammed", "retry in 400ms"} {
		if !strings.Contains(out, want) {
			t.Errorf("render after retry lacks %q:\n%s", want, out)
		}
	}
}

// TestRenderDelayStep: a delay step waits by design: it shows how long,
// not "not ready" waits and a run time of 0s.
func TestRenderDelayStep(t *testing.T) {
	m := &driver.Mission{
		ID: "0195508a1f400003c0ffee00", Type: "movie_night", State: driver.StateSucceeded,
		Steps: []driver.Step{{ID: "1-delay", Kind: scenes.DelayKind, Params: rawJSON(map[string]any{"duration": "2s"})}},
		Results: []driver.StepResult{{Status: driver.StepSucceeded, Attempts: 1, Waits: 1, Duration: driver.Duration(50 * time.Microsecond),
			Started: at(10), Finished: at(2012)}},
		Meta: driver.Metadata{Created: t0, Started: at(5), Finished: at(2013)},
	}
	evs := []driver.Event{
		{Seq: 1, Input: driver.InSubmit, To: driver.StatePending, Step: -1, Time: t0},
		{Seq: 2, Input: driver.InBeginStep, To: driver.StateStepRunning, Step: 0, StepID: "1-delay", Attempt: 1, Time: at(10)},
		{Seq: 3, Input: driver.InStepWait, To: driver.StateRunning, Step: 0, StepID: "1-delay", Time: at(11), Error: "delay: 2s of 2s left", Code: scenes.DelayCode},
		{Seq: 4, Input: driver.InBeginStep, To: driver.StateStepRunning, Step: 0, StepID: "1-delay", Attempt: 1, Time: at(2011)},
		{Seq: 5, Input: driver.InStepOK, To: driver.StateStepSucceeded, Step: 0, StepID: "1-delay", Attempt: 1, Time: at(2012)},
	}
	out := Mission(m, evs, Options{Now: at(3000)})
	if !strings.Contains(out, "succeeded  waited 2.002s") {
		t.Errorf("the delay's wait is not shown:\n%s", out)
	}
	for _, bad := range []string{"not ready", "not-ready", "50µs"} {
		if strings.Contains(out, bad) {
			t.Errorf("output has %q:\n%s", bad, out)
		}
	}
}
