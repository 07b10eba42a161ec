package hub

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sortie-edge/sortie/agent/hubsync"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/clustertest"
	"github.com/sortie-edge/sortie/store"
	"github.com/sortie-edge/sortie/uplink"
)

// cluster is the cluster mode on one machine: NATS nodes, PostgreSQL,
// and hub replicas sharing them.
type cluster struct {
	nats     *clustertest.NATS
	pg       *clustertest.Postgres
	replicas []*clusterReplica
	// tune, when set, changes each replica's options.
	tune func(*ServiceOptions)
}

type clusterReplica struct {
	st     *PGStore
	svc    *Service
	api    *API
	cancel context.CancelFunc
	done   chan error
}

// gatewayUser is gateway gw's NATS user: MQTT only, its own topics only.
func gatewayUser(gw string) clustertest.User {
	p, err := GatewayNATSPermissions("", gw)
	if err != nil {
		panic(err) // the tests' own IDs
	}
	return clustertest.User{
		Name: gw, Password: gatewayPassword(gw),
		Publish: p.Publish, Subscribe: p.Subscribe, ConnectionTypes: []string{"MQTT"},
	}
}

// hubNATSUser is the replicas' NATS user, with only the permissions
// configs/nats.conf gives it (TestNATSExampleConfig holds the two to
// each other), so that the cluster tests fail when the hub needs more.
func hubNATSUser() clustertest.User {
	p, err := HubNATSPermissions("")
	if err != nil {
		panic(err)
	}
	return clustertest.User{
		Name: "hub", Password: "pw-hub-replicas",
		Publish: p.Publish, Subscribe: p.Subscribe, ConnectionTypes: []string{"STANDARD"},
	}
}

func startCluster(t *testing.T, nodes, replicas int, gateways []string) *cluster {
	t.Helper()
	return startClusterWith(t, nodes, replicas, gateways, nil)
}

// startClusterWith is startCluster with each replica's options changed
// by tune.
func startClusterWith(t *testing.T, nodes, replicas int, gateways []string, tune func(*ServiceOptions)) *cluster {
	t.Helper()
	users := []clustertest.User{hubNATSUser()}
	for _, gw := range gateways {
		users = append(users, gatewayUser(gw))
	}
	c := &cluster{
		nats: clustertest.StartNATS(t, nodes, clustertest.NATSOptions{Users: users}),
		pg:   clustertest.StartPostgres(t, clustertest.PostgresOptions{Settings: map[string]string{"fsync": "off"}}),
		tune: tune,
	}
	for range replicas {
		c.startReplica(t, gateways)
	}
	return c
}

func (c *cluster) startReplica(t *testing.T, gateways []string) *clusterReplica {
	t.Helper()
	st, err := OpenPG(context.Background(), c.pg.DSN())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Register(t.Context(), time.Now(), gateways...); err != nil {
		t.Fatal(err)
	}
	opts := ServiceOptions{
		Cluster: &ClusterOptions{
			NATS: c.nats.ClientURLs(), User: hubNATSUser().Name, Password: hubNATSUser().Password,
			Replicas: min(3, len(c.nats.Nodes)), AckWait: 5 * time.Second,
		},
		ControlTimeout: 20 * time.Second, ControlResend: 250 * time.Millisecond,
		Logger: testLogger(t),
	}
	if c.tune != nil {
		c.tune(&opts)
	}
	svc := NewService(st, opts)
	ctx, cancel := context.WithCancel(context.Background())
	r := &clusterReplica{st: st, svc: svc, api: NewAPI(svc, APIOptions{Token: testToken}), cancel: cancel, done: make(chan error, 1)}
	t.Cleanup(r.api.Close)
	go func() { r.done <- svc.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	select {
	case <-svc.Ready():
	case err := <-r.done:
		t.Fatalf("replica stopped: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("replica not ready")
	}
	c.replicas = append(c.replicas, r)
	return r
}

func (r *clusterReplica) stop(t *testing.T) {
	if r.cancel == nil {
		return
	}
	r.cancel()
	if err := <-r.done; err != nil {
		t.Errorf("replica run: %v", err)
	}
	_ = r.st.Close()
	r.cancel = nil
}

// call makes an API request of the replica and returns the status and
// body.
func (r *clusterReplica) call(method, path, body string) (int, string) {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+testToken)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	rec := httptest.NewRecorder()
	r.api.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

// testLogger logs to the test's output when SORTIE_TEST_LOG is set (the
// chaos test has 200 gateways: too much for every -v run).
func testLogger(t *testing.T) *slog.Logger {
	if os.Getenv("SORTIE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(&testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

type testWriter struct{ t *testing.T }

func (w *testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

// simGateway is a gateway with a real outbox (a store with the outbox
// on) and a real uplink, writing missions as an agent would.
type simGateway struct {
	id     string
	broker string
	db     *store.DB
	ctl    *countingControl
	ms     map[string]*driver.Mission
	log    *slog.Logger
	// tune, when set, changes the uplink's options.
	tune func(*hubsync.Options)

	mu     sync.Mutex
	up     *hubsync.Uplink
	stopUp func()
	// ledger is every event written, in outbox order: entry i has
	// outbox seq i+1.
	ledger []evKey
}

type evKey struct {
	mission string
	seq     uint64
}

// countingControl answers every request, counting them by ID.
type countingControl struct {
	mu  sync.Mutex
	ids map[string]int
}

func (c *countingControl) Control(_ context.Context, r uplink.Control) uplink.ControlResult {
	c.mu.Lock()
	c.ids[r.ID]++
	c.mu.Unlock()
	return uplink.ControlResult{OK: true, MissionID: r.MissionID, State: driver.StateCancelled}
}

// startSimGateway opens the gateway's store in dir ("" for a test
// directory) and starts its uplink to broker.
func startSimGateway(t *testing.T, id, broker, dir string) *simGateway {
	t.Helper()
	return startSimGatewayWith(t, id, broker, dir, nil)
}

// startSimGatewayWith is startSimGateway with the uplink's options
// changed by tune.
func startSimGatewayWith(t *testing.T, id, broker, dir string, tune func(*hubsync.Options)) *simGateway {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	db, err := store.Open(filepath.Join(dir, id+".db"), store.Options{Timeout: time.Second, Outbox: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	g := &simGateway{id: id, broker: broker, db: db, ctl: &countingControl{ids: map[string]int{}}, ms: map[string]*driver.Mission{}, log: testLogger(t).With("gw", id), tune: tune}
	g.startUplink(t)
	t.Cleanup(func() {
		g.stopUplink()
		_ = db.Close()
	})
	return g
}

func (g *simGateway) startUplink(t *testing.T) {
	t.Helper()
	opts := hubsync.Options{
		// nats-server refuses a "." in an MQTT client ID.
		Broker: g.broker, Gateway: g.id, ClientID: "sortie-gw-" + strings.ReplaceAll(g.id, ".", "_"), Username: g.id,
		Password: gatewayPassword(g.id), Source: g.db, Traces: g.db, Control: g.ctl, Logger: g.log, Version: "test",
		HeartbeatInterval: time.Hour, ResendTimeout: 2 * time.Second, Timeout: 5 * time.Second,
		MaxReconnectInterval: 500 * time.Millisecond,
		// As docs/cluster.md advises (the single hub's tests that use
		// these gateways start the hub first: it hears the status live).
		NoRetain: true,
	}
	if g.tune != nil {
		g.tune(&opts)
	}
	up, err := hubsync.New(opts)
	if err != nil {
		t.Errorf("uplink %s: %v", g.id, err) // may run on a fault's goroutine
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- up.Run(ctx) }()
	g.mu.Lock()
	g.up = up
	g.stopUp = func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("uplink %s: %v", g.id, err)
		}
	}
	g.mu.Unlock()
}

// stopUplink takes the gateway off line; its store goes on.
func (g *simGateway) stopUplink() {
	g.mu.Lock()
	stop := g.stopUp
	g.stopUp, g.up = nil, nil
	g.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// advanceMission writes what an agent would for mission id in db: its
// creation when m is nil, else its next event, SUCCEEDED at the fourth.
// It returns the mission as written.
func advanceMission(ctx context.Context, db *store.DB, m *driver.Mission, id string) (*driver.Mission, error) {
	now := time.Now()
	if m == nil {
		m = &driver.Mission{
			ID: id, Type: "go_home", State: driver.StatePending, Version: 1, Seq: 1,
			Steps: []driver.Step{{ID: "lights", Kind: "device.command"}},
			Meta:  driver.Metadata{Created: now, Updated: now},
		}
		if _, _, err := db.Create(ctx, m, []driver.Event{{MissionID: id, Seq: 1, Type: "created", To: driver.StatePending, Step: -1, Time: now}}); err != nil {
			return nil, fmt.Errorf("create %s: %w", id, err)
		}
		return m, nil
	}
	n := m.Clone()
	n.Version++
	n.Seq++
	n.State = driver.StateRunning
	if n.Seq >= 4 {
		n.State = driver.StateSucceeded
		n.Meta.Finished = now
	}
	n.Meta.Updated = now
	if err := db.Save(ctx, n, []driver.Event{{MissionID: id, Seq: n.Seq, Type: "transition", From: m.State, To: n.State, Step: -1, Time: now}}); err != nil {
		return nil, fmt.Errorf("save %s: %w", id, err)
	}
	return n, nil
}

// step creates mission id, or moves it one event on (advanceMission),
// and notes it in the ledger. It may run on any goroutine (one per
// gateway).
func (g *simGateway) step(t *testing.T, id string) {
	t.Helper()
	m, err := advanceMission(context.Background(), g.db, g.ms[id], id)
	if err != nil {
		t.Errorf("%s: %v", g.id, err)
		return
	}
	g.ms[id] = m
	g.mu.Lock()
	g.ledger = append(g.ledger, evKey{id, m.Seq})
	if g.up != nil {
		g.up.Notify()
	}
	g.mu.Unlock()
}

// drain waits until the gateway's outbox is empty, failing the test
// (saying what) at deadline.
func (g *simGateway) drain(t *testing.T, deadline time.Time, what string) {
	t.Helper()
	for g.db.OutboxLen() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s %s: %d entries still in the outbox", g.id, what, g.db.OutboxLen())
		}
		time.Sleep(50 * time.Millisecond) // polling a count: nothing signals an empty outbox to a test
	}
}

// TestClusterReplicasShareTheFleet: gateways connected over MQTT to
// different NATS nodes; two hub replicas pull from one stream into one
// PostgreSQL. Every event is stored once, every outbox drains, a
// control sent through either replica reaches a gateway on any node and
// runs once, and a watcher on one replica sees what the other stored.
func TestClusterReplicasShareTheFleet(t *testing.T) {
	gws := []string{"gw-a", "gw-b", "gw-c", "gw.d"} // a "." in an ID crosses MQTT and NATS as "//"
	c := startCluster(t, 3, 2, gws)
	updates, stop := c.replicas[1].svc.Watch(4096)
	defer stop()

	sims := make([]*simGateway, len(gws))
	for i, gw := range gws {
		sims[i] = startSimGateway(t, gw, c.nats.Nodes[i%3].MQTTURL(), "")
	}
	const missions, events = 10, 4
	for _, g := range sims {
		for n := range missions * events {
			g.step(t, fmt.Sprintf("%s-m%d", g.id, n%missions))
		}
	}
	deadline := time.Now().Add(90 * time.Second)
	for _, g := range sims {
		g.drain(t, deadline, "")
	}
	var total int64
	if err := c.replicas[0].st.pool.QueryRow(context.Background(), `SELECT count(*) FROM sortie_events`).Scan(&total); err != nil {
		t.Fatal(err)
	}
	if want := int64(len(gws) * missions * events); total != want {
		t.Fatalf("%d events stored, want %d, each once", total, want)
	}
	// Presence comes through its own stream: wait for it, bounded.
	for _, gw := range gws {
		var g Gateway
		var err error
		for until := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) { // another stream's progress: polled
			if g, err = c.replicas[1].st.Gateway(t.Context(), gw); err != nil {
				t.Fatal(err)
			}
			if g.Protocol == uplink.Protocol && g.State == StateOnline || time.Now().After(until) {
				break
			}
		}
		if g.Acked != missions*events || g.Protocol != uplink.Protocol || g.State != StateOnline {
			t.Errorf("%s: acked %d, protocol %d, %s; want %d, %d, online", gw, g.Acked, g.Protocol, g.State, missions*events, uplink.Protocol)
		}
	}

	if n := c.replicas[0].st.size(); n <= 0 {
		t.Errorf("database size for /metrics = %d, want PostgreSQL's", n)
	}
	// The watcher on replica 1 saw every mission reach SUCCEEDED,
	// whichever replica stored it.
	succeeded := map[string]bool{}
	for len(succeeded) < len(gws)*missions {
		select {
		case u, ok := <-updates:
			if !ok {
				t.Fatal("the watcher was dropped")
			}
			if u.Mission != nil && u.Mission.Summary.State == driver.StateSucceeded {
				succeeded[u.Mission.Gateway+"/"+u.Mission.ID] = true
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("the watcher on replica 1 saw %d of %d missions finish", len(succeeded), len(gws)*missions)
		}
	}

	// A control through replica 0 to a gateway on node 2, and through
	// replica 1 to one on node 1: each runs once.
	for i, gw := range []string{"gw-c", "gw-b"} {
		r, err := c.replicas[i].svc.Control(context.Background(), gw, uplink.Control{Action: uplink.ActionCancel, MissionID: gw + "-m1"})
		if err != nil || !r.OK {
			t.Fatalf("control to %s through replica %d: %+v, %v", gw, i, r, err)
		}
	}
	for _, g := range sims {
		g.ctl.mu.Lock()
		for id, n := range g.ctl.ids {
			if n != 1 {
				t.Errorf("%s ran control %s %d times", g.id, id, n)
			}
		}
		g.ctl.mu.Unlock()
	}
	// With the user configs/nats.conf gives the hub, nothing was refused
	// (a refused stream ack only shows here, and in redeliveries).
	for i, r := range c.replicas {
		if h := r.svc.Readiness(context.Background()); h.Status != "ok" {
			t.Errorf("replica %d: readiness %+v", i, h)
		}
		if n := r.svc.link.(*natsLink).violations.Load(); n != 0 {
			t.Errorf("replica %d: NATS refused the hub %d times", i, n)
		}
	}
	// A replica whose database is away says so to a load balancer.
	if err := c.pg.Stop(); err != nil {
		t.Fatal(err)
	}
	c.replicas[0].svc.pingMu.Lock()
	c.replicas[0].svc.pingAt = time.Time{} // the answer cached before the stop is stale
	c.replicas[0].svc.pingMu.Unlock()
	if h := c.replicas[0].svc.Readiness(context.Background()); h.Status != "store_unavailable" {
		t.Errorf("readiness with PostgreSQL stopped: %+v", h)
	}
	if h := c.replicas[0].svc.Health(context.Background()); h.Status != "ok" {
		t.Errorf("health with PostgreSQL stopped: %+v; controls still work, and a load balancer must keep the replica", h)
	}
	api := NewAPI(c.replicas[0].svc, APIOptions{Token: testToken})
	defer api.Close()
	req := httptest.NewRequest("GET", "/api/missions", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	rec := httptest.NewRecorder()
	api.ServeHTTP(rec, req)
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), `"store_unavailable"`) {
		t.Errorf("a read with PostgreSQL stopped: %d %s", rec.Code, rec.Body.String())
	}
	if err := c.pg.Start(); err != nil {
		t.Fatal(err)
	}
}

// TestClusterRecoversADeletedConsumer: a consumer deleted under a running
// replica (an operator's slip) ends its consumption; the replica sets up
// again and ingests on, rather than report healthy while storing nothing.
func TestClusterRecoversADeletedConsumer(t *testing.T) {
	c := startCluster(t, 1, 1, []string{"gw-a"})
	g := startSimGateway(t, "gw-a", c.nats.Nodes[0].MQTTURL(), "")
	drained := func(what string) { t.Helper(); g.drain(t, time.Now().Add(60*time.Second), what) }
	for n := range 8 {
		g.step(t, fmt.Sprintf("m%d", n/4))
	}
	drained("before")
	nc, err := nats.Connect(c.nats.ClientURLs(), nats.UserInfo(c.nats.User, c.nats.Password))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := js.DeleteConsumer(ctx, streamUplink, consumerHub); err != nil {
		t.Fatal(err)
	}
	for n := 8; n < 16; n++ {
		g.step(t, fmt.Sprintf("m%d", n/4))
	}
	drained("after the consumer was deleted")
	if _, err := js.Consumer(ctx, streamUplink, consumerHub); err != nil {
		t.Fatalf("the consumer was not made again: %v", err)
	}
}

// grepLines is the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestClusterHealthSaysAPermissionIsMissing: a hub user that may not ack
// the streams stores every message and acks none, which nothing else
// shows (the messages come back as duplicates): /healthz says so.
func TestClusterHealthSaysAPermissionIsMissing(t *testing.T) {
	u := hubNATSUser()
	u.Publish = []string{"$JS.API.>", "sortie.hub.>"} // no $JS.ACK.>
	nc := clustertest.StartNATS(t, 1, clustertest.NATSOptions{Users: []clustertest.User{u, gatewayUser("gw-a")}})
	svc := NewService(testStore(t), ServiceOptions{
		Cluster: &ClusterOptions{NATS: nc.ClientURLs(), User: u.Name, Password: u.Password, Replicas: 1, AckWait: 5 * time.Second},
		Logger:  testLogger(t),
	})
	runService(t, svc, 60*time.Second)
	g := startSimGateway(t, "gw-a", nc.Nodes[0].MQTTURL(), "")
	g.step(t, "m1")
	g.drain(t, time.Now().Add(wait), "")
	var h Health
	for deadline := time.Now().Add(wait); ; time.Sleep(50 * time.Millisecond) { // the refusal comes back asynchronously
		if h = svc.Health(context.Background()); h.Status == "nats_permission_denied" || time.Now().After(deadline) {
			break
		}
	}
	if h.Status != "nats_permission_denied" || !strings.Contains(h.Message, "$JS.ACK") {
		t.Fatalf("health %+v, want nats_permission_denied naming the refused ack", h)
	}
	rec := httptest.NewRecorder()
	svc.Metrics().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if !regexp.MustCompile(`(?m)^sortie_hub_nats_permission_denials_total [1-9]`).MatchString(rec.Body.String()) {
		t.Errorf("/metrics does not count the refusals:\n%s", grepLines(rec.Body.String(), "nats_permission"))
	}
}
