package simulator

import (
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeToken is a paho.Token whose outcome the test sets.
type fakeToken struct {
	done chan struct{}
	err  error
}

func newFakeToken() *fakeToken  { return &fakeToken{done: make(chan struct{})} }
func (t *fakeToken) Wait() bool { <-t.done; return true }
func (t *fakeToken) WaitTimeout(d time.Duration) bool {
	select {
	case <-t.done:
		return true
	case <-time.After(d):
		return false
	}
}
func (t *fakeToken) Done() <-chan struct{} { return t.done }
func (t *fakeToken) Error() error          { return t.err }
func (t *fakeToken) finish(err error)      { t.err = err; close(t.done) }

type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// TestWatchPublishes: a command's publishes are followed up without a
// goroutine per command: a failed one is logged at the next look, one
// still waiting is kept, one past the token timeout is logged as lost,
// and one acknowledged is forgotten.
func TestWatchPublishes(t *testing.T) {
	d := offlineDevice(t, "light", Faults{})
	var logs syncBuf
	d.log = slog.New(slog.NewTextHandler(&logs, nil))
	failed, waiting, acked, stuck := newFakeToken(), newFakeToken(), newFakeToken(), newFakeToken()
	now := time.Now()
	d.watch([]sent{{o: output{topic: "a/ack", ack: true}, tok: stuck}}, now)
	d.watch([]sent{
		{o: output{topic: "b/ack", ack: true}, tok: failed},
		{o: output{topic: "b/state"}, tok: waiting},
		{o: output{topic: "c/state"}, tok: acked},
		{o: output{topic: "d/state"}},
	}, now.Add(time.Millisecond))
	if got := logs.String(); !strings.Contains(got, "topic=d/state err=offline") {
		t.Errorf("a publish made offline is not logged as lost:\n%s", got)
	}
	failed.finish(errors.New("connection lost"))
	acked.finish(nil)
	d.watch(nil, now.Add(time.Second))
	got := logs.String()
	if !strings.Contains(got, `topic=b/ack err="connection lost"`) || strings.Contains(got, "c/state") || strings.Contains(got, "b/state") {
		t.Errorf("after the next look: want only b/ack's loss logged, got:\n%s", got)
	}
	if len(d.unsettled) != 2 {
		t.Errorf("%d publishes still awaited, want 2 (a/ack, b/state)", len(d.unsettled))
	}
	d.watch(nil, now.Add(tokenTimeout+time.Millisecond/2))
	if got := logs.String(); !strings.Contains(got, "topic=a/ack") || !strings.Contains(got, "no PUBACK") {
		t.Errorf("a publish past the token timeout is not logged as lost:\n%s", got)
	}
	if len(d.unsettled) != 1 {
		t.Errorf("%d publishes still awaited, want 1 (b/state)", len(d.unsettled))
	}
	many := make([]sent, maxUnsettled+5)
	for i := range many {
		many[i] = sent{o: output{topic: "m"}, tok: waiting}
	}
	d.watch(many, now.Add(tokenTimeout+time.Millisecond/2))
	if len(d.unsettled) != maxUnsettled || !strings.Contains(logs.String(), "dropped=6") {
		t.Errorf("awaited publishes: %d (want %d), and the drop logged:\n%s", len(d.unsettled), maxUnsettled, logs.String())
	}
}
