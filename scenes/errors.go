package scenes

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors of the package.
var (
	// ErrInvalidScene is wrapped by every *LoadError, so callers can tell a
	// bad scene file from an I/O failure with errors.Is.
	ErrInvalidScene = errors.New("invalid scene")
	// ErrTrigger is wrapped by every *TriggerError.
	ErrTrigger = errors.New("trigger rejected")
)

// FieldError is one problem in a scene file. Zero fields are omitted from
// the message: a file-level problem has no Scene, a scene-level one no
// Step.
type FieldError struct {
	File  string
	Scene string
	// Step is the step's 1-based position; zero for scene-level errors.
	Step int
	// StepName is the step's explicit id, or else what it acts on (the
	// device, "delay", "wait_for"), so the message says which step a
	// person means without counting.
	StepName string
	// Field is the dotted key, e.g. "params.target" or "retry.jitter".
	Field string
	Msg   string
}

func (e FieldError) Error() string {
	var b strings.Builder
	sep := func() {
		if b.Len() > 0 {
			b.WriteString(": ")
		}
	}
	if e.File != "" {
		b.WriteString(e.File)
	}
	if e.Scene != "" {
		sep()
		fmt.Fprintf(&b, "scene %q", e.Scene)
	}
	if e.Step > 0 {
		sep()
		fmt.Fprintf(&b, "step %d", e.Step)
		if e.StepName != "" {
			fmt.Fprintf(&b, " (%s)", e.StepName)
		}
	}
	if e.Field != "" {
		sep()
		b.WriteString(e.Field)
	}
	sep()
	b.WriteString(e.Msg)
	return b.String()
}

// LoadError collects every problem found while loading scenes. Its
// message has one problem per line, in file order.
type LoadError struct {
	Errors []FieldError
}

func (e *LoadError) Error() string {
	lines := make([]string, len(e.Errors))
	for i, fe := range e.Errors {
		lines[i] = fe.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap makes errors.Is(err, ErrInvalidScene) hold.
func (e *LoadError) Unwrap() error { return ErrInvalidScene }

// Trigger rejection reasons, machine-readable, as sent in Reply.Reason.
const (
	ReasonBadJSON      = "bad_json"
	ReasonTooLarge     = "too_large"
	ReasonMissingField = "missing_field"
	ReasonInvalidField = "invalid_field"
	ReasonUnknownScene = "unknown_scene"
	ReasonInvalidParam = "invalid_param"

	// The agent's trigger service adds these: the scene's mode refused
	// a second mission, the trigger queue is full, the agent is
	// stopping, the trigger came after its not_after time, or something
	// failed inside it.
	ReasonAlreadyRunning = "already_running"
	ReasonOverloaded     = "overloaded"
	ReasonShuttingDown   = "shutting_down"
	ReasonDeadlinePassed = "deadline_passed"
	ReasonInternal       = "internal"
)

// TriggerError says why a trigger was rejected. Reason is one of the
// Reason constants; Msg is for people.
type TriggerError struct {
	Reason string
	Msg    string
}

func (e *TriggerError) Error() string { return e.Reason + ": " + e.Msg }

// Unwrap makes errors.Is(err, ErrTrigger) hold.
func (e *TriggerError) Unwrap() error { return ErrTrigger }

func triggerErr(reason, format string, args ...any) *TriggerError {
	return &TriggerError{Reason: reason, Msg: fmt.Sprintf(format, args...)}
}
