package driver

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Wake's e.woken is consumed by whichever transaction begins next; a
// control op in between (here SetPriority) eats it and the wake-up is lost.
func TestReviewWakeLostToControlOp(t *testing.T) {
	d, clk, _, sc := fixture(t, Options{})
	ready := false
	sc.do["a"] = func(req StepRequest) (map[string]any, error) {
		if !ready {
			return nil, WaitError("dev", "device_offline", time.Minute, errors.New("offline"))
		}
		return nil, nil
	}
	m := submit(t, d, Spec{Type: "t", Steps: steps("a")})
	d.Step(context.Background())
	ready = true
	d.Wake("dev") // the device came online
	if _, err := d.SetPriority(context.Background(), m.ID, 70); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	d.Step(context.Background())
	if got := get(t, d, m.ID); got.State != StateSucceeded {
		t.Errorf("after Wake the step was not retried: %s (next wake %v)", got.State, d.NextWake().Sub(clk.Now()))
	}
}
