package driver

import "fmt"

// State is where a mission stands. The zero value is invalid.
type State string

// Mission states. SUCCEEDED, FAILED and CANCELLED are terminal.
const (
	StatePending       State = "PENDING"        // accepted, no step started
	StateRunning       State = "RUNNING"        // between steps
	StatePaused        State = "PAUSED"         // held at a step boundary
	StateStepRunning   State = "STEP_RUNNING"   // a step attempt may be executing (write-ahead)
	StateStepSucceeded State = "STEP_SUCCEEDED" // the current step finished well
	StateStepFailed    State = "STEP_FAILED"    // the current attempt failed; a retry may be due
	StateCompensating  State = "COMPENSATING"   // undoing completed steps in reverse order
	StateSucceeded     State = "SUCCEEDED"
	StateFailed        State = "FAILED"
	StateCancelled     State = "CANCELLED"
)

// States lists every state, in lifecycle order.
var States = []State{
	StatePending, StateRunning, StatePaused, StateStepRunning, StateStepSucceeded,
	StateStepFailed, StateCompensating, StateSucceeded, StateFailed, StateCancelled,
}

// Terminal reports whether no transition leaves s (except Retry from FAILED,
// which an operator asks for explicitly).
func (s State) Terminal() bool {
	return s == StateSucceeded || s == StateFailed || s == StateCancelled
}

// Valid reports whether s is one of States.
func (s State) Valid() bool {
	for _, v := range States {
		if s == v {
			return true
		}
	}
	return false
}

// Input is what happens to a mission: the label on a state-machine edge.
type Input string

// Inputs to the state machine.
const (
	InStart        Input = "start"       // the loop picks a pending mission
	InBeginStep    Input = "begin_step"  // an attempt of the current step is about to execute
	InStepOK       Input = "step_ok"     // the attempt succeeded
	InStepError    Input = "step_error"  // the attempt failed (retryable or permanent)
	InStepWait     Input = "step_wait"   // the target is not ready: wait, spending no attempt
	InNext         Input = "next"        // move past the current step (done, or failed with on_error=continue)
	InComplete     Input = "complete"    // all steps are done
	InPause        Input = "pause"       // hold at a step boundary
	InResume       Input = "resume"      // leave PAUSED
	InCancel       Input = "cancel"      // stop; nothing to compensate, or compensation finished after a cancel
	InFail         Input = "fail"        // stop as failed; nothing to compensate, or compensation finished after a failure
	InCompensate   Input = "compensate"  // start undoing completed steps
	InCompBegin    Input = "comp_begin"  // a compensation attempt is about to execute
	InCompResult   Input = "comp_result" // a compensation attempt finished (ok or not)
	InRetry        Input = "retry"       // an operator restarts a failed mission
	InRecover      Input = "recover"     // a lease expired; the step is re-executed with the same key
	InReprioritise Input = "priority"    // priority changed; state unchanged
	// InGroupBegin, InGroupOK and InGroupFail are in group.go.
)

// Inputs lists every input.
var Inputs = []Input{
	InStart, InBeginStep, InStepOK, InStepError, InStepWait, InNext, InComplete, InPause, InResume,
	InCancel, InFail, InCompensate, InCompBegin, InCompResult, InRetry, InRecover, InReprioritise,
	InGroupBegin, InGroupOK, InGroupFail,
}

type edge struct {
	from  State
	input Input
}

// transitions is the whole state machine. Anything not listed is illegal.
var transitions = map[edge]State{
	{StatePending, InStart}:  StateRunning,
	{StatePending, InPause}:  StatePaused,
	{StatePending, InCancel}: StateCancelled,
	{StatePending, InFail}:   StateFailed,

	{StateRunning, InBeginStep}:  StateStepRunning,
	{StateRunning, InGroupBegin}: StateStepRunning,
	{StateRunning, InComplete}:   StateSucceeded,
	{StateRunning, InPause}:      StatePaused,
	{StateRunning, InCancel}:     StateCancelled,
	{StateRunning, InFail}:       StateFailed,
	{StateRunning, InCompensate}: StateCompensating,

	{StatePaused, InResume}:     StateRunning,
	{StatePaused, InCancel}:     StateCancelled,
	{StatePaused, InFail}:       StateFailed,
	{StatePaused, InCompensate}: StateCompensating,

	{StateStepRunning, InStepOK}:    StateStepSucceeded,
	{StateStepRunning, InStepError}: StateStepFailed,
	{StateStepRunning, InStepWait}:  StateRunning,
	{StateStepRunning, InGroupOK}:   StateStepSucceeded,
	{StateStepRunning, InGroupFail}: StateStepFailed,
	{StateStepRunning, InRecover}:   StateStepRunning,
	// Only for a step begun but never handed to a handler (the driver
	// knows); one that may have run must finish first.
	{StateStepRunning, InPause}:      StatePaused,
	{StateStepRunning, InCancel}:     StateCancelled,
	{StateStepRunning, InCompensate}: StateCompensating,

	{StateStepSucceeded, InNext}:       StateRunning,
	{StateStepSucceeded, InPause}:      StatePaused,
	{StateStepSucceeded, InCancel}:     StateCancelled,
	{StateStepSucceeded, InCompensate}: StateCompensating,

	{StateStepFailed, InBeginStep}:  StateStepRunning,
	{StateStepFailed, InNext}:       StateRunning,
	{StateStepFailed, InPause}:      StatePaused,
	{StateStepFailed, InCancel}:     StateCancelled,
	{StateStepFailed, InFail}:       StateFailed,
	{StateStepFailed, InCompensate}: StateCompensating,

	{StateCompensating, InCompBegin}:  StateCompensating,
	{StateCompensating, InCompResult}: StateCompensating,
	{StateCompensating, InRecover}:    StateCompensating,
	{StateCompensating, InFail}:       StateFailed,
	{StateCompensating, InCancel}:     StateCancelled,

	{StateFailed, InRetry}: StateRunning,
}

func init() {
	// Priority changes are legal wherever the mission is still live.
	for _, s := range States {
		if !s.Terminal() {
			transitions[edge{s, InReprioritise}] = s
		}
	}
}

// Next returns the state that input leads to from s, or a
// *TransitionError (which wraps ErrIllegalTransition).
func Next(s State, in Input) (State, error) {
	to, ok := transitions[edge{s, in}]
	if !ok {
		return s, &TransitionError{From: s, Input: in}
	}
	return to, nil
}

// String makes an edge readable in test names and logs.
func (e edge) String() string { return fmt.Sprintf("%s --%s-->", e.from, e.input) }
