package simulator

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// BridgeConfig is a shared radio or bridge in front of several devices (a
// Zigbee coordinator, a Wi-Fi bridge). It relays only so many commands
// at once: a command occupies it from its arrival until its ack goes out
// (the device's ack_delay, the radio round trip), and a command that
// arrives while it is full is lost or refused, as real coordinators do
// when they are sent more than they can take.
type BridgeConfig struct {
	ID string `toml:"id"`
	// Capacity is how many commands it relays at once.
	Capacity int `toml:"capacity"`
	// Overflow is what happens to a command beyond capacity: "drop" (the
	// default: it is lost and never acked) or "busy" (refused with the
	// retryable code busy).
	Overflow string `toml:"overflow"`
}

// Overflow behaviours of a bridge.
const (
	OverflowDrop = "drop"
	OverflowBusy = "busy"
)

func (b BridgeConfig) check() error {
	bad := func(field string, err error) error {
		return &ConfigError{Field: "bridge." + b.ID + "." + field, Err: err}
	}
	switch {
	case b.ID == "":
		return &ConfigError{Field: "bridge.id", Err: errors.New("missing")}
	case b.Capacity < 1:
		return bad("capacity", fmt.Errorf("must be at least 1, got %d", b.Capacity))
	case b.Overflow != "" && b.Overflow != OverflowDrop && b.Overflow != OverflowBusy:
		return bad("overflow", fmt.Errorf("%q is not %q or %q", b.Overflow, OverflowDrop, OverflowBusy))
	}
	return nil
}

// bridge is a running BridgeConfig: the times at which the commands it
// relays now are done. Safe for concurrent use.
type bridge struct {
	cfg  BridgeConfig
	mu   sync.Mutex
	busy []time.Time // when each command in its care leaves it
}

// take admits a command arriving at now that occupies the bridge until
// now+hold, or reports that the bridge is full.
func (b *bridge) take(now time.Time, hold time.Duration) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	live := b.busy[:0]
	for _, t := range b.busy {
		if t.After(now) {
			live = append(live, t)
		}
	}
	b.busy = live
	if len(b.busy) >= b.cfg.Capacity {
		return false
	}
	if hold > 0 {
		b.busy = append(b.busy, now.Add(hold))
	}
	return true
}
