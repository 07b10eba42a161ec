package driver

import (
	"errors"
	"math"
	"math/rand/v2"
	"time"
)

// RetryPolicy says how often and how fast a failed step is tried again.
// Zero fields take the defaults of DefaultRetry.
type RetryPolicy struct {
	// MaxAttempts counts the first attempt; 1 means no retry.
	MaxAttempts    int      `json:"max_attempts,omitempty" toml:"max_attempts"`
	InitialBackoff Duration `json:"initial_backoff,omitempty" toml:"initial_backoff"`
	Multiplier     float64  `json:"multiplier,omitempty" toml:"multiplier"`
	MaxBackoff     Duration `json:"max_backoff,omitempty" toml:"max_backoff"`
	// Jitter spreads each backoff by up to ±Jitter of itself (0–1), so
	// devices that came back together are not hit together.
	Jitter float64 `json:"jitter,omitempty" toml:"jitter"`
	// MaxElapsed bounds the time from the first attempt, waits included;
	// zero means no bound beyond the mission deadline.
	MaxElapsed Duration `json:"max_elapsed,omitempty" toml:"max_elapsed"`
}

// DefaultRetry is the policy for fields left zero.
var DefaultRetry = RetryPolicy{
	MaxAttempts:    3,
	InitialBackoff: Duration(200 * time.Millisecond),
	Multiplier:     2,
	MaxBackoff:     Duration(5 * time.Second),
	Jitter:         0.1,
}

// Validate rejects out-of-range values.
func (p RetryPolicy) Validate() error {
	switch {
	case p.MaxAttempts < 0:
		return errors.New("retry.max_attempts must not be negative")
	case p.MaxAttempts > 1000:
		return errors.New("retry.max_attempts must be at most 1000")
	case p.Multiplier != 0 && p.Multiplier < 1:
		return errors.New("retry.multiplier must be at least 1")
	case p.Jitter < 0 || p.Jitter > 1:
		return errors.New("retry.jitter must be between 0 and 1")
	case p.MaxBackoff != 0 && p.InitialBackoff > p.MaxBackoff:
		return errors.New("retry.initial_backoff must not exceed retry.max_backoff")
	}
	return nil
}

// WithDefaults fills zero fields from DefaultRetry.
func (p RetryPolicy) WithDefaults() RetryPolicy {
	if p.MaxAttempts == 0 {
		p.MaxAttempts = DefaultRetry.MaxAttempts
	}
	if p.InitialBackoff == 0 {
		p.InitialBackoff = DefaultRetry.InitialBackoff
	}
	if p.Multiplier == 0 {
		p.Multiplier = DefaultRetry.Multiplier
	}
	if p.MaxBackoff == 0 {
		p.MaxBackoff = max(DefaultRetry.MaxBackoff, p.InitialBackoff)
	}
	return p
}

// Backoff returns the wait before attempt number next (2 for the first
// retry). r supplies jitter; nil means none.
func (p RetryPolicy) Backoff(next int, r *rand.Rand) time.Duration {
	p = p.WithDefaults()
	n := max(next-2, 0)
	d := float64(p.InitialBackoff) * math.Pow(p.Multiplier, float64(n))
	if d > float64(p.MaxBackoff) || math.IsInf(d, 0) || math.IsNaN(d) {
		d = float64(p.MaxBackoff)
	}
	if p.Jitter > 0 && r != nil {
		d += d * p.Jitter * (2*r.Float64() - 1)
	}
	return time.Duration(max(d, 0))
}
