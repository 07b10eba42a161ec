package simulator

import (
	"errors"
	"fmt"
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
	// Acknowledged after 4.5 s, looked at after 5.5 s: not lost.
	lateAck := newFakeToken()
	d.watch([]sent{{o: output{topic: "late/ack"}, tok: lateAck}}, now)
	lateAck.finish(nil)
	d.watch(nil, now.Add(tokenTimeout+500*time.Millisecond))
	if strings.Contains(logs.String(), "late/ack") {
		t.Errorf("a publish acknowledged in time is logged as lost:\n%s", logs.String())
	}
	// Over the bound the oldest are dropped, and the newest kept whole.
	many := make([]sent, maxUnsettled+5)
	for i := range many {
		many[i] = sent{o: output{topic: fmt.Sprintf("m%d", i)}, tok: waiting}
	}
	before := strings.Count(logs.String(), "message lost")
	d.watch(many, now.Add(tokenTimeout+time.Millisecond/2))
	if len(d.unsettled) != maxUnsettled || !strings.Contains(logs.String(), "dropped=5") {
		t.Errorf("awaited publishes: %d (want %d), and the drop logged:\n%s", len(d.unsettled), maxUnsettled, logs.String())
	}
	if last := d.unsettled[len(d.unsettled)-1]; last.tok == nil || last.o.topic != fmt.Sprintf("m%d", maxUnsettled+4) {
		t.Errorf("the newest awaited publish is %+v, want m%d with its token", last, maxUnsettled+4)
	}
	d.watch(nil, now.Add(tokenTimeout+time.Millisecond/2))
	if n := strings.Count(logs.String(), "message lost"); n != before {
		t.Errorf("%d publishes logged as lost after the trim, want none:\n%s", n-before, logs.String())
	}
}

// notifyBuf signals each write.
type notifyBuf struct {
	syncBuf
	wrote chan struct{}
}

func (n *notifyBuf) Write(p []byte) (int, error) {
	defer func() {
		select {
		case n.wrote <- struct{}{}:
		default:
		}
	}()
	return n.syncBuf.Write(p)
}

// TestWatchSweeps: publishes left awaited by the last command are looked
// at again without another command, and a loss among them is logged.
func TestWatchSweeps(t *testing.T) {
	d := offlineDevice(t, "light", Faults{})
	logs := &notifyBuf{wrote: make(chan struct{}, 1)}
	d.log = slog.New(slog.NewTextHandler(logs, nil))
	tok := newFakeToken()
	d.watch([]sent{{o: output{topic: "last/ack", ack: true}, tok: tok}}, time.Now())
	tok.finish(errors.New("connection lost"))
	deadline := time.After(10 * time.Second)
	for !strings.Contains(logs.String(), "last/ack") {
		select {
		case <-logs.wrote:
		case <-deadline:
			t.Fatalf("the last command's lost publish was never logged:\n%s", logs.String())
		}
	}
	d.unsettledMu.Lock()
	left, sweeping := len(d.unsettled), d.sweeping
	d.unsettledMu.Unlock()
	if left != 0 || sweeping {
		t.Errorf("after the sweep: %d awaited, sweeping %v; want none", left, sweeping)
	}
}
