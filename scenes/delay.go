package scenes

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/sortie-edge/sortie/driver"
)

// DelayHandler is the driver.Handler for "delay" steps. It keeps no
// state and holds no worker: until req.Started plus the delay has passed
// it answers "not ready" with the remaining time, and the driver parks
// the mission until then. Measuring from Started, which the driver
// persists, makes a delay survive a restart without starting over.
type DelayHandler struct {
	// Clock tells the time; nil means the system clock.
	Clock driver.Clock
}

// Execute implements driver.Handler.
func (h DelayHandler) Execute(_ context.Context, req driver.StepRequest) (map[string]any, error) {
	var p delayParams
	dec := json.NewDecoder(bytes.NewReader(req.Params))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return nil, driver.PermanentError("invalid_param", fmt.Errorf("delay params: %w", err))
	}
	if p.Duration <= 0 {
		return nil, driver.PermanentError("invalid_param", fmt.Errorf("delay params: duration must be positive"))
	}
	var clock driver.Clock = driver.SystemClock{}
	if h.Clock != nil {
		clock = h.Clock
	}
	now := clock.Now()
	start := req.Started
	if start.IsZero() {
		// The driver always sets Started; without it the best guess is
		// that the wait begins now.
		start = now
	}
	if remaining := start.Add(p.Duration.D()).Sub(now); remaining > 0 {
		return nil, driver.NotReadyError(DelayCode, remaining, fmt.Errorf("%s of %s left", remaining.Round(time.Millisecond), p.Duration))
	}
	return nil, nil
}
