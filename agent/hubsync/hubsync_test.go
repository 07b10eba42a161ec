package hubsync

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/broker"
	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/clustertest"
	"github.com/sortie-edge/sortie/uplink"
)

type fakeHealth struct{}

func (fakeHealth) Heartbeat(context.Context) uplink.Heartbeat {
	return uplink.Heartbeat{Active: 2, Devices: []uplink.DeviceState{{ID: "lamp-1", Type: "light", Online: true}, {ID: "lock-1", Type: "lock"}}}
}

func TestSyncDeliversAndDeletesAfterAck(t *testing.T) {
	b := brokertest.Start(t)
	h := newHub(t, b.URL())
	w := newWorld(t)
	w.steps(3, 12) // written before the uplink starts
	opts := testOptions(b.URL(), w)
	opts.BatchSize, opts.Window, opts.Heartbeat = 5, 2, fakeHealth{}
	u, _ := start(t, opts)

	// The window holds two batches of five until the hub acks.
	h.waitFor("10 entries", h.has(10))
	h.waitFor("a heartbeat", func() bool { return len(h.beats) > 0 })
	h.mu.Lock()
	if hb := h.beats[0]; hb.Gateway != gw || hb.Version != "1.2.3" || hb.Active != 2 || len(hb.Devices) != 2 || hb.Backlog != 12 {
		t.Errorf("heartbeat = %+v", hb)
	}
	h.mu.Unlock()
	if n := w.db.OutboxLen(); n != 12 {
		t.Fatalf("before any ack the outbox holds %d, want 12", n)
	}
	// A partial ack deletes exactly what it names, and frees the window
	// for the rest.
	h.ack(7)
	waitStats(t, u, "7 acked", func(s Stats) bool { return s.Acked == 7 })
	if es, _ := w.db.Outbox(context.Background(), 0, 0); len(es) != 5 || es[0].Seq != 8 {
		t.Errorf("after ack 7 the outbox starts at %v", es)
	}
	h.waitFor("12 entries", h.has(12))
	h.ack(12)
	s := waitStats(t, u, "all acked", func(s Stats) bool { return s.Acked == 12 })
	if s.Backlog != 0 || s.Lag != 0 || s.LastAck.IsZero() || !s.Connected || s.Batches < 3 {
		t.Errorf("stats = %+v", s)
	}

	// New entries go out at once on Notify; nothing polls (the resend
	// timeout is an hour).
	w.steps(3, 4)
	u.Notify()
	h.waitFor("16 entries", h.has(16))
	h.ack(16)
	waitStats(t, u, "all acked", func(s Stats) bool { return s.Acked == 16 && s.Backlog == 0 })
	h.checkDelivered(w)
	h.mu.Lock()
	if h.received != 16 {
		t.Errorf("hub received %d entries, want 16 (no resends without cause)", h.received)
	}
	h.mu.Unlock()
}

func TestSyncHubAbsentThenBack(t *testing.T) {
	b := brokertest.Start(t)
	h := newHub(t, b.URL())
	w := newWorld(t)
	w.steps(4, 20)
	opts := testOptions(b.URL(), w)
	opts.BatchSize, opts.Window, opts.ResendTimeout = 4, 2, 100*time.Millisecond
	u, _ := start(t, opts)

	// No acks: the window is sent again and again, and nothing deleted.
	waitStats(t, u, "two resends", func(s Stats) bool { return s.Resends >= 2 })
	if n := w.db.OutboxLen(); n != 20 {
		t.Fatalf("without acks the outbox holds %d, want 20", n)
	}
	h.waitFor("the first window", h.has(8))
	// The hub acks what it has, each time; the rest follows.
	for {
		h.mu.Lock()
		upto := h.maxSeq
		h.mu.Unlock()
		h.ack(upto)
		s := waitStats(t, u, "ack taken", func(s Stats) bool { return s.Acked >= upto })
		if s.Backlog == 0 {
			break
		}
		h.waitFor("more entries", func() bool { return h.maxSeq > upto })
	}
	h.checkDelivered(w)
}

func TestSyncSurvivesBrokerRestart(t *testing.T) {
	b, err := broker.Start(broker.Options{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	addr, url := b.Addr(), b.URL()
	h := newHub(t, url)
	w := newWorld(t)
	w.steps(2, 6)
	opts := testOptions(url, w)
	// The hub's own client may resubscribe after the uplink resends; what
	// it missed then goes again after the resend timeout.
	opts.ResendTimeout = 200 * time.Millisecond
	u, _ := start(t, opts)
	h.waitFor("6 entries", h.has(6))

	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	waitStats(t, u, "disconnected", func(s Stats) bool { return !s.Connected })
	w.steps(3, 9) // written while the hub is unreachable
	u.Notify()
	b2, err := broker.Start(broker.Options{Addr: addr})
	if err != nil {
		t.Fatalf("restart broker on %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = b2.Close() }) // as simulator.TestBroker does: the test is over

	// Nothing was acked before the restart, so everything is resent.
	h.waitFor("15 entries", h.has(15))
	h.mu.Lock()
	upto := h.maxSeq
	h.mu.Unlock()
	h.ack(upto)
	waitStats(t, u, "all acked", func(s Stats) bool { return s.Backlog == 0 && s.Connects >= 2 })
	h.checkDelivered(w)
}

func TestSyncResumesAfterAgentRestart(t *testing.T) {
	b := brokertest.Start(t)
	h := newHub(t, b.URL())
	path := filepath.Join(t.TempDir(), "sortie.db")
	w := &world{tb: t, db: openStore(t, path), ms: map[string]*driver.Mission{}}
	w.steps(2, 5)
	u1, stop1 := start(t, testOptions(b.URL(), w))
	h.waitFor("5 entries", h.has(5))
	h.ack(3)
	waitStats(t, u1, "3 acked", func(s Stats) bool { return s.Acked == 3 })
	stop1()

	// The agent restarts: a new store handle on the file and a new uplink.
	if err := w.db.Close(); err != nil {
		t.Fatal(err)
	}
	w.db = openStore(t, path)
	w.steps(2, 3)
	opts := testOptions(b.URL(), w)
	u2, _ := start(t, opts)
	h.waitFor("8 entries", h.has(8))
	h.ack(8)
	waitStats(t, u2, "all acked", func(s Stats) bool { return s.Backlog == 0 })
	h.checkDelivered(w)
	h.mu.Lock()
	if h.received != 10 { // 5, then entries 4..8 from the restarted uplink
		t.Errorf("hub received %d entries, want 10", h.received)
	}
	h.mu.Unlock()
}

func TestAckBeyondSentIsCapped(t *testing.T) {
	b := brokertest.Start(t)
	h := newHub(t, b.URL())
	w := newWorld(t)
	w.step("a")
	u, _ := start(t, testOptions(b.URL(), w))
	h.waitFor("1 entry", h.has(1))
	h.ack(100) // more than was ever sent
	waitStats(t, u, "ack taken", func(s Stats) bool { return s.Acked == 1 })
	w.steps(1, 3)
	u.Notify()
	h.waitFor("4 entries", h.has(4))
	// Give the stray ack every chance to be misapplied, with a real ack
	// of the first of the new entries.
	h.ack(2)
	waitStats(t, u, "ack 2 taken", func(s Stats) bool { return s.Acked == 2 })
	if n := w.db.OutboxLen(); n != 2 {
		t.Errorf("outbox holds %d entries, want 2: a stray ack deleted unacknowledged ones", n)
	}
}

func TestPresence(t *testing.T) {
	b := brokertest.Start(t)
	h := newHub(t, b.URL())
	w := newWorld(t)
	px := clustertest.StartProxy(t, b.Addr())
	u, stop := start(t, testOptions(px.URL(), w))
	waitStats(t, u, "connected", func(s Stats) bool { return s.Connected })
	lastState := func(h *hub, want string) func() bool {
		return func() bool { return len(h.statuses) > 0 && h.statuses[len(h.statuses)-1].State == want }
	}
	h.waitFor("online", lastState(h, uplink.StateOnline))

	// A late subscriber gets the retained status.
	late := newHub(t, b.URL())
	late.waitFor("retained online", lastState(late, uplink.StateOnline))
	late.mu.Lock()
	if s := late.statuses[len(late.statuses)-1]; s.Gateway != gw || s.Version != "1.2.3" || s.Started.IsZero() {
		t.Errorf("retained status = %+v", s)
	}
	late.mu.Unlock()

	// The link dies without a DISCONNECT: the broker publishes the will.
	// (The link stays down meanwhile: a client that reconnects at once
	// takes over its session, and mochi then drops the will.)
	px.SetDown(true)
	px.Cut()
	h.waitFor("offline (will)", lastState(h, uplink.StateOffline))
	waitStats(t, u, "disconnected", func(s Stats) bool { return !s.Connected })
	px.SetDown(false)
	h.waitFor("online again", lastState(h, uplink.StateOnline))
	waitStats(t, u, "reconnected", func(s Stats) bool { return s.Connects == 2 && s.Connected })

	// A clean stop says offline itself; the will is not sent on DISCONNECT.
	stop()
	h.waitFor("offline (stop)", lastState(h, uplink.StateOffline))
	late2 := newHub(t, b.URL())
	late2.waitFor("retained offline", lastState(late2, uplink.StateOffline))
}

// recordingControl answers trigger requests and records what it got.
type recordingControl struct {
	mu  sync.Mutex
	got []uplink.Control
}

func (r *recordingControl) Control(_ context.Context, c uplink.Control) uplink.ControlResult {
	r.mu.Lock()
	r.got = append(r.got, c)
	r.mu.Unlock()
	switch c.Action {
	case uplink.ActionTrigger:
		return uplink.ControlResult{OK: true, MissionID: "m-" + c.RequestID, State: driver.StatePending}
	case uplink.ActionPause:
		panic("pause exploded")
	default:
		return uplink.ControlResult{Error: "no such mission", Code: "not_found"}
	}
}

// startControlled starts a connected uplink whose control requests a
// recordingControl handles.
func startControlled(t *testing.T) (*hub, *recordingControl, *Uplink) {
	t.Helper()
	b := brokertest.Start(t)
	h := newHub(t, b.URL())
	rc := &recordingControl{}
	opts := testOptions(b.URL(), newWorld(t))
	opts.Control = rc
	u, _ := start(t, opts)
	waitStats(t, u, "connected", func(s Stats) bool { return s.Connected })
	return h, rc, u
}

func TestControl(t *testing.T) {
	h, rc, u := startControlled(t)

	for i, tc := range []struct {
		name    string
		payload any
		want    uplink.ControlResult
	}{
		{"trigger", uplink.Control{ID: "c1", Action: uplink.ActionTrigger, Scene: "go_home", RequestID: "r1", Params: map[string]any{"x": 1.0}},
			uplink.ControlResult{ID: "c1", OK: true, MissionID: "m-r1", State: driver.StatePending}},
		{"handler error", uplink.Control{ID: "c2", Action: uplink.ActionCancel, MissionID: "nope"},
			uplink.ControlResult{ID: "c2", Error: "no such mission", Code: "not_found"}},
		{"handler panic", uplink.Control{ID: "c3", Action: uplink.ActionPause, MissionID: "m1"},
			uplink.ControlResult{ID: "c3", Error: "internal error: pause exploded", Code: CodeInternal}},
		{"not json", []byte(`{"id":`), uplink.ControlResult{ID: "invalid", Code: CodeInvalid}},
		{"unknown action", []byte(`{"id":"c5","action":"explode"}`), uplink.ControlResult{ID: "c5", Code: CodeInvalid}},
		{"bad id", []byte(`{"id":"a/b","action":"trigger","scene":"s"}`), uplink.ControlResult{ID: "invalid", Code: CodeInvalid}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h.publish(h.topics.Control(gw), tc.payload)
			h.waitFor("result", func() bool { return len(h.results) > i })
			h.mu.Lock()
			got := h.results[i]
			h.mu.Unlock()
			if tc.want.Code == CodeInvalid {
				if got.Error == "" {
					t.Errorf("no error message in %+v", got)
				}
				got.Error = ""
			}
			if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", tc.want) {
				t.Errorf("result = %+v\nwant     %+v", got, tc.want)
			}
		})
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.got) != 3 || rc.got[0].Scene != "go_home" || rc.got[0].Params["x"] != 1.0 {
		t.Errorf("handler got %+v", rc.got)
	}
	// Stats count a request once its result is out; the hub may see it first.
	waitStats(t, u, "6 controls, 5 failed", func(s Stats) bool { return s.Controls == 6 && s.ControlErrors == 5 })
}

func TestControlOnForeignTopicIgnored(t *testing.T) {
	w := newWorld(t)
	u, err := New(testOptions("tcp://127.0.0.1:1", w))
	if err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{uplink.Topics{}.Control("gw-02"), uplink.Topics{}.Control(gw) + "/x", uplink.Topics{Prefix: "other"}.Control(gw)} {
		u.onControl(topic, []byte(`{"id":"c1","action":"cancel","mission_id":"m"}`))
	}
	if n := len(u.controls); n != 0 {
		t.Errorf("%d foreign requests queued", n)
	}
	u.onControl(uplink.Topics{}.Control(gw), []byte(`{}`))
	if n := len(u.controls); n != 1 {
		t.Errorf("own request not queued (%d)", n)
	}
	if s := u.Stats(); s.ControlDropped != 3 {
		t.Errorf("dropped %d, want 3", s.ControlDropped)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	w := newWorld(t)
	for name, o := range map[string]Options{
		"no broker":   {Gateway: gw, Source: w.db},
		"no source":   {Broker: "tcp://127.0.0.1:1", Gateway: gw},
		"bad gateway": {Broker: "tcp://127.0.0.1:1", Gateway: "a/b", Source: w.db},
		"no gateway":  {Broker: "tcp://127.0.0.1:1", Source: w.db},
	} {
		if _, err := New(o); !errors.Is(err, ErrOptions) {
			t.Errorf("%s: %v, want ErrOptions", name, err)
		}
	}
	u, err := New(testOptions("tcp://127.0.0.1:1", w))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := u.Run(ctx); err != nil {
		t.Errorf("Run with a cancelled context: %v", err)
	}
	if err := u.Run(context.Background()); !errors.Is(err, ErrRunning) {
		t.Errorf("second Run: %v, want ErrRunning", err)
	}
}

// TestUplinkTriesTheHubsAddressesInTurn: a gateway that knows two
// addresses of its hub (two nodes of a cluster, here two brokers a hub
// listens on) moves to the second when the first goes down, says where
// it is, and what it sends reaches the hub there.
func TestUplinkTriesTheHubsAddressesInTurn(t *testing.T) {
	b1, b2 := brokertest.Start(t), brokertest.Start(t)
	h1, h2 := newHub(t, b1.URL()), newHub(t, b2.URL())
	w := newWorld(t)
	px := clustertest.StartProxy(t, b1.Addr())
	opts := testOptions(px.URL(), w)
	opts.Brokers = []string{b2.URL(), px.URL()}
	u, _ := start(t, opts)
	waitStats(t, u, "connected to the first address", func(s Stats) bool { return s.Connected && s.Broker == px.URL() })
	w.steps(1, 2)
	u.Notify()
	h1.waitFor("two events through the first", h1.has(2))

	px.SetDown(true)
	px.Cut()
	waitStats(t, u, "connected to the second address", func(s Stats) bool { return s.Connected && s.Broker == b2.URL() && s.Connects == 2 })
	w.steps(1, 2)
	u.Notify()
	h2.waitFor("the events through the second", h2.has(4))
	h2.mu.Lock()
	if n := len(h2.statuses); n == 0 || h2.statuses[n-1].State != uplink.StateOnline || h2.statuses[n-1].Broker != b2.URL() {
		t.Errorf("statuses at the second address: %+v, want online, saying it is on %s", h2.statuses, b2.URL())
	}
	h2.mu.Unlock()
}
