package simulator

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/sortie-edge/sortie/devices/wire"
)

// Faults makes one device misbehave. The zero value is a device that
// works perfectly. Probabilities are in [0, 1] and are drawn per command
// (per ack for the ack faults) from the device's own seeded source, so a
// run is reproducible from the home seed.
type Faults struct {
	// AckLoss is the probability that an ack is never sent although the
	// command was applied: the case idempotent retries exist for.
	AckLoss float64 `toml:"ack_loss"`
	// AckDelay delays every ack; AckJitter adds a uniform random extra
	// delay in [0, AckJitter).
	AckDelay  time.Duration `toml:"ack_delay"`
	AckJitter time.Duration `toml:"ack_jitter"`
	// DuplicateAck is the probability that an ack is sent twice.
	DuplicateAck float64 `toml:"duplicate_ack"`
	// Busy is the probability that a command is rejected with the
	// retryable code "busy" and not applied.
	Busy float64 `toml:"busy"`
	// Reject, when set, rejects every command with this permanent code
	// (invalid_param, unknown_action, jammed or unsupported).
	Reject string `toml:"reject"`
	// WrongState is the probability that a command is acked OK but the
	// device ends up in, and reports, a state that differs from what the
	// command asked for.
	WrongState float64 `toml:"wrong_state"`
	// Jammed makes a lock reject lock, unlock and set with "jammed".
	// Only a lock can jam.
	Jammed bool `toml:"jammed"`
	// OfflineEvery schedules outages: the device drops its connection
	// without a DISCONNECT (so the broker fires its last will) after a
	// random interval in [OfflineEvery/2, 3*OfflineEvery/2) online, and
	// stays away for OfflineFor. Zero disables outages.
	OfflineEvery time.Duration `toml:"offline_every"`
	OfflineFor   time.Duration `toml:"offline_for"`
}

// String lists the faults that are on, in TOML terms, for logs.
func (f Faults) String() string {
	var parts []string
	add := func(on bool, k string, v any) {
		if on {
			parts = append(parts, fmt.Sprintf("%s=%v", k, v))
		}
	}
	add(f.AckLoss > 0, "ack_loss", f.AckLoss)
	add(f.AckDelay > 0, "ack_delay", f.AckDelay)
	add(f.AckJitter > 0, "ack_jitter", f.AckJitter)
	add(f.DuplicateAck > 0, "duplicate_ack", f.DuplicateAck)
	add(f.Busy > 0, "busy", f.Busy)
	add(f.Reject != "", "reject", f.Reject)
	add(f.WrongState > 0, "wrong_state", f.WrongState)
	add(f.Jammed, "jammed", f.Jammed)
	add(f.OfflineEvery > 0, "offline_every", f.OfflineEvery)
	add(f.OfflineFor > 0, "offline_for", f.OfflineFor)
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}

// Validate checks the faults for a device of type typ. The error is a
// *ConfigError naming the field.
func (f Faults) Validate(typ string) error {
	bad := func(field, format string, args ...any) error {
		return &ConfigError{Field: "faults." + field, Err: fmt.Errorf(format, args...)}
	}
	for _, p := range []struct {
		field string
		v     float64
	}{
		{"ack_loss", f.AckLoss}, {"duplicate_ack", f.DuplicateAck},
		{"busy", f.Busy}, {"wrong_state", f.WrongState},
	} {
		if math.IsNaN(p.v) || p.v < 0 || p.v > 1 {
			return bad(p.field, "probability must be within 0..1, got %v", p.v)
		}
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{
		{"ack_delay", f.AckDelay}, {"ack_jitter", f.AckJitter},
		{"offline_every", f.OfflineEvery}, {"offline_for", f.OfflineFor},
	} {
		if d.v < 0 {
			return bad(d.field, "duration must not be negative, got %v", d.v)
		}
	}
	if f.Reject != "" && !slices.Contains(permanentCodes, f.Reject) {
		return bad("reject", "%q is not a permanent code (want one of %v)", f.Reject, permanentCodes)
	}
	if f.Jammed && typ != TypeLock {
		return bad("jammed", "only a lock can jam, this is a %s", typ)
	}
	if f.OfflineEvery > 0 && f.OfflineFor <= 0 {
		return bad("offline_for", "must be positive when offline_every is set")
	}
	return nil
}

var permanentCodes = []string{
	wire.CodeInvalidParam, wire.CodeUnknownAction, wire.CodeJammed, wire.CodeUnsupported,
}

// dice holds one random source per fault, each derived from the home
// seed, the device ID and the fault's name. Separate streams keep a fault
// reproducible when another fault is switched on or off: the sequence of
// dropped acks depends only on the seed, the device and the acks sent.
type dice struct {
	ackLoss, ackJitter, duplicate, busy, wrongState, offline *rand.Rand
}

func newDice(seed uint64, id string) dice {
	src := func(name string) *rand.Rand {
		h := fnv.New64a()
		_, _ = h.Write([]byte(id))
		_, _ = h.Write([]byte{0})
		_, _ = h.Write([]byte(name))
		return rand.New(rand.NewPCG(seed, h.Sum64()))
	}
	return dice{
		ackLoss:    src("ack_loss"),
		ackJitter:  src("ack_jitter"),
		duplicate:  src("duplicate_ack"),
		busy:       src("busy"),
		wrongState: src("wrong_state"),
		offline:    src("offline"),
	}
}

// roll draws from r even when p is 0, so that switching a fault on at
// runtime does not shift the sequence it produces.
func roll(r *rand.Rand, p float64) bool { return r.Float64() < p }

// ConfigError says which setting of a home is wrong and why.
type ConfigError struct {
	File   string // config file, if the config came from one
	Device string // device ID, if the setting is a device's
	Field  string // dotted TOML key, e.g. "faults.ack_loss"
	Err    error
}

func (e *ConfigError) Error() string {
	s := ""
	if e.File != "" {
		s = e.File + ": "
	}
	if e.Device != "" {
		s += fmt.Sprintf("device %q: ", e.Device)
	}
	if e.Field != "" {
		s += e.Field + ": "
	}
	return s + e.Err.Error()
}

// Unwrap returns the cause.
func (e *ConfigError) Unwrap() error { return e.Err }

// Is makes every ConfigError match ErrConfig.
func (e *ConfigError) Is(target error) bool { return target == ErrConfig }

// Sentinel errors of the simulator.
var (
	// ErrConfig means a home configuration or a fault setting is invalid;
	// the error is a *ConfigError naming the field.
	ErrConfig = errors.New("invalid simulator config")
	// ErrUnknownDevice means no device of the home has the given ID.
	ErrUnknownDevice = errors.New("unknown device")
	// ErrClosed means the home has been closed.
	ErrClosed = errors.New("home closed")
)
