package agentconf

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sortie-edge/sortie/driver"
)

// TestClockEnv makes the schedules' clock run fast from a given start:
// "SIM_START,REAL_START,SPEED", an RFC 3339 time, a Unix time in
// milliseconds and a factor; the clock then reads SIM_START plus SPEED
// times the real time since REAL_START. Tests use it to run days of
// schedules through real processes, killed and restarted, in seconds:
// every process of a test reads the same mapping, so time goes on
// across restarts. It is for tests only.
const TestClockEnv = "SORTIE_TEST_CLOCK"

// scaledClock is the clock TestClockEnv describes.
type scaledClock struct {
	sim, real time.Time
	speed     float64
}

func (c scaledClock) Now() time.Time {
	return c.sim.Add(time.Duration(float64(time.Since(c.real)) * c.speed))
}

func (c scaledClock) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(time.Duration(float64(d)/c.speed), f).Stop
}

// TestClock returns the clock TestClockEnv sets, or nil.
func TestClock() (driver.Clock, error) {
	v := os.Getenv(TestClockEnv)
	if v == "" {
		return nil, nil
	}
	bad := fmt.Errorf("%s=%q: want SIM_START (RFC 3339),REAL_START (Unix ms),SPEED", TestClockEnv, v)
	parts := strings.Split(v, ",")
	if len(parts) != 3 {
		return nil, bad
	}
	sim, err1 := time.Parse(time.RFC3339, parts[0])
	ms, err2 := strconv.ParseInt(parts[1], 10, 64)
	speed, err3 := strconv.ParseFloat(parts[2], 64)
	if err1 != nil || err2 != nil || err3 != nil || !(speed > 0 && speed <= 1e6) {
		return nil, bad
	}
	return scaledClock{sim: sim, real: time.UnixMilli(ms), speed: speed}, nil
}
