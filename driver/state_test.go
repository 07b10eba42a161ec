package driver

import (
	"errors"
	"testing"
)

// TestStateTable checks every (state, input) pair against an independent
// statement of the legal edges; everything else must be rejected.
func TestStateTable(t *testing.T) {
	legal := map[State]map[Input]State{
		StatePending: {InStart: StateRunning, InPause: StatePaused, InCancel: StateCancelled, InFail: StateFailed},
		StateRunning: {InBeginStep: StateStepRunning, InGroupBegin: StateStepRunning, InComplete: StateSucceeded, InPause: StatePaused,
			InCancel: StateCancelled, InFail: StateFailed, InCompensate: StateCompensating},
		StatePaused: {InResume: StateRunning, InCancel: StateCancelled, InFail: StateFailed, InCompensate: StateCompensating},
		StateStepRunning: {InStepOK: StateStepSucceeded, InStepError: StateStepFailed, InStepWait: StateRunning, InRecover: StateStepRunning,
			InGroupOK: StateStepSucceeded, InGroupFail: StateStepFailed,
			InPause: StatePaused, InCancel: StateCancelled, InCompensate: StateCompensating},
		StateStepSucceeded: {InNext: StateRunning, InPause: StatePaused, InCancel: StateCancelled, InCompensate: StateCompensating},
		StateStepFailed: {InBeginStep: StateStepRunning, InNext: StateRunning, InPause: StatePaused,
			InCancel: StateCancelled, InFail: StateFailed, InCompensate: StateCompensating},
		StateCompensating: {InCompBegin: StateCompensating, InCompResult: StateCompensating, InRecover: StateCompensating,
			InFail: StateFailed, InCancel: StateCancelled},
		StateSucceeded: {},
		StateFailed:    {InRetry: StateRunning},
		StateCancelled: {},
	}
	for _, s := range States {
		for _, in := range Inputs {
			t.Run(string(s)+"/"+string(in), func(t *testing.T) {
				want, ok := legal[s][in]
				if in == InReprioritise && !s.Terminal() {
					want, ok = s, true
				}
				got, err := Next(s, in)
				if !ok {
					var te *TransitionError
					if !errors.Is(err, ErrIllegalTransition) || !errors.As(err, &te) || te.From != s || te.Input != in {
						t.Fatalf("Next(%s, %s) = %s, %v; want illegal transition", s, in, got, err)
					}
					if got != s {
						t.Fatalf("illegal transition changed the state to %s", got)
					}
					return
				}
				if err != nil || got != want {
					t.Fatalf("Next(%s, %s) = %s, %v; want %s", s, in, got, err, want)
				}
			})
		}
	}
}

func TestTerminalStatesAreTerminal(t *testing.T) {
	for _, s := range States {
		if !s.Terminal() {
			continue
		}
		for _, in := range Inputs {
			if s == StateFailed && in == InRetry {
				continue // the one explicit way out, asked for by an operator
			}
			if _, err := Next(s, in); err == nil {
				t.Errorf("%s leaves terminal state %s", in, s)
			}
		}
	}
}

func TestValidateID(t *testing.T) {
	for _, id := range []string{"", "a/b", "a+b", "a#", "a b", "a\x00b", "x\u0085", string(make([]byte, MaxIDLen+1))} {
		if err := ValidateID("id", id); !errors.Is(err, ErrInvalid) {
			t.Errorf("ValidateID(%q) = %v, want ErrInvalid", id, err)
		}
	}
	for _, id := range []string{"go_home", "living-light.1", "réveil"} {
		if err := ValidateID("id", id); err != nil {
			t.Errorf("ValidateID(%q) = %v", id, err)
		}
	}
}

func TestClassify(t *testing.T) {
	cases := []struct {
		err  error
		want Class
	}{
		{errors.New("x"), Retryable},
		{PermanentError("c", errors.New("x")), Permanent},
		{NotReadyError("c", 0, errors.New("x")), NotReady},
		{ErrAckTimeout, Retryable},
		{ErrUnknownKind, Permanent},
		{errors.Join(errors.New("ctx"), ErrNotReady), NotReady},
	}
	for _, c := range cases {
		if got, _ := Classify(c.err); got != c.want {
			t.Errorf("Classify(%v) = %s, want %s", c.err, got, c.want)
		}
	}
	if !errors.Is(PermanentError("c", errors.New("x")), ErrPermanent) {
		t.Error("PermanentError does not match ErrPermanent")
	}
}

func TestBackoff(t *testing.T) {
	p := RetryPolicy{InitialBackoff: Duration(100e6), Multiplier: 3, MaxBackoff: Duration(1e9)}
	want := []int64{100e6, 300e6, 900e6, 1e9, 1e9}
	for i, w := range want {
		if got := p.Backoff(i+2, nil); int64(got) != w {
			t.Errorf("backoff before attempt %d = %v, want %v", i+2, got, w)
		}
	}
	if got := p.Backoff(1000, nil); int64(got) != 1e9 {
		t.Errorf("huge attempt: %v", got)
	}
}
