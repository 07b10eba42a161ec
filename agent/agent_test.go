package agent_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/agent/agenttest"
	"github.com/sortie-edge/sortie/broker"
	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/internal/testkit"
)

// TestRunStopsCleanlyDespiteASilentAPIConnection: a client that opened a
// connection to the API and sent nothing (net/http waits 5 s for those
// before it calls them idle) neither holds the agent's stop past its
// grace nor makes Run fail. Found by a benchmark whose HTTP client had
// dialled one connection more than it used.
func TestRunStopsCleanlyDespiteASilentAPIConnection(t *testing.T) {
	a := agenttest.Start(t, agent.Options{})
	conn, err := net.Dial("tcp", a.Addrs().API[len("http://"):])
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }() // the test's own idle connection
	start := time.Now()
	a.Stop() // fails the test unless Run returns nil within its bound
	t.Logf("stopped in %v", time.Since(start).Round(time.Millisecond))
}

// TestStartWaitsOutARefusingBrokerAndReadyzSaysWhy: an external broker
// that refuses the agent's trigger subscription holds the start (the
// agent neither fails nor exits), /readyz says why meanwhile, and once
// the broker grants it the agent starts and is ready.
func TestStartWaitsOutARefusingBrokerAndReadyzSaysWhy(t *testing.T) {
	var allowed atomic.Bool
	b := brokertest.StartACL(t, "gw", "pw", func(topic string, write bool) bool {
		return write || !strings.HasSuffix(topic, "/trigger") || allowed.Load()
	})
	s := startWaiting(t, agent.BrokerOptions{URL: b.URL(), Username: "gw", Password: "pw"},
		"starting: broker: subscription refused by the broker: sortie/gateways/home/trigger")
	allowed.Store(true)
	s.ready(t)
}

// TestStartWaitsForABrokerNotUpYet: an agent started before its
// external broker listens waits for it, /readyz saying so, and starts
// once it is up.
func TestStartWaitsForABrokerNotUpYet(t *testing.T) {
	addr := testkit.FreeAddr(t)
	s := startWaiting(t, agent.BrokerOptions{URL: "tcp://" + addr}, "starting: devices: ")
	b, err := broker.Start(broker.Options{Addr: addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() }) // before the agent closes: its clients just see the broker go
	s.ready(t)
}

// waitingStart is an agent whose Start runs in the background.
type waitingStart struct {
	a       *agent.Agent
	api     string
	ctx     context.Context // ends at the test's end, or by stop
	stop    context.CancelFunc
	started chan error
}

// startWaiting starts an agent on the external broker bo in the
// background and waits until /readyz answers 503 with a reason starting
// with want, while Start has not returned.
func startWaiting(t *testing.T, bo agent.BrokerOptions, want string) *waitingStart {
	t.Helper()
	reg, cat := agenttest.Shipped(t)
	s := &waitingStart{api: testkit.FreeAddr(t), started: make(chan error, 1)}
	var err error
	s.a, err = agent.New(agent.Options{
		Gateway: "home", DataDir: t.TempDir(), Registry: reg, Catalog: cat, Broker: bo,
		HTTP: agent.HTTPOptions{Listen: s.api},
	})
	if err != nil {
		t.Fatal(err)
	}
	s.ctx, s.stop = context.WithCancel(context.Background())
	t.Cleanup(func() {
		s.stop()
		s.a.Close()
	})
	go func() { s.started <- s.a.Start(s.ctx) }()
	var code int
	var body string
	testkit.Until(t, 15*time.Second, func() error { // polling, as a supervisor does
		if code, body = s.readyz(); !strings.Contains(body, want) {
			return fmt.Errorf("/readyz while the agent waits for its broker: %d %s; want %q", code, body, want)
		}
		return nil
	})
	if code != http.StatusServiceUnavailable {
		t.Errorf("/readyz while starting: %d %s", code, body)
	}
	t.Logf("/readyz while starting: %d %s", code, strings.Join(strings.Fields(body), " "))
	select {
	case err := <-s.started:
		t.Fatalf("Start returned %v while the broker was not there for it; want it to wait", err)
	default:
	}
	return s
}

func (s *waitingStart) readyz() (int, string) {
	resp, err := http.Get("http://" + s.api + "/readyz")
	if err != nil {
		return 0, err.Error() // not listening yet
	}
	defer func() { _ = resp.Body.Close() }() // read to the end
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// ready waits for Start to return, then runs the agent until the test
// ends (its Run must then return nil) and checks that /readyz says
// ready.
func (s *waitingStart) ready(t *testing.T) {
	t.Helper()
	err := testkit.Receive(t, s.started, 20*time.Second, "Start did not return once the broker answered")
	if err != nil {
		t.Fatalf("Start once the broker answers: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- s.a.Run(s.ctx) }()
	t.Cleanup(func() {
		s.stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	if code, body := s.readyz(); code != http.StatusOK {
		t.Errorf("/readyz once started: %d %s", code, body)
	}
}
