package hub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/sortie-edge/sortie/broker"
	"github.com/sortie-edge/sortie/broker/passwd"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/uplink"
)

const (
	testToken   = "test-token"
	hubUser     = "hub"
	hubPassword = "hub-secret"
	hubClientID = "sortie-hub"
	// testIter keeps PBKDF2 cheap in tests; production hashes use
	// HashIterations.
	testIter = 1000
	wait     = 10 * time.Second
)

func gatewayPassword(id string) string { return "pw-" + id }

// testAuth returns the hook for gateways ids with gatewayPassword.
func testAuth(tb testing.TB, ids ...string) *broker.Auth {
	tb.Helper()
	creds := map[string]string{}
	for _, id := range ids {
		h, err := passwd.HashCost(gatewayPassword(id), testIter)
		if err != nil {
			tb.Fatal(err)
		}
		creds[id] = h
	}
	a, err := NewAuth(AuthOptions{HubUser: hubUser, HubPassword: hubPassword, HubClientID: hubClientID, Gateways: creds})
	if err != nil {
		tb.Fatal(err)
	}
	return a
}

// testBroker starts the embedded broker with the hub's ACL.
func testBroker(tb testing.TB, ids ...string) *broker.Broker {
	tb.Helper()
	auth := testAuth(tb, ids...)
	b, err := broker.Start(broker.Options{Addr: "127.0.0.1:0", Auth: auth})
	if err != nil {
		tb.Fatalf("start broker: %v", err)
	}
	tb.Cleanup(func() { _ = b.Close() })
	return b
}

// env is a running hub: broker with ACL, store, service and API.
type env struct {
	broker *broker.Broker
	st     *Store
	svc    *Service
	api    *API
	http   *httptest.Server
}

func newEnv(tb testing.TB, gateways ...string) *env {
	tb.Helper()
	return newEnvWith(tb, nil, gateways...)
}

// wrapStore, when set, stands between the next env's service and its
// store (a fault at a seam).
var wrapStore func(Backing) Backing

// newEnvWith is newEnv with the service's options changed by tune.
func newEnvWith(tb testing.TB, tune func(*ServiceOptions), gateways ...string) *env {
	tb.Helper()
	e := &env{broker: testBroker(tb, gateways...)}
	st, err := Open(filepath.Join(tb.TempDir(), "hub.db"), Options{NoSync: true})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = st.Close() })
	if err := st.Register(tb.Context(), time.Now(), gateways...); err != nil {
		tb.Fatal(err)
	}
	e.st = st
	o := ServiceOptions{
		Broker: e.broker.URL(), ClientID: hubClientID, Username: hubUser, Password: hubPassword,
		ControlTimeout: 5 * time.Second,
	}
	if tune != nil {
		tune(&o)
	}
	var backing Backing = st
	if wrapStore != nil {
		backing = wrapStore(st)
	}
	e.svc = NewService(backing, o)
	runService(tb, e.svc, wait)
	e.api = NewAPI(e.svc, APIOptions{Token: testToken})
	e.http = httptest.NewServer(e.api)
	tb.Cleanup(func() { e.api.Close(); e.http.Close() })
	return e
}

// runService runs svc until stop is called or the test ends (checking
// that Run returns nil) and waits up to within for it to be ready.
func runService(tb testing.TB, svc *Service, within time.Duration) (stop func()) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				tb.Errorf("service run: %v", err)
			}
		})
	}
	tb.Cleanup(stop)
	select {
	case <-svc.Ready():
	case err := <-done:
		done <- err // for stop
		tb.Fatalf("service stopped: %v", err)
	case <-time.After(within):
		tb.Fatal("service not ready")
	}
	return stop
}

// request sends an API request with the test token; it is safe to call
// from any goroutine.
func (e *env) request(method, path, body string) (int, []byte, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, e.http.URL+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+testToken)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := e.http.Client().Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer func() { _ = res.Body.Close() }() // read-only: a close error tells the test nothing
	if ct := res.Header.Get("Content-Type"); ct != "application/json" {
		return res.StatusCode, nil, fmt.Errorf("%s %s: content type %q", method, path, ct)
	}
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, b, err
}

// do is request for the test goroutine: it decodes the reply into out
// (if not nil) and returns the status.
func (e *env) do(tb testing.TB, method, path, body string, out any) int {
	tb.Helper()
	status, b, err := e.request(method, path, body)
	if err != nil {
		tb.Fatal(err)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			tb.Fatalf("%s %s: decode reply %q: %v", method, path, b, err)
		}
	}
	return status
}

func decodeJSON(tb testing.TB, res *http.Response, out any) {
	tb.Helper()
	if ct := res.Header.Get("Content-Type"); ct != "application/json" {
		tb.Fatalf("content type %q", ct)
	}
	if err := json.NewDecoder(res.Body).Decode(out); err != nil {
		tb.Fatalf("decode reply: %v", err)
	}
}

// fakeGateway speaks the gateway side of the uplink protocol.
type fakeGateway struct {
	id       string
	topics   uplink.Topics
	c        paho.Client
	acks     chan uplink.Ack
	controls chan uplink.Control
	lost     chan error
}

type gatewayOpts struct {
	password, clientID string
	will               string // will topic; "" for the own status topic
	anonymous          bool   // no user name and no password
}

func dialGateway(url, id string, o gatewayOpts) (*fakeGateway, error) {
	g := &fakeGateway{id: id, acks: make(chan uplink.Ack, 4096), controls: make(chan uplink.Control, 16), lost: make(chan error, 1)}
	if o.password == "" {
		o.password = gatewayPassword(id)
	}
	if o.clientID == "" {
		// A fresh ID per connection: mochi can drop the subscriptions of a
		// client that reconnects under an ID it is still tearing down.
		o.clientID = fmt.Sprintf("gw-%s-%d", id, clientSeq.Add(1))
	}
	if o.will == "" {
		o.will = g.topics.Status(id)
	}
	will, _ := json.Marshal(uplink.Status{Gateway: id, State: uplink.StateOffline})
	ready := make(chan error, 1)
	opts := paho.NewClientOptions().AddBroker(url).SetClientID(o.clientID)
	if !o.anonymous {
		opts.SetUsername(id).SetPassword(o.password)
	}
	opts.SetCleanSession(true).SetAutoReconnect(false).SetOrderMatters(false).SetConnectTimeout(wait).
		SetBinaryWill(o.will, will, 1, true)
	handle := func(_ paho.Client, m paho.Message) {
		if strings.HasSuffix(m.Topic(), "/ack") {
			if a, err := uplink.DecodeAck(m.Payload()); err == nil {
				g.acks <- a
			}
			return
		}
		if c, err := uplink.DecodeControl(m.Payload()); err == nil {
			g.controls <- c
		}
	}
	opts.SetOnConnectHandler(func(c paho.Client) {
		go func() {
			tok := c.SubscribeMultiple(map[string]byte{g.topics.Ack(id): 1, g.topics.Control(id): 1}, handle)
			if !tok.WaitTimeout(wait) {
				ready <- errors.New("subscribe timed out")
				return
			}
			ready <- tok.Error()
		}()
	})
	opts.SetConnectionLostHandler(func(_ paho.Client, err error) {
		select {
		case g.lost <- err:
		default:
		}
	})
	g.c = paho.NewClient(opts)
	if tok := g.c.Connect(); !tok.WaitTimeout(wait) || tok.Error() != nil {
		return nil, errors.Join(errors.New("connect"), tok.Error())
	}
	select {
	case err := <-ready:
		if err != nil {
			g.c.Disconnect(0)
			return nil, err
		}
	case <-time.After(wait):
		g.c.Disconnect(0)
		return nil, errors.New("subscriptions not made")
	}
	return g, nil
}

// clientSeq numbers the fake gateways' connections.
var clientSeq atomic.Int64

func newGateway(tb testing.TB, url, id string) *fakeGateway {
	tb.Helper()
	g, err := dialGateway(url, id, gatewayOpts{})
	if err != nil {
		tb.Fatalf("gateway %s: %v", id, err)
	}
	tb.Cleanup(func() { g.c.Disconnect(50) })
	return g
}

func (g *fakeGateway) publish(tb testing.TB, topic string, retained bool, v any) {
	tb.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	if tok := g.c.Publish(topic, 1, retained, b); !tok.WaitTimeout(wait) || tok.Error() != nil {
		tb.Fatalf("gateway %s publish %s: %v", g.id, topic, tok.Error())
	}
}

func (g *fakeGateway) online(tb testing.TB) {
	tb.Helper()
	g.publish(tb, g.topics.Status(g.id), true, uplink.Status{Gateway: g.id, State: uplink.StateOnline, Version: "test", Time: time.Now()})
}

func (g *fakeGateway) send(tb testing.TB, es ...uplink.Entry) {
	tb.Helper()
	g.publish(tb, g.topics.Events(g.id), false, uplink.Batch{Gateway: g.id, Entries: es})
}

// waitAck waits for an ack covering upto.
func (g *fakeGateway) waitAck(tb testing.TB, upto uint64) {
	tb.Helper()
	deadline := time.After(wait)
	for {
		select {
		case a := <-g.acks:
			if a.Upto >= upto {
				return
			}
		case <-deadline:
			tb.Fatalf("gateway %s: no ack up to %d", g.id, upto)
		}
	}
}

func (g *fakeGateway) waitControl(tb testing.TB) uplink.Control {
	tb.Helper()
	select {
	case c := <-g.controls:
		return c
	case <-time.After(wait):
		tb.Fatalf("gateway %s: no control request", g.id)
	}
	return uplink.Control{}
}

// waitOnline waits until the store has seen the gateway online.
func (e *env) waitOnline(tb testing.TB, gw string) {
	tb.Helper()
	updates, stop := e.svc.Watch(64)
	defer stop()
	if g, err := e.st.Gateway(tb.Context(), gw); err == nil && g.State == StateOnline {
		return
	}
	deadline := time.After(wait)
	for {
		select {
		case u := <-updates:
			if u.Gateway != nil && u.Gateway.ID == gw && u.Gateway.State == StateOnline {
				return
			}
		case <-deadline:
			tb.Fatalf("gateway %s never online", gw)
		}
	}
}

// observer is a hub-identity client that records everything under the
// prefix, to prove what the broker let through.
type observer struct {
	c    paho.Client
	msgs chan paho.Message
}

func newObserver(tb testing.TB, url string) *observer {
	tb.Helper()
	o := &observer{msgs: make(chan paho.Message, 1024)}
	opts := paho.NewClientOptions().AddBroker(url).SetClientID("observer").SetUsername(hubUser).SetPassword(hubPassword).
		SetOrderMatters(false).SetAutoReconnect(false)
	o.c = paho.NewClient(opts)
	if tok := o.c.Connect(); !tok.WaitTimeout(wait) || tok.Error() != nil {
		tb.Fatalf("observer connect: %v", tok.Error())
	}
	tok := o.c.Subscribe(uplink.DefaultPrefix+"/#", 1, func(_ paho.Client, m paho.Message) { o.msgs <- m })
	if !tok.WaitTimeout(wait) || tok.Error() != nil {
		tb.Fatalf("observer subscribe: %v", tok.Error())
	}
	tb.Cleanup(func() { o.c.Disconnect(50) })
	return o
}

// until returns the messages received before (and excluding) the first
// one on topic with the marker payload.
func (o *observer) until(tb testing.TB, topic, marker string) []paho.Message {
	tb.Helper()
	var seen []paho.Message
	deadline := time.After(wait)
	for {
		select {
		case m := <-o.msgs:
			if m.Topic() == topic && strings.Contains(string(m.Payload()), marker) {
				return seen
			}
			seen = append(seen, m)
		case <-deadline:
			tb.Fatalf("marker %q on %s never arrived", marker, topic)
		}
	}
}

// running is a mission entry in a plausible state for the dashboard.
func running(oseq uint64, id string, seq uint64) uplink.Entry {
	e := entry(oseq, id, seq, driver.StateRunning)
	e.Mission.Created = time.Now()
	return e
}

func mustJSON(tb testing.TB, v any) []byte {
	tb.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}
