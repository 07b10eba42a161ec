package scenes

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/testkit"
)

func TestDelayHandler(t *testing.T) {
	start := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	clock := testkit.NewClock(start)
	h := DelayHandler{Clock: clock}
	req := driver.StepRequest{Kind: DelayKind, Params: []byte(`{"duration":"2s"}`), Started: start}

	_, err := h.Execute(context.Background(), req)
	var se *driver.StepError
	if !errors.As(err, &se) || se.Class != driver.NotReady || se.RetryAfter != 2*time.Second || se.Code != "delay" {
		t.Fatalf("at start: got %v (%+v), want not ready for 2s", err, se)
	}
	clock.Advance(1500 * time.Millisecond)
	_, err = h.Execute(context.Background(), req)
	if !errors.As(err, &se) || se.RetryAfter != 500*time.Millisecond {
		t.Fatalf("after 1.5s: got %v, want not ready for 500ms", err)
	}
	if class, _ := driver.Classify(err); class != driver.NotReady {
		t.Errorf("class = %v, want not ready", class)
	}
	clock.Advance(500 * time.Millisecond)
	if out, err := h.Execute(context.Background(), req); err != nil || out != nil {
		t.Fatalf("after 2s: got %v, %v, want success", out, err)
	}
	clock.Advance(time.Hour)
	if _, err := h.Execute(context.Background(), req); err != nil {
		t.Fatalf("long after: %v", err)
	}
}

func TestDelayHandlerBadParams(t *testing.T) {
	h := DelayHandler{Clock: testkit.NewClock(time.Unix(0, 0))}
	for _, p := range []string{``, `{}`, `{"duration":"soon"}`, `{"duration":"-1s"}`, `{"duration":"1s","x":1}`, `[]`} {
		_, err := h.Execute(context.Background(), driver.StepRequest{Params: []byte(p)})
		if class, code := driver.Classify(err); class != driver.Permanent || code != "invalid_param" {
			t.Errorf("params %q: got %v (%v), want permanent invalid_param", p, err, class)
		}
	}
}

func TestDelayHandlerSystemClock(t *testing.T) {
	// A zero Clock is the system clock: a delay that began an hour ago is over.
	req := driver.StepRequest{Params: []byte(`{"duration":"1s"}`), Started: time.Now().Add(-time.Hour)}
	if _, err := (DelayHandler{}).Execute(context.Background(), req); err != nil {
		t.Fatal(err)
	}
}
