package driver

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors returned by the driver and by Store implementations.
var (
	// ErrNotFound means no mission has the given ID.
	ErrNotFound = errors.New("mission not found")
	// ErrConflict means a save was made against a stale version: another
	// writer advanced the mission first (optimistic locking).
	ErrConflict = errors.New("version conflict")
	// ErrIllegalTransition means the state machine has no edge for the
	// requested input in the mission's current state.
	ErrIllegalTransition = errors.New("illegal transition")
	// ErrTerminal means the mission has already finished.
	ErrTerminal = errors.New("mission is terminal")
	// ErrFull means a Submit found Options.MaxLive missions live: nothing
	// was created, and the same request may be sent again later.
	ErrFull = errors.New("too many live missions")
	// ErrClosed means the driver or store has been stopped.
	ErrClosed = errors.New("closed")
	// ErrUnknownKind means no handler is registered for a step's kind.
	ErrUnknownKind = errors.New("unknown step kind")
	// ErrInvalid means a submitted mission or argument is malformed.
	ErrInvalid = errors.New("invalid mission")
	// ErrStepTimeout is the cause of a step context cancelled because the
	// step ran past its timeout.
	ErrStepTimeout = errors.New("step timed out")
	// ErrDeadline means the mission cannot finish before its deadline.
	ErrDeadline = errors.New("mission deadline exceeded")
	// ErrNotReady is wrapped by errors that mean "the target cannot take
	// this step yet" (a device is offline): the step waits without
	// spending an attempt.
	ErrNotReady = errors.New("not ready")
	// ErrPermanent is wrapped by errors that no retry can fix.
	ErrPermanent = errors.New("permanent failure")
	// ErrAckTimeout is wrapped by handlers when a device did not
	// acknowledge a command in time. It is retryable.
	ErrAckTimeout = errors.New("ack timeout")
)

// Class says what the driver does with a failed step attempt.
type Class int

const (
	// Retryable failures are retried under the step's RetryPolicy.
	Retryable Class = iota
	// Permanent failures fail the step at once.
	Permanent
	// NotReady failures wait and try again without spending an attempt.
	NotReady
	// GaveWay ends the step without its effect and without failing: its
	// target belongs to another mission (a newer one took it over, or
	// the step's policy skips a device another mission holds). The step
	// ends superseded (Code CodeSuperseded) or skipped, is not
	// compensated, and the mission goes on.
	GaveWay
)

// CodeAckTimeout is the code of an attempt whose command was sent and
// not acknowledged in time (ErrAckTimeout): it may have taken effect.
const CodeAckTimeout = "ack_timeout"

// Codes of a step that gave way (see GaveWay).
const (
	// CodeSuperseded: a newer mission commanded the step's target.
	CodeSuperseded = "superseded"
	// CodeSkipped: another live mission holds the target and the step's
	// policy is to skip it.
	CodeSkipped = "skipped"
)

func (c Class) String() string {
	switch c {
	case Permanent:
		return "permanent"
	case NotReady:
		return "not_ready"
	case GaveWay:
		return "gave_way"
	default:
		return "retryable"
	}
}

// StepError is an error returned by a Handler with its class made
// explicit, an optional machine-readable code (such as "busy" or
// "invalid_param") and, for NotReady, a hint of when to try again.
type StepError struct {
	Class Class
	// Code is a short machine-readable reason, e.g. "device_offline".
	Code string
	// RetryAfter overrides the backoff for this failure when positive.
	RetryAfter time.Duration
	// WaitFor names what a NotReady step waits for (a device ID), or,
	// for a Retryable one, what may make the retry succeed before its
	// backoff ends (the device handlers name a command's ack, which may
	// come late); Wake with that key ends the wait or the backoff early.
	WaitFor string
	Err     error
}

// Error is the wrapped error's message alone: the code travels beside
// it (Event.Code, StepResult.Code), so repeating it here would read
// "jammed: Front door lock (hall): lock mechanism jammed".
func (e *StepError) Error() string {
	if e.Err == nil {
		return e.Code
	}
	return e.Err.Error()
}

func (e *StepError) Unwrap() error { return e.Err }

// Is lets errors.Is(err, ErrPermanent) and errors.Is(err, ErrNotReady)
// answer from the class.
func (e *StepError) Is(target error) bool {
	switch target {
	case ErrPermanent:
		return e.Class == Permanent
	case ErrNotReady:
		return e.Class == NotReady
	}
	return false
}

// PermanentError marks err as permanent: the step fails without retry.
func PermanentError(code string, err error) error {
	return &StepError{Class: Permanent, Code: code, Err: err}
}

// SupersededError ends a step, or leaves a compensation undone, because
// a newer mission has commanded its target: not a failure (see GaveWay).
func SupersededError(err error) error {
	return &StepError{Class: GaveWay, Code: CodeSuperseded, Err: err}
}

// SkippedError ends a step without its effect because another live
// mission holds its target and the step yields (see GaveWay).
func SkippedError(err error) error {
	return &StepError{Class: GaveWay, Code: CodeSkipped, Err: err}
}

// RetryableError marks err as retryable under the step's policy.
func RetryableError(code string, err error) error {
	return &StepError{Class: Retryable, Code: code, Err: err}
}

// NotReadyError marks err as "not ready": the step is tried again after
// retryAfter without spending an attempt.
func NotReadyError(code string, retryAfter time.Duration, err error) error {
	return &StepError{Class: NotReady, Code: code, RetryAfter: retryAfter, Err: err}
}

// WaitError is NotReadyError for a step waiting on something named by
// key (a device ID): Driver.Wake(key) retries it at once.
func WaitError(key, code string, retryAfter time.Duration, err error) error {
	return &StepError{Class: NotReady, Code: code, RetryAfter: retryAfter, WaitFor: key, Err: err}
}

// Classify returns the class and code of a handler error. Unclassified
// errors are retryable: a transient fault is the common case at the
// edge, and the retry policy bounds the cost of being wrong.
func Classify(err error) (Class, string) {
	var se *StepError
	if errors.As(err, &se) {
		return se.Class, se.Code
	}
	switch {
	case errors.Is(err, ErrPermanent), errors.Is(err, ErrUnknownKind), errors.Is(err, ErrInvalid):
		return Permanent, ""
	case errors.Is(err, ErrNotReady):
		return NotReady, ""
	case errors.Is(err, ErrStepTimeout):
		return Retryable, "timeout"
	case errors.Is(err, ErrAckTimeout):
		return Retryable, CodeAckTimeout
	}
	return Retryable, ""
}

// TransitionError reports an input the state machine rejects.
type TransitionError struct {
	From  State
	Input Input
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("illegal transition: %s on %s", e.Input, e.From)
}

func (e *TransitionError) Unwrap() error { return ErrIllegalTransition }

// PendingError is what a handler returns, through Pending, when it has
// started an attempt (published a command) and waits for its outcome: the
// driver parks the attempt, holding no worker and no goroutine for it,
// and calls the handler again with StepRequest.Resume set when Wake(Key)
// is called or at Until, whichever comes first. Parking is not a commit:
// the step stays STEP_RUNNING under this driver's lease, and a process
// that dies while steps are parked leaves them to be recovered, and
// executed afresh with the same idempotency key, by the next start.
type PendingError struct {
	// Key is what the attempt waits for; Driver.Wake(Key) resumes it.
	// Empty means only Until does.
	Key string
	// Until is when the attempt resumes if nothing wakes it first; the
	// driver caps it at the attempt's deadline.
	Until time.Time
	// Note and Out are the handler's own, handed back in
	// StepRequest.Resume: where the attempt left off, and outputs it
	// already has. They live in memory only.
	Note string
	Out  map[string]any
	// InFlight says the attempt's effect may be under way (a command was
	// sent): Stop then waits for its outcome, as for a step executing,
	// within its grace. An attempt that has not started its effect yet
	// (waiting for its turn, for a connection) is left for the next
	// start instead: a stopping driver starts nothing new.
	InFlight bool
}

func (e *PendingError) Error() string {
	if e.Key == "" {
		return "pending until " + e.Until.UTC().Format(time.RFC3339Nano)
	}
	return "pending on " + e.Key
}

// Pending parks a step attempt that has not started its effect yet
// until Wake(key) or until (see PendingError).
func Pending(key string, until time.Time, note string, out map[string]any) error {
	return &PendingError{Key: key, Until: until, Note: note, Out: out}
}

// InFlight parks a step attempt whose effect is under way (a command
// sent, waiting for its ack) until Wake(key) or until; Stop waits for
// it (see PendingError.InFlight).
func InFlight(key string, until time.Time, note string, out map[string]any) error {
	return &PendingError{Key: key, Until: until, Note: note, Out: out, InFlight: true}
}
