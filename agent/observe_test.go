package agent

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/sortie-edge/sortie/driver"
)

// TestLogObserver: each kind of transition is logged at its level with
// its fields; transitions below the level are not logged at all.
func TestLogObserver(t *testing.T) {
	var buf strings.Builder
	o := logObserver{log: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	m := &driver.Mission{ID: "m1", Type: "go_home", Reason: "step_failed", Error: "jammed"}
	o.Observe(driver.Event{Input: driver.InBeginStep, To: driver.StateStepRunning, StepID: "s1"}, m)
	o.Observe(driver.Event{Input: driver.InStepWait, StepID: "s2", Code: "device_offline", Error: "offline"}, m)
	o.Observe(driver.Event{Input: driver.InStepError, StepID: "s3", Attempt: 2, Detail: "permanent", Code: "jammed", Error: "lock jammed"}, m)
	o.Observe(driver.Event{Input: driver.InFail, To: driver.StateFailed}, m)
	got := buf.String()
	for _, want := range []string{
		`level=INFO msg="step waiting" mission=m1 trace="" scene=go_home step=s2 code=device_offline reason=offline`,
		`level=WARN msg="step failed" mission=m1 trace="" scene=go_home step=s3 attempt=2 class=permanent code=jammed err="lock jammed"`,
		`level=WARN msg="mission finished" mission=m1 trace="" scene=go_home state=FAILED reason=step_failed err=jammed`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("log lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "transition") {
		t.Errorf("a debug transition was logged at info:\n%s", got)
	}
}
