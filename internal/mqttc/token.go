package mqttc

import (
	"context"
	"time"
)

// Token is an operation in flight (PublishAsync's): Done is closed when
// it is over, and Error then says how it went. A paho token is one.
type Token interface {
	Done() <-chan struct{}
	Error() error
}

// Wait waits for tok until it is done, ctx ends or d has passed (d of
// zero or less: no bound but ctx), and returns tok's error, ctx's cause
// or ErrTimeout. Every token is waited for through it: a broker that
// stops answering costs a bounded wait, never a hang.
func Wait(ctx context.Context, tok Token, d time.Duration) error {
	select {
	case <-tok.Done():
		return tok.Error()
	default:
	}
	var timeout <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-tok.Done():
		return tok.Error()
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-timeout:
		return ErrTimeout
	}
}

// doneToken is a Token that failed before it started.
type doneToken struct{ err error }

// closedCh is the Done of every doneToken.
var closedCh = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

func failed(err error) Token            { return doneToken{err} }
func (doneToken) Done() <-chan struct{} { return closedCh }
func (t doneToken) Error() error        { return t.err }
