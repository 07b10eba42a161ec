package main

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/store"
)

// The class label of sortie_step_failures_total takes one value per
// error class, however the failures are retried (here with jitter).
// Found by review: the label is the step_error event's Detail, which the
// driver overwrote with text that varied from failure to failure (see
// driver's TestStepErrorEventDetailIsErrorClass).
func TestStepFailureClassLabelIsBounded(t *testing.T) {
	db, err := store.Open(filepath.Join(t.TempDir(), "m.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	m := newMetrics()
	done := make(chan struct{}, 100)
	h := driver.HandlerFunc(func(ctx context.Context, req driver.StepRequest) (map[string]any, error) {
		return nil, driver.RetryableError("busy", errors.New("busy"))
	})
	d, _ := driver.New(driver.Options{Store: db, Handlers: map[string]driver.Handler{"x": h},
		Observers: []driver.Observer{m, driver.ObserverFunc(func(ev driver.Event, _ *driver.Mission) {
			if ev.To.Terminal() {
				done <- struct{}{}
			}
		})}})
	d.Start(context.Background())
	defer d.Stop(context.Background())
	const n = 20
	for range n {
		d.Submit(context.Background(), driver.Spec{Type: "s", Steps: []driver.Step{{ID: "a", Kind: "x",
			Retry: driver.RetryPolicy{MaxAttempts: 3, InitialBackoff: driver.Duration(5 * time.Millisecond), Jitter: 0.5}}}})
	}
	for range n {
		<-done
	}
	series := testutil.CollectAndCount(m.reg, "sortie_step_failures_total")
	t.Logf("sortie_step_failures_total series after %d missions with code=busy: %d", n, series)
	if series > 1 {
		t.Errorf("class label is not bounded: %d series for one class and one code", series)
	}
}
