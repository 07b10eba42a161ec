package driver

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode"
)

// SchemaVersion is the version of the Mission JSON encoding. Stores record
// it so that a later release can migrate old records.
const SchemaVersion = 1

// ContextSchema is the version of the Context.Values layout.
const ContextSchema = 1

// Mission is a durable goal made of ordered steps. A Mission value is a
// snapshot: the driver never shares one it is still changing, and callers
// may keep or modify what they receive.
type Mission struct {
	ID       string `json:"id"`
	Type     string `json:"type"` // the scene name, e.g. "go_home"
	Priority int    `json:"priority"`

	Context Context `json:"context"`
	Steps   []Step  `json:"steps"`

	State    State        `json:"state"`
	Progress Progress     `json:"progress"`
	Results  []StepResult `json:"results"`          // one per step, same order
	Undo     []StepResult `json:"undo,omitempty"`   // one per step; set for compensated steps
	Error    string       `json:"error,omitempty"`  // why the mission failed or was cancelled
	Reason   string       `json:"reason,omitempty"` // machine-readable form of Error

	Meta Metadata `json:"meta"`

	// Version grows by one with every save; a save against a stale version
	// fails with ErrConflict.
	Version uint64 `json:"version"`
	// Seq is the sequence number of the mission's last event.
	Seq uint64 `json:"seq"`
	// Lease is held while a step may be executing.
	Lease Lease `json:"lease"`
	// Due is when the loop should next look at the mission (zero: now).
	Due time.Time `json:"due"`
	// Control records pause and cancel requests that take effect at the
	// next step boundary.
	Control Control `json:"control"`
}

// Context is the mission's shared data: the trigger's parameters plus the
// outputs of completed steps, which later steps can read.
type Context struct {
	Schema int            `json:"schema"`
	Values map[string]any `json:"values,omitempty"`
}

// Step is one unit of work, executed by the Handler registered for Kind.
type Step struct {
	ID   string `json:"id"`   // unique within the mission
	Kind string `json:"kind"` // handler kind, e.g. "device.command"
	// Name is a short label of what the step does (scenes: its action,
	// device and parameters), and Target what it acts on (scenes: the
	// device), for people and the hub's views: the driver only passes
	// them on in the mission's step table (Summary).
	Name   string          `json:"name,omitempty"`
	Target string          `json:"target,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
	// Timeout bounds one attempt; zero uses Options.StepTimeout.
	Timeout Duration    `json:"timeout,omitempty"`
	Retry   RetryPolicy `json:"retry"`
	// Compensate, when set, undoes this step if the mission fails or is
	// cancelled after the step succeeded.
	Compensate *Compensation `json:"compensate,omitempty"`
	// ContinueOnError lets the mission go on when this step fails.
	ContinueOnError bool `json:"continue_on_error,omitempty"`
	// Group, when set, makes the step a branch of a parallel group:
	// consecutive steps with the same Group.ID run at once, each with its
	// own attempts, retries and result, and the group ends as its policy
	// says. Every branch of a group carries the same Group. A branch's
	// outputs stay in its result: branches finish in no set order, so
	// they are not merged into the context.
	Group *Group `json:"group,omitempty"`
}

// Group names a parallel group of steps and what its branches' failures
// do to it.
type Group struct {
	ID string `json:"id"`
	// Policy is what a branch that fails for good does: PolicyAll (the
	// default) fails the group, PolicyBestEffort records it and lets the
	// group succeed, PolicyQuorum fails the group only when fewer than
	// Quorum branches can still succeed.
	Policy Policy `json:"policy,omitempty"`
	Quorum int    `json:"quorum,omitempty"`
}

// Policy is a group's partial-failure policy.
type Policy string

// Group policies.
const (
	PolicyAll        Policy = "all"
	PolicyBestEffort Policy = "best_effort"
	PolicyQuorum     Policy = "quorum"
)

// Compensation is the action that undoes a step.
type Compensation struct {
	Kind    string          `json:"kind"`
	Params  json.RawMessage `json:"params,omitempty"`
	Timeout Duration        `json:"timeout,omitempty"`
	Retry   RetryPolicy     `json:"retry"`
}

// StepStatus is the outcome of one step.
type StepStatus string

// Step statuses.
const (
	StepPending     StepStatus = "pending"
	StepRunning     StepStatus = "running"
	StepWaiting     StepStatus = "waiting" // failed attempt or not ready; retry due
	StepSucceeded   StepStatus = "succeeded"
	StepFailed      StepStatus = "failed"
	StepSkipped     StepStatus = "skipped" // mission ended before it
	StepCompensated StepStatus = "compensated"
	// StepSuperseded: a newer mission commanded the step's device, so the
	// step ended without its effect, or its effect was left to the newer
	// mission rather than undone. Not a failure.
	StepSuperseded StepStatus = "superseded"
)

// StepResult records what happened to a step (or to its compensation).
type StepResult struct {
	Status   StepStatus     `json:"status"`
	Attempts int            `json:"attempts"`        // attempts spent
	Waits    int            `json:"waits,omitempty"` // not-ready waits (no attempt spent)
	Outputs  map[string]any `json:"outputs,omitempty"`
	Error    string         `json:"error,omitempty"`
	Code     string         `json:"code,omitempty"`
	Started  time.Time      `json:"started,omitzero"` // first attempt
	Finished time.Time      `json:"finished,omitzero"`
	// Duration is the time spent executing attempts, excluding waits.
	Duration Duration `json:"duration,omitempty"`
	// LateAcks counts results that arrived after the attempt had been
	// given up; they are recorded, never applied twice.
	LateAcks int `json:"late_acks,omitempty"`
	// Due and WaitFor are a group branch's own retry or not-ready wait:
	// when it is tried again, and the key whose Wake ends the wait early.
	// Steps outside a group use the mission's Due and Control instead.
	Due     time.Time `json:"due,omitzero"`
	WaitFor string    `json:"wait_for,omitempty"`
}

// Progress says where the mission is.
type Progress struct {
	Step    int `json:"step"`    // index of the current step; len(Steps) when all are done
	Attempt int `json:"attempt"` // attempt number of the current (or last) execution, from 1
	// Undo is the index of the step being compensated while COMPENSATING.
	Undo int `json:"undo"`
	// Cause is the state compensation ends in: FAILED or CANCELLED.
	Cause State `json:"cause,omitempty"`
	// Gen counts operator retries. It is part of every idempotency key, so
	// a step redone after its compensation is applied again rather than
	// deduplicated against its first run.
	Gen int `json:"gen,omitempty"`
}

// Metadata is bookkeeping about the mission.
type Metadata struct {
	Created    time.Time `json:"created"`
	Started    time.Time `json:"started,omitzero"`
	Updated    time.Time `json:"updated"`
	Finished   time.Time `json:"finished,omitzero"`
	TraceID    string    `json:"trace_id"`
	RequestKey string    `json:"request_key,omitempty"`
	Source     string    `json:"source,omitempty"`
	Deadline   time.Time `json:"deadline,omitzero"`
	// Budget is the deadline's distance from creation, kept so a retried
	// mission gets the same time to finish.
	Budget Duration `json:"budget,omitempty"`
	// Labels are free-form tags (e.g. the gateway ID).
	Labels map[string]string `json:"labels,omitempty"`
}

// Lease marks a mission as held by one driver until Expires.
type Lease struct {
	Owner   string    `json:"owner,omitempty"`
	Expires time.Time `json:"expires,omitzero"`
}

// Control holds requests that wait for a step boundary.
type Control struct {
	Pause  bool `json:"pause,omitempty"`
	Cancel bool `json:"cancel,omitempty"`
	// CancelReason says why Cancel was asked, when not by an operator;
	// it becomes the mission's error.
	CancelReason string `json:"cancel_reason,omitempty"`
	// Wait marks a step waiting because its target was not ready, and
	// WaitFor names that target; Wake(WaitFor) makes the mission due at
	// once. Without Wait, WaitFor is what ends a retry's backoff early
	// (STEP_FAILED): a command's ack that came after the attempt gave up.
	Wait    bool   `json:"wait,omitempty"`
	WaitFor string `json:"wait_for,omitempty"`
}

// wakeable reports whether a Wake may make the mission due before its
// time: a not-ready wait, or a retry's backoff that names a key.
func (c Control) wakeable() bool { return c.Wait || c.WaitFor != "" }

// Clone returns a deep copy, so snapshots handed out never alias the
// driver's working copy.
func (m *Mission) Clone() *Mission {
	if m == nil {
		return nil
	}
	c := *m
	c.Context.Values = cloneValues(m.Context.Values)
	c.Steps = append([]Step(nil), m.Steps...)
	c.Results = cloneResults(m.Results)
	c.Undo = cloneResults(m.Undo)
	c.Meta.Labels = maps.Clone(m.Meta.Labels)
	return &c
}

// txnCopy copies m for a transaction that will change it, more cheaply
// than Clone: nested values (step outputs, context entries) stay shared
// with m. A transaction only replaces them or adds top-level context
// keys, never changes one in place, and handlers get deep copies, so
// copying the top-level maps and slices leaves m as it was.
func (m *Mission) txnCopy() *Mission {
	c := *m
	c.Context.Values = maps.Clone(m.Context.Values)
	c.Steps = slices.Clone(m.Steps)
	c.Results = slices.Clone(m.Results)
	c.Undo = slices.Clone(m.Undo)
	c.Meta.Labels = maps.Clone(m.Meta.Labels)
	return &c
}

func cloneResults(rs []StepResult) []StepResult {
	if rs == nil {
		return nil
	}
	out := make([]StepResult, len(rs))
	for i, r := range rs {
		r.Outputs = cloneValues(r.Outputs)
		out[i] = r
	}
	return out
}

// cloneValues copies JSON-shaped data deeply enough that nested maps and
// slices are not shared.
func cloneValues(v map[string]any) map[string]any {
	if v == nil {
		return nil
	}
	out := make(map[string]any, len(v))
	for k, x := range v {
		out[k] = cloneAny(x)
	}
	return out
}

func cloneAny(x any) any {
	switch t := x.(type) {
	case map[string]any:
		return cloneValues(t)
	case []any:
		s := make([]any, len(t))
		for i, e := range t {
			s[i] = cloneAny(e)
		}
		return s
	default:
		return x
	}
}

// MaxIDLen bounds mission, step and request IDs; they end up in MQTT
// topics and bbolt keys.
const MaxIDLen = 128

// ValidateID rejects IDs that would be unsafe in an MQTT topic or a log
// line: empty, too long, containing '/', '+', '#', spaces or control
// characters.
func ValidateID(what, id string) error {
	if err := CheckID(what, id); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// CheckID applies ValidateID's rules to an ID that is not a mission's
// (a gateway's, in a config file), without wrapping ErrInvalid, whose
// text ("invalid mission") would mislead there.
func CheckID(what, id string) error {
	if id == "" {
		return fmt.Errorf("%s is empty", what)
	}
	if len(id) > MaxIDLen {
		return fmt.Errorf("%s is %d bytes long (max %d)", what, len(id), MaxIDLen)
	}
	if i := strings.IndexFunc(id, func(r rune) bool {
		// Format characters (direction overrides, zero-width joiners and
		// spaces) make an ID that reads as another in a log or a topic.
		return r == '/' || r == '+' || r == '#' || unicode.IsSpace(r) || unicode.IsControl(r) || r == unicode.ReplacementChar ||
			unicode.Is(unicode.Cf, r)
	}); i >= 0 {
		return fmt.Errorf("%s %q contains %q", what, id, []rune(id[i:])[0])
	}
	return nil
}

// Validate checks a mission as submitted.
func (m *Mission) Validate() error {
	if err := ValidateID("mission type", m.Type); err != nil {
		return err
	}
	if m.Meta.RequestKey != "" {
		if err := ValidateID("request key", m.Meta.RequestKey); err != nil {
			return err
		}
	}
	if len(m.Steps) == 0 {
		return fmt.Errorf("%w: mission %q has no steps", ErrInvalid, m.Type)
	}
	if err := validateGroups(m.Steps); err != nil {
		return err
	}
	seen := make(map[string]bool, len(m.Steps))
	for i, s := range m.Steps {
		if err := ValidateID(fmt.Sprintf("step %d id", i), s.ID); err != nil {
			return err
		}
		if seen[s.ID] {
			return fmt.Errorf("%w: duplicate step id %q", ErrInvalid, s.ID)
		}
		seen[s.ID] = true
		if s.Kind == "" {
			return fmt.Errorf("%w: step %q has no kind", ErrInvalid, s.ID)
		}
		if err := s.Retry.Validate(); err != nil {
			return fmt.Errorf("%w: step %q: %w", ErrInvalid, s.ID, err)
		}
		if s.Compensate != nil {
			if s.Compensate.Kind == "" {
				return fmt.Errorf("%w: step %q compensation has no kind", ErrInvalid, s.ID)
			}
			if err := s.Compensate.Retry.Validate(); err != nil {
				return fmt.Errorf("%w: step %q compensation: %w", ErrInvalid, s.ID, err)
			}
		}
	}
	return nil
}

// Compensable reports whether any completed step has a compensation.
func (m *Mission) compensable() bool {
	for i := 0; i < len(m.Steps) && i < len(m.Results); i++ {
		if m.Steps[i].Compensate != nil && m.Results[i].Status == StepSucceeded {
			return true
		}
	}
	return false
}

// Duration is a time.Duration that reads and writes JSON and TOML as a
// string such as "1.5s".
type Duration time.Duration

// D returns the time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func (d Duration) String() string { return time.Duration(d).String() }

// MarshalText writes the duration as Go duration text.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText reads Go duration text such as "250ms" or "2m".
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("invalid duration %q: want e.g. \"500ms\" or \"2m\"", b)
	}
	if v < 0 {
		return fmt.Errorf("invalid duration %q: must not be negative", b)
	}
	*d = Duration(v)
	return nil
}

// Summary is the state of a mission after an event: enough to show the
// mission elsewhere (the hub, an outbox) without replaying its timeline.
type Summary struct {
	Scene    string    `json:"scene"`
	State    State     `json:"state"`
	Priority int       `json:"priority"`
	Step     int       `json:"step"`  // current step index
	Steps    int       `json:"steps"` // number of steps
	Error    string    `json:"error,omitempty"`
	Reason   string    `json:"reason,omitempty"`
	Created  time.Time `json:"created"`
	Updated  time.Time `json:"updated"`
	Finished time.Time `json:"finished,omitzero"`
	TraceID  string    `json:"trace_id,omitempty"`
	Source   string    `json:"source,omitempty"`
	// StepIDs, StepNames and StepTargets are the step table: each
	// step's ID, Name and Target, so a timeline can be labelled. They
	// are all set or all nil (Summarize); StepNames and StepTargets are
	// nil too in summaries from agents before them.
	StepIDs     []string `json:"step_ids,omitempty"`
	StepNames   []string `json:"step_names,omitempty"`
	StepTargets []string `json:"step_targets,omitempty"`
	// StepStatus is each step's status, with the table of a finished
	// mission only.
	StepStatus []StepStatus `json:"step_status,omitempty"`
	// Done counts the steps carried out (see Mission.StepsDone), so a
	// mission that failed on its last step reads 5/6, not 6/6; Undone
	// counts those compensation reversed since. Done is nil in summaries
	// from older agents, which did not count.
	Done   *int `json:"done,omitempty"`
	Undone int  `json:"undone,omitempty"`
}

// StepsDone counts the steps that were carried out: those that
// succeeded, undone since or not. A step that failed, gave way or was
// skipped is not done, so a run with a failed branch reads 4/5.
func (m *Mission) StepsDone() int {
	n := 0
	for _, r := range m.Results {
		if r.Status == StepSucceeded || r.Status == StepCompensated {
			n++
		}
	}
	return n
}

// StepsUndone counts the steps whose effects compensation has reversed.
func (m *Mission) StepsUndone() int {
	n := 0
	for _, r := range m.Results {
		if r.Status == StepCompensated {
			n++
		}
	}
	return n
}

// Summarize returns m's summary, with its step table when table is set
// and, if m is finished, each step's status.
func (m *Mission) Summarize(table bool) Summary {
	s := Summary{
		Scene: m.Type, State: m.State, Priority: m.Priority, Step: m.Progress.Step, Steps: len(m.Steps),
		Error: m.Error, Reason: m.Reason, Created: m.Meta.Created, Updated: m.Meta.Updated,
		Finished: m.Meta.Finished, TraceID: m.Meta.TraceID, Source: m.Meta.Source,
		Undone: m.StepsUndone(),
	}
	done := m.StepsDone()
	s.Done = &done
	if !table || len(m.Steps) == 0 {
		return s
	}
	s.StepIDs, s.StepNames, s.StepTargets = make([]string, len(m.Steps)), make([]string, len(m.Steps)), make([]string, len(m.Steps))
	for i, st := range m.Steps {
		s.StepIDs[i], s.StepNames[i], s.StepTargets[i] = st.ID, st.Name, st.Target
	}
	if m.State.Terminal() && len(m.Results) == len(m.Steps) {
		s.StepStatus = make([]StepStatus, len(m.Results))
		for i, r := range m.Results {
			s.StepStatus[i] = r.Status
		}
	}
	return s
}
