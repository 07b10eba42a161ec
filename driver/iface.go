package driver

import (
	"context"
	"encoding/json"
	"time"
)

// Event records one transition of one mission. Events are the mission's
// timeline; they are also handed to Observers (hub sync, metrics, logs).
type Event struct {
	MissionID string    `json:"mission_id"`
	Seq       uint64    `json:"seq"` // per mission, from 1, without gaps
	Type      string    `json:"type"`
	TraceID   string    `json:"trace_id,omitempty"`
	Input     Input     `json:"input"`
	From      State     `json:"from"`
	To        State     `json:"to"`
	Step      int       `json:"step"` // step index the event concerns; -1 for none
	StepID    string    `json:"step_id,omitempty"`
	Attempt   int       `json:"attempt,omitempty"`
	Error     string    `json:"error,omitempty"`
	Code      string    `json:"code,omitempty"`
	Time      time.Time `json:"time"`
	// Detail is a short note: the error class on step_error, the
	// outcome on comp_result, a reason elsewhere.
	Detail string `json:"detail,omitempty"`
	// Backoff is set when a failed attempt is retried: the wait before
	// the next one.
	Backoff Duration `json:"backoff,omitempty"`
	// Group is the group's ID on the events of a parallel group: its
	// begin and end (InGroupBegin, InGroupOK, InGroupFail) and its
	// branches' begins, outcomes and undos. A branch event is not a
	// transition of the mission, whose state stays STEP_RUNNING (or
	// COMPENSATING) while its branches run, so its From equals its To.
	Group string `json:"group,omitempty"`
}

// Store persists missions and their timelines. Implementations must be
// safe for concurrent use; the driver calls Save from many workers.
type Store interface {
	Writer
	Reader
}

// Writer is the write half of a Store.
type Writer interface {
	// Create stores a new mission with its first events. If
	// m.Meta.RequestKey is set and already belongs to a mission, Create
	// stores nothing and returns that mission with created false.
	Create(ctx context.Context, m *Mission, events []Event) (existing *Mission, created bool, err error)
	// Save stores m, whose Version the caller has already incremented, if
	// the stored version is m.Version-1; otherwise it returns ErrConflict.
	// The events are appended to the timeline in the same transaction.
	Save(ctx context.Context, m *Mission, events []Event) error
}

// Reader is the read half of a Store.
type Reader interface {
	// Get returns the mission with the given ID or ErrNotFound.
	Get(ctx context.Context, id string) (*Mission, error)
	// Active returns every mission that is not terminal, from an index, so
	// that start-up does not scan finished missions.
	Active(ctx context.Context) ([]*Mission, error)
	// List returns missions matching f, newest first, and a cursor for the
	// next page ("" when there is none).
	List(ctx context.Context, f Filter) ([]*Mission, string, error)
	// Timeline returns a mission's events in order, or ErrNotFound.
	Timeline(ctx context.Context, id string) ([]Event, error)
	// Lookup returns the mission created with a request key, or
	// ErrNotFound.
	Lookup(ctx context.Context, requestKey string) (*Mission, error)
}

// Filter selects missions for List. Zero fields match everything.
type Filter struct {
	States []State
	Type   string
	Since  time.Time // created at or after
	Until  time.Time // created before
	// After is the cursor returned by the previous page.
	After string
	// Limit caps the page; zero means 100.
	Limit int
}

// Match reports whether m passes the filter's field tests (not the
// cursor or limit).
func (f Filter) Match(m *Mission) bool {
	if f.Type != "" && m.Type != f.Type {
		return false
	}
	if !f.Since.IsZero() && m.Meta.Created.Before(f.Since) {
		return false
	}
	if !f.Until.IsZero() && !m.Meta.Created.Before(f.Until) {
		return false
	}
	if len(f.States) == 0 {
		return true
	}
	for _, s := range f.States {
		if m.State == s {
			return true
		}
	}
	return false
}

// StepRequest is everything a handler needs to execute one attempt.
type StepRequest struct {
	MissionID   string
	MissionType string
	StepID      string
	StepIndex   int
	Kind        string
	Attempt     int
	Params      json.RawMessage
	// Context is a copy of the mission context; handlers may read it.
	Context map[string]any
	// IdempotencyKey is the same for every attempt of this step of this
	// mission, across retries and crashes, and differs for its
	// compensation. Handlers pass it to devices to apply effects once.
	IdempotencyKey string
	TraceID        string
	// Compensating is true when this request undoes a step; Forward then
	// holds the outputs of the step being undone (e.g. its prior state).
	Compensating bool
	Forward      map[string]any
	// Started is when the step's first attempt (or first not-ready wait)
	// began; handlers that wait (delays, wait-for-state) measure from it so
	// they stay stateless.
	Started time.Time
	// Deadline is when the attempt's context expires. A resumed attempt
	// keeps the deadline its first call had.
	Deadline time.Time
	// Priority and Created are the mission's, for handlers that admit
	// attempts in order (a device that takes one command at a time).
	Priority int
	Created  time.Time
	// Resume is set when the driver calls the handler again for an
	// attempt it parked (the handler returned Pending): what the handler
	// gave then, and when the attempt began. Nil on a fresh attempt,
	// including one re-executed after a crash.
	Resume *Parked
}

// Parked is an attempt the driver parked, as handed back on resume.
type Parked struct {
	Key   string
	Until time.Time
	Note  string
	Out   map[string]any
	// Since is when the attempt began: its first call to the handler.
	Since time.Time
	// Woken says that Wake(Key) resumed it, rather than Until.
	Woken bool
	// InFlight says it was parked by InFlight: its effect is under way.
	InFlight bool
	// Abandon says the driver gives the attempt up before its effect
	// started (parked by Pending, not InFlight; its mission was cancelled
	// or paused): the handler lets go of what the attempt holds (a queued
	// turn) and returns; its answer is ignored.
	Abandon bool
}

// Handler executes one kind of step. Handlers are stateless and
// idempotent: the driver may execute an attempt again after a crash with
// the same IdempotencyKey. Errors are classified by Classify.
//
// Waiting is not working: a handler that has started an attempt and
// must wait for its outcome (a device's ack, a verified state) returns
// Pending instead of blocking, and the driver calls it again with
// req.Resume set once Wake(key) is called or the time given has come.
// Between the two calls the attempt holds no worker and no goroutine, so
// workers bound CPU work, not waits. A handler that returns Pending must
// find the outcome again from req.Resume and what it shares with the
// waker (the devices client keeps acks by command ID), never from state
// of its own.
type Handler interface {
	// Execute performs one attempt, or resumes a parked one, and returns
	// outputs that are merged into the mission context for later steps.
	Execute(ctx context.Context, req StepRequest) (map[string]any, error)
}

// HandlerFunc adapts a function to a Handler.
type HandlerFunc func(ctx context.Context, req StepRequest) (map[string]any, error)

// Execute calls f.
func (f HandlerFunc) Execute(ctx context.Context, req StepRequest) (map[string]any, error) {
	return f(ctx, req)
}

// Observer receives every committed event, in per-mission order, after
// it is durable. m is a snapshot of the mission after the event's
// commit; it must not be modified. Observe must not block.
type Observer interface {
	Observe(ev Event, m *Mission)
}

// ObserverFunc adapts a function to an Observer.
type ObserverFunc func(ev Event, m *Mission)

// Observe calls f.
func (f ObserverFunc) Observe(ev Event, m *Mission) { f(ev, m) }

// Clock tells time and schedules wake-ups. Tests inject a fake one to
// drive backoff, timeouts and deadlines without sleeping.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has passed; stop
	// cancels it.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// SystemClock is the real clock.
type SystemClock struct{}

// Now returns time.Now.
func (SystemClock) Now() time.Time { return time.Now() }

// AfterFunc wraps time.AfterFunc.
func (SystemClock) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}
