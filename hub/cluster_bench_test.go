package hub

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/agent/hubsync"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/clustertest"
	"github.com/sortie-edge/sortie/internal/mqttc"
	"github.com/sortie-edge/sortie/store"
	"github.com/sortie-edge/sortie/uplink"
)

// ingestBacklog is how many events a gateway of BenchmarkClusterIngest
// keeps written and not yet acknowledged: it writes whenever its outbox
// holds fewer, so it writes as fast as the hub drains.
const ingestBacklog = 128

// BenchmarkClusterIngest measures sustained ingest, from an event's
// write into a gateway's outbox to the hub's ack that lets the gateway
// delete it, for the same 200 gateways (real stores with their outbox on,
// on /dev/shm when there is one; real hubsync uplinks over MQTT) feeding,
// one after the other in the same run:
//
//   - single: the single-node hub, its embedded broker and an fsynced
//     bbolt store, as BenchmarkIngest sets up;
//   - cluster: 3 NATS nodes (MQTT and JetStream, streams R3) and 2
//     in-process hub replicas sharing PostgreSQL, which runs with its
//     default durability: fsync on, synchronous_commit on, its data on
//     the machine's disk (not tmpfs).
//
// The load is closed: each gateway writes mission events (one store
// commit each, missions of four events, as an agent does) whenever fewer
// than ingestBacklog of its events wait for an ack, for
// SORTIE_BENCH_SECONDS (default 10) per mode; then it stops writing and
// the run ends when every outbox is empty. A fixed offered load would
// only say whether the hub keeps up with it; this says how fast each
// mode stores, with the gateways' own cost the same in both.
//
// Metrics: events/s of each mode (every event written, over the time from
// the first write to the last ack), cluster/single, CPU per event (µs, from
// /proc/PID/stat) of the test process (gateways and hub, or gateways and
// replicas), of the NATS nodes and of PostgreSQL (postmaster and
// backends), and PostgreSQL's bytes per event (sortie_events and
// sortie_missions with their indexes and TOAST) and WAL bytes per event;
// others-cpu-% is the CPU that other processes took from the run (the
// larger of the two modes'): on a shared machine, a run with more than a
// few % is not comparable.
func BenchmarkClusterIngest(b *testing.B) {
	nGW, seconds := envInt("SORTIE_BENCH_GATEWAYS", 200), envInt("SORTIE_BENCH_SECONDS", 10)
	ids := make([]string, nGW)
	for i := range ids {
		ids[i] = fmt.Sprintf("gw%03d", i)
	}
	// The cluster's parts first: without them the benchmark is skipped
	// before it has measured anything.
	var users []clustertest.User
	for _, id := range ids {
		users = append(users, gatewayUser(id))
	}
	nc := clustertest.StartNATS(b, 3, clustertest.NATSOptions{Users: users, MQTT: `js_api_timeout: "10s"`})
	pg := clustertest.StartPostgres(b, clustertest.PostgresOptions{})
	dir := benchStoreDir(b)
	load := time.Duration(seconds) * time.Second

	b.ResetTimer()
	for b.Loop() {
		single := runSingleIngest(b, ids, dir, load)
		cluster := runClusterIngest(b, ids, dir, load, nc, pg)
		b.ReportMetric(single.rate(), "single-events/s")
		b.ReportMetric(cluster.rate(), "cluster-events/s")
		b.ReportMetric(cluster.rate()/single.rate(), "cluster/single")
		b.ReportMetric(single.perEvent(single.self), "single-proc-cpu-us/event")
		b.ReportMetric(cluster.perEvent(cluster.self), "cluster-proc-cpu-us/event")
		b.ReportMetric(cluster.perEvent(cluster.nats), "cluster-nats-cpu-us/event")
		b.ReportMetric(cluster.perEvent(cluster.pg), "cluster-pg-cpu-us/event")
		b.ReportMetric(float64(cluster.pgBytes)/float64(cluster.events), "pg-bytes/event")
		b.ReportMetric(float64(cluster.walBytes)/float64(cluster.events), "pg-wal-bytes/event")
		// The machine may be shared: CPU that none of the benchmark's
		// processes used makes a run's figures suspect.
		b.ReportMetric(max(single.others(), cluster.others()), "others-cpu-%")
		b.ReportMetric(0, "ns/op")
		for _, r := range []ingestRun{single, cluster} {
			b.Logf("%s: %d events in %s = %.0f events/s; CPU s: test process %.1f, nats %.1f, postgres %.1f, of %.1f core-seconds (%.0f%% busy)",
				r.mode, r.events, r.elapsed.Round(time.Millisecond), r.rate(), r.self, r.nats, r.pg, r.cores, 100*r.busy/r.cores)
		}
		b.Logf("postgres: %s; %d B of sortie_events + sortie_missions, %d B of WAL for %d events",
			cluster.pgSettings, cluster.pgBytes, cluster.walBytes, cluster.events)
	}
}

// ingestRun is one mode's figures.
type ingestRun struct {
	mode    string
	events  int
	elapsed time.Duration
	// CPU seconds over the run: the test process, the NATS nodes,
	// PostgreSQL; the machine's busy and total core-seconds.
	self, nats, pg, busy, cores float64

	pgBytes, walBytes int64
	pgSettings        string
}

// others is the share of the machine's CPU, in %, used by processes
// other than the benchmark's.
func (r ingestRun) others() float64 { return 100 * max(0, r.busy-r.self-r.nats-r.pg) / r.cores }

func (r ingestRun) rate() float64 { return float64(r.events) / r.elapsed.Seconds() }

// perEvent is cpu seconds in µs per event.
func (r ingestRun) perEvent(cpu float64) float64 { return cpu * 1e6 / float64(r.events) }

// benchStoreDir is where the gateways' stores go: /dev/shm when there is
// one (their fsyncs are not what is measured), else a temp directory.
func benchStoreDir(tb testing.TB) string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		dir, err := os.MkdirTemp("/dev/shm", "sortie-bench-")
		if err == nil {
			tb.Cleanup(func() { _ = os.RemoveAll(dir) }) // tmpfs: nothing to report
			return dir
		}
	}
	return tb.TempDir()
}

func runSingleIngest(b *testing.B, ids []string, dir string, load time.Duration) ingestRun {
	broker := testBroker(b, ids...)
	st, err := Open(filepath.Join(b.TempDir(), "hub.db"), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = st.Close() }() // the figures are taken
	if err := st.Register(b.Context(), time.Now(), ids...); err != nil {
		b.Fatal(err)
	}
	svc := NewService(st, ServiceOptions{Broker: broker.URL(), ClientID: hubClientID, Username: hubUser, Password: hubPassword})
	stop := runService(b, svc, 60*time.Second)
	defer stop()
	r := driveIngest(b, ids, filepath.Join(dir, "single"), func(string, int) string { return broker.URL() }, load, nil)
	r.mode = "single"
	var stored uint64
	for _, id := range ids {
		g, err := st.Gateway(b.Context(), id)
		if err != nil {
			b.Fatal(err)
		}
		stored += g.Events
	}
	if stored != uint64(r.events) {
		b.Errorf("single: %d events stored, %d written", stored, r.events)
	}
	return r
}

func runClusterIngest(b *testing.B, ids []string, dir string, load time.Duration, nc *clustertest.NATS, pg *clustertest.Postgres) ingestRun {
	var reps []*PGStore
	for range 2 {
		st, stop := startBenchReplica(b, nc, pg, ids)
		defer stop()
		reps = append(reps, st)
	}
	db := reps[0].pool
	ctx := context.Background()
	var lsn string
	if err := db.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		b.Fatal(err)
	}
	r := driveIngest(b, ids, filepath.Join(dir, "cluster"), func(_ string, i int) string { return nc.Nodes[i%len(nc.Nodes)].MQTTURL() }, load, &clusterPIDs{nc, pg})
	r.mode = "cluster"
	var stored int64
	err := db.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint,
		pg_total_relation_size('sortie_events') + pg_total_relation_size('sortie_missions'),
		(SELECT count(*) FROM sortie_events),
		format('fsync %s, synchronous_commit %s, wal_sync_method %s, full_page_writes %s, shared_buffers %s', current_setting('fsync'), current_setting('synchronous_commit'), current_setting('wal_sync_method'), current_setting('full_page_writes'), current_setting('shared_buffers'))`, lsn).
		Scan(&r.walBytes, &r.pgBytes, &stored, &r.pgSettings)
	if err != nil {
		b.Fatal(err)
	}
	if stored != int64(r.events) {
		b.Errorf("cluster: %d events stored, %d written", stored, r.events)
	}
	return r
}

// startBenchReplica runs an in-process hub replica of the cluster, the
// gateways ids registered, until stop is called.
func startBenchReplica(tb testing.TB, nc *clustertest.NATS, pg *clustertest.Postgres, ids []string) (st *PGStore, stop func()) {
	tb.Helper()
	st, err := OpenPG(context.Background(), pg.DSN())
	if err != nil {
		tb.Fatal(err)
	}
	if err := st.Register(tb.Context(), time.Now(), ids...); err != nil {
		_ = st.Close() // the error above is the one to report
		tb.Fatal(err)
	}
	stopSvc := runService(tb, NewService(st, ServiceOptions{Cluster: &ClusterOptions{
		NATS: nc.ClientURLs(), User: nc.User, Password: nc.Password, Replicas: 3,
	}}), 60*time.Second)
	return st, func() {
		stopSvc()
		_ = st.Close() // PGStore.Close returns nil
	}
}

// clusterPIDs finds the cluster's processes for CPU accounting.
type clusterPIDs struct {
	nats *clustertest.NATS
	pg   *clustertest.Postgres
}

// cpuSample is CPU seconds at one moment.
type cpuSample struct{ self, nats, pg, busy, total float64 }

func (c *clusterPIDs) sample() cpuSample {
	s := cpuSample{self: procCPU(os.Getpid(), true)}
	s.busy, s.total = machineCPU()
	if c == nil {
		return s
	}
	for _, n := range c.nats.Nodes {
		s.nats += procCPU(n.PID(), false)
	}
	// The postmaster with the children it reaped, and its live children
	// (backends, WAL writer, checkpointer...).
	if pid := c.pg.PID(); pid != 0 {
		s.pg = procCPU(pid, true)
		for _, child := range childPIDs(pid) {
			s.pg += procCPU(child, false)
		}
	}
	return s
}

// clockTicks is USER_HZ, the unit of /proc's CPU times: 100 on Linux.
const clockTicks = 100

// procStat is the fields of /proc/PID/stat after the command name.
func procStat(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(s[i+1:])
}

// procCPU is a process's user and system CPU seconds, with those of its
// reaped children if children is set; 0 if it is gone.
func procCPU(pid int, children bool) float64 {
	f := procStat(pid) // f[0] is field 3 (state): utime is f[11]
	if len(f) < 15 {
		return 0
	}
	var ticks float64
	n := 2
	if children {
		n = 4
	}
	for _, v := range f[11 : 11+n] {
		t, _ := strconv.ParseFloat(v, 64) // numbers, as the kernel writes them
		ticks += t
	}
	return ticks / clockTicks
}

// childPIDs is the processes whose parent is pid.
func childPIDs(pid int) []int {
	ents, _ := os.ReadDir("/proc") // no /proc: no children counted
	var out []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f := procStat(p); len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, p)
		}
	}
	return out
}

// machineCPU is the machine's busy and total core-seconds since boot.
func machineCPU() (busy, total float64) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, 0
	}
	defer func() { _ = f.Close() }() // read-only
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0, 0
	}
	fs := strings.Fields(sc.Text()) // cpu user nice system idle iowait irq softirq steal ...
	for i, v := range fs[1:] {
		t, _ := strconv.ParseFloat(v, 64) // numbers, as the kernel writes them
		if i >= 8 {                       // guest time is already in user
			break
		}
		total += t
		if i != 3 && i != 4 {
			busy += t
		}
	}
	return busy / clockTicks, total / clockTicks
}

// driveIngest starts a gateway per id (its store under dir, its uplink to
// url(id, i)), waits until all are connected, then has each write as fast
// as its backlog allows for load, and waits until every outbox is empty.
func driveIngest(b *testing.B, ids []string, dir string, url func(string, int) string, load time.Duration, pids *clusterPIDs) ingestRun {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	gws := make([]*benchGateway, len(ids))
	defer func() {
		var wg sync.WaitGroup
		for _, g := range gws {
			if g != nil {
				wg.Go(func() {
					if err := g.close(); err != nil {
						b.Errorf("%s: %v", g.id, err)
					}
				})
			}
		}
		wg.Wait()
	}()
	for i, id := range ids {
		g, err := startBenchGateway(id, url(id, i), dir)
		if err != nil {
			b.Fatal(err)
		}
		gws[i] = g
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, g := range gws {
		for !g.up.Stats().Connected {
			if time.Now().After(deadline) {
				b.Fatalf("%s not connected after 60 s", g.id)
			}
			time.Sleep(20 * time.Millisecond) // an uplink's state: polled
		}
	}

	before := pids.sample()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), load)
	defer cancel()
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	for _, g := range gws {
		wg.Go(func() {
			if err := g.write(ctx); err != nil {
				failed.CompareAndSwap(nil, &err)
			}
		})
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
	deadline = time.Now().Add(2 * time.Minute)
	for _, g := range gws {
		for g.db.OutboxLen() > 0 {
			if time.Now().After(deadline) {
				b.Fatalf("%s: %d entries still in the outbox 2 minutes after the load", g.id, g.db.OutboxLen())
			}
			time.Sleep(5 * time.Millisecond) // an outbox's length has no event to wait on
		}
	}
	r := ingestRun{elapsed: time.Since(start)}
	after := pids.sample()
	r.self, r.nats, r.pg = after.self-before.self, after.nats-before.nats, after.pg-before.pg
	r.busy, r.cores = after.busy-before.busy, after.total-before.total
	for _, g := range gws {
		r.events += g.written
	}
	return r
}

// benchGateway is a gateway with a real outbox and a real uplink that
// writes missions of four events, one commit per event.
type benchGateway struct {
	id      string
	db      *store.DB
	up      *hubsync.Uplink
	stop    func() error
	written int
	m       *driver.Mission
	n       int // missions created
}

func startBenchGateway(id, broker, dir string) (*benchGateway, error) {
	quiet := slog.New(slog.DiscardHandler)
	db, err := store.Open(filepath.Join(dir, id+".db"), store.Options{Timeout: time.Second, Outbox: true, Logger: quiet})
	if err != nil {
		return nil, err
	}
	up, err := hubsync.New(hubsync.Options{
		Broker: broker, Gateway: id, Username: id, Password: gatewayPassword(id), Source: db, Logger: quiet, Version: "bench",
		HeartbeatInterval: time.Hour, MaxReconnectInterval: 500 * time.Millisecond,
	})
	if err != nil {
		_ = db.Close() // the error above is the one to report
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- up.Run(ctx) }()
	g := &benchGateway{id: id, db: db, up: up}
	g.stop = func() error {
		cancel()
		return <-done
	}
	return g, nil
}

func (g *benchGateway) close() error {
	return errors.Join(g.stop(), g.db.Close())
}

// write writes events while ctx lasts, keeping at most ingestBacklog
// unacknowledged.
func (g *benchGateway) write(ctx context.Context) error {
	for ctx.Err() == nil {
		if g.db.OutboxLen() >= ingestBacklog {
			time.Sleep(2 * time.Millisecond) // an outbox's length has no event to wait on
			continue
		}
		// Not ctx: a write cut short by the end of the load might or might
		// not be committed, and every committed event is counted.
		if err := g.step(context.Background()); err != nil {
			return fmt.Errorf("%s: %w", g.id, err)
		}
		g.written++
		g.up.Notify()
	}
	return nil
}

// step writes the next event: a new mission, or the current one moved
// on; a mission ends SUCCEEDED at its fourth event.
func (g *benchGateway) step(ctx context.Context) error {
	var m *driver.Mission
	id := ""
	if g.m == nil || g.m.State == driver.StateSucceeded {
		g.n++
		id = fmt.Sprintf("%s-m%d", g.id, g.n)
	} else {
		m, id = g.m, g.m.ID
	}
	m, err := advanceMission(ctx, g.db, m, id)
	if err != nil {
		return err
	}
	g.m = m
	return nil
}

// BenchmarkReconnectStorm: SORTIE_STORM_GATEWAYS (default 2,000) idle
// gateways connected across 3 NATS nodes as hubsync connects them (the
// gateway's MQTT client, internal/mqttc: clean session, an offline
// status as last will, ack and control subscribed at QoS 0, an online
// status published at each connect, not retained as docs/cluster.md
// advises (SORTIE_STORM_RETAIN=1 retains both); hubsync's default
// timeout of 10 s and reconnect backoff, 0.5 s doubling to 30 s,
// jittered), each with its own NATS user, and a hub replica (PostgreSQL
// with fsync off: not what is measured) consuming their statuses. The
// nodes have nats-server's default js_api_timeout of 5 s, as
// docs/cluster.md advises (SORTIE_STORM_JS_API_TIMEOUT changes it). One node is SIGKILLed, left
// down for 2 s, and started again; for the gateways that were on it:
//
//	reconnect-p50-s, -p99-s  from the node's process starting again to
//	                         the gateway connected and subscribed
//	down-p99-s               from the connection lost to the same
//	status-p99-s             from there to its online status PUBACKed
//	failed-connects          connection attempts that failed (refused
//	                         while the node was down, timed out...)
//	status-errors            online statuses not PUBACKed within 10 s
//	not-reconnected          gateways still away 90 s after the restart
//	js-api-errors            JetStream API errors over the storm: /jsz
//	                         "api.errors" summed over the nodes (the
//	                         restarted node's counted from its restart)
//
// and connect-all-s, the time the whole fleet took to connect at the
// start (64 connecting at a time). Timings are reported, not asserted.
func BenchmarkReconnectStorm(b *testing.B) {
	n := envInt("SORTIE_STORM_GATEWAYS", 2000)
	ids := make([]string, n)
	users := make([]clustertest.User, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("gw%04d", i)
		users[i] = gatewayUser(ids[i])
	}
	jsTimeout := cmp.Or(os.Getenv("SORTIE_STORM_JS_API_TIMEOUT"), "5s") // nats-server's default
	nc := clustertest.StartNATS(b, 3, clustertest.NATSOptions{Users: users, MQTT: fmt.Sprintf("js_api_timeout: %q", jsTimeout), ReadyTimeout: 60 * time.Second})
	pg := clustertest.StartPostgres(b, clustertest.PostgresOptions{Settings: map[string]string{"fsync": "off"}})
	_, stopHub := startBenchReplica(b, nc, pg, ids)
	defer stopHub()

	b.ResetTimer()
	for b.Loop() {
		s := runStorm(b, nc, ids)
		b.ReportMetric(s.connectAll.Seconds(), "connect-all-s")
		b.ReportMetric(float64(s.victims), "gateways-on-node")
		b.ReportMetric(s.fromStart(50), "reconnect-p50-s")
		b.ReportMetric(s.fromStart(99), "reconnect-p99-s")
		b.ReportMetric(s.fromLost(99), "down-p99-s")
		b.ReportMetric(float64(s.failed), "failed-connects")
		b.ReportMetric(percentile(s.statusLag, 99).Seconds(), "status-p99-s")
		b.ReportMetric(float64(s.statusErrs), "status-errors")
		b.ReportMetric(float64(s.missing), "not-reconnected")
		b.ReportMetric(float64(s.jsErrors), "js-api-errors")
		b.ReportMetric(0, "ns/op")
		b.Logf("log of %s after its restart: %s", s.node, s.nodeLog)
		b.Logf("%d gateways connected in %s; node %s (%d gateways) killed, down 2 s, healthy %s after its start; reconnected p50 %.2f s, p90 %.2f s, p99 %.2f s, max %.2f s after its start (from the loss: p50 %.2f s, p99 %.2f s); %d failed connection attempts (%s), online status PUBACKed p50 %.2f s, p99 %.2f s after the reconnect, %d not acknowledged in 10 s (%d at the first connections); %d gateways not back, %d lost elsewhere, %d flapped after reconnecting; JetStream API: %d requests, %d errors (per node: %s)",
			len(ids), s.connectAll.Round(time.Millisecond), s.node, s.victims, s.healthy.Round(time.Millisecond),
			s.fromStart(50), s.fromStart(90), s.fromStart(99), s.fromStart(100), s.fromLost(50), s.fromLost(99),
			s.failed, s.failReasons(), percentile(s.statusLag, 50).Seconds(), percentile(s.statusLag, 99).Seconds(), s.statusErrs, s.firstStatusErrs, s.missing, s.elsewhere, s.flapped, s.jsTotal, s.jsErrors, s.jsPerNode)
	}
}

// stormResult is one storm's figures.
type stormResult struct {
	connectAll, healthy   time.Duration
	node                  string
	victims               int
	sinceStart, sinceLost []time.Duration
	statusLag             []time.Duration
	failed, statusErrs    int64
	firstStatusErrs       int64
	missing, elsewhere    int
	flapped               int64
	jsTotal, jsErrors     int64
	jsPerNode             string
	reasons               map[string]int
	nodeLog               string
}

// fromStart is the p-th percentile of the reconnect times from the
// node's start, in seconds.
func (s stormResult) fromStart(p int) float64 { return percentile(s.sinceStart, p).Seconds() }

func (s stormResult) fromLost(p int) float64 { return percentile(s.sinceLost, p).Seconds() }

func (s stormResult) failReasons() string {
	var parts []string
	for r, n := range s.reasons {
		parts = append(parts, fmt.Sprintf("%d× %s", n, r))
	}
	slices.Sort(parts)
	return strings.Join(parts, "; ")
}

func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(ds))
	return s[min(len(s)-1, len(s)*p/100)]
}

// stormGateway is an idle gateway's MQTT connection and its history.
type stormGateway struct {
	id   string
	node int
	c    *mqttc.Client

	mu         sync.Mutex
	connects   int
	lostAt     time.Time
	upAt       time.Time // the last connect (subscribed)
	statusAt   time.Time // its online status acknowledged
	losses     int
	statusErrs int64
}

func runStorm(b *testing.B, nc *clustertest.NATS, ids []string) stormResult {
	fails := &failCounter{reasons: map[string]int{}}
	gws := make([]*stormGateway, len(ids))
	for i, id := range ids {
		g, err := newStormGateway(id, i%len(nc.Nodes), nc.Nodes[i%len(nc.Nodes)].MQTTURL(), fails)
		if err != nil {
			b.Fatal(err)
		}
		gws[i] = g
	}
	defer func() {
		var wg sync.WaitGroup
		for _, g := range gws {
			wg.Go(g.c.Close)
		}
		wg.Wait()
	}()
	var res stormResult
	start := time.Now()
	// One gateway per node first, one at a time: a node creates the
	// account's MQTT streams at its first MQTT client, and a fresh
	// cluster answers the first clients' JetStream requests late.
	for _, g := range gws[:min(len(gws), len(nc.Nodes))] {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		err := g.c.Connect(ctx)
		cancel()
		if err != nil {
			b.Fatalf("%s: connect: %v", g.id, err)
		}
	}
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	var connErr atomic.Pointer[error]
	for _, g := range gws[min(len(gws), len(nc.Nodes)):] {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if err := g.c.Connect(ctx); err != nil {
				err = fmt.Errorf("%s: connect: %w", g.id, err)
				connErr.CompareAndSwap(nil, &err)
			}
		})
	}
	wg.Wait()
	if err := connErr.Load(); err != nil {
		b.Fatal(*err)
	}
	res.connectAll = time.Since(start)
	for _, g := range gws {
		g.mu.Lock()
		res.firstStatusErrs += g.statusErrs
		g.statusErrs = 0
		g.mu.Unlock()
	}
	fails.reset()

	victim := 1
	node := nc.Nodes[victim]
	res.node = node.Name
	before := jsAPI(nc)
	if err := node.Kill(); err != nil {
		b.Fatal(err)
	}
	time.Sleep(2 * time.Second) // the node stays down a while: that is the fault
	started := time.Now()
	if err := node.Restart(); err != nil {
		b.Fatal(err)
	}
	res.healthy = time.Since(started)
	deadline := started.Add(90 * time.Second)
	for _, g := range gws {
		if g.node != victim {
			continue
		}
		res.victims++
		for !g.connectedTimes(2) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond) // a connection's progress: polled
		}
	}
	time.Sleep(time.Second) // whatever else the storm stirs up (flaps, late errors)
	after := jsAPI(nc)
	for _, g := range gws {
		g.mu.Lock()
		switch {
		case g.node != victim:
			if g.losses > 0 {
				res.elsewhere++
			}
		case g.connects < 2:
			res.missing++
		default:
			res.sinceStart = append(res.sinceStart, g.upAt.Sub(started))
			res.sinceLost = append(res.sinceLost, g.upAt.Sub(g.lostAt))
			if g.statusAt.After(g.upAt) {
				res.statusLag = append(res.statusLag, g.statusAt.Sub(g.upAt))
			}
			res.flapped += int64(g.connects - 2)
		}
		res.statusErrs += g.statusErrs
		g.mu.Unlock()
	}
	res.failed, res.reasons = fails.snapshot()
	var per []string
	for i, nd := range nc.Nodes {
		d := after[i]
		if i != victim {
			d.Total -= before[i].Total
			d.Errors -= before[i].Errors
		}
		res.jsTotal += d.Total
		res.jsErrors += d.Errors
		per = append(per, fmt.Sprintf("%s %d/%d", nd.Name, d.Errors, d.Total))
	}
	res.jsPerNode = strings.Join(per, ", ")
	res.nodeLog = logGist(node.LogFile, 6)
	return res
}

// logGist counts a nats-server log's errors and warnings from its last
// start on, by message with addresses, client names and numbers taken
// out, the n most frequent first.
func logGist(file string, n int) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return err.Error()
	}
	s := string(b)
	if i := strings.LastIndex(s, "=== clustertest: start"); i >= 0 {
		s = s[i:]
	}
	counts := map[string]int{}
	for line := range strings.Lines(s) {
		i := strings.Index(line, "[ERR] ")
		if i < 0 {
			i = strings.Index(line, "[WRN] ")
		}
		if i < 0 {
			continue
		}
		msg := line[i:]
		if j := strings.LastIndex(msg, `" - `); j >= 0 { // after the client's name
			msg = msg[:6] + msg[j+4:]
		}
		if j := strings.IndexAny(msg, "0123456789"); j >= 0 {
			msg = msg[:j]
		}
		counts[strings.TrimSpace(msg)]++
	}
	keys := slices.SortedFunc(maps.Keys(counts), func(a, b string) int { return counts[b] - counts[a] })
	var parts []string
	for _, k := range keys[:min(n, len(keys))] {
		parts = append(parts, fmt.Sprintf("%d× %s", counts[k], k))
	}
	return strings.Join(parts, "; ")
}

// stormRetain is SORTIE_STORM_RETAIN=1: the storm's gateways retain
// their status, as the single hub needs and the cluster does not.
var stormRetain = os.Getenv("SORTIE_STORM_RETAIN") == "1"

func newStormGateway(id string, node int, url string, fails *failCounter) (*stormGateway, error) {
	t := uplink.Topics{}
	g := &stormGateway{id: id, node: node}
	offline, err := json.Marshal(uplink.Status{Gateway: id, State: uplink.StateOffline, Protocol: uplink.Protocol, Version: "bench"})
	if err != nil {
		return nil, err
	}
	c, err := mqttc.New(mqttc.Options{
		Broker: url, ClientID: uplink.DefaultClientID(id), Username: id, Password: gatewayPassword(id),
		Will:           &mqttc.Will{Topic: t.Status(id), Payload: offline, QoS: 1, Retained: stormRetain},
		ConnectTimeout: hubsync.DefaultTimeout, Timeout: hubsync.DefaultTimeout, MaxReconnectInterval: hubsync.DefaultMaxReconnect,
		OnConnect: func() {
			g.mu.Lock()
			g.connects++
			g.upAt = time.Now()
			g.mu.Unlock()
			online, _ := json.Marshal(uplink.Status{Gateway: id, State: uplink.StateOnline, Protocol: uplink.Protocol, Version: "bench", Time: time.Now()}) // plain struct
			err := g.c.Publish(t.Status(id), online, stormRetain, 1)
			g.mu.Lock()
			defer g.mu.Unlock()
			if err != nil {
				g.statusErrs++
				return
			}
			g.statusAt = time.Now()
		},
		OnConnectionLost: func(error) {
			g.mu.Lock()
			g.lostAt = time.Now()
			g.losses++
			g.mu.Unlock()
		},
		Logger: slog.New(fails),
	})
	if err != nil {
		return nil, err
	}
	g.c = c
	for _, filter := range []string{t.Ack(id), t.Control(id)} {
		if _, err := c.SubscribeQoS(filter, 0, func(string, []byte) {}); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// connectedTimes reports whether the gateway has connected (its status
// acknowledged) n times.
func (g *stormGateway) connectedTimes(n int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.connects >= n
}

// failCounter is a slog handler counting the failed connection attempts
// the gateway clients report: "broker connection restored" and
// "connected to the broker" say how many attempts it took.
type failCounter struct {
	mu      sync.Mutex
	failed  int64
	reasons map[string]int
}

func (f *failCounter) Enabled(context.Context, slog.Level) bool { return true }
func (f *failCounter) WithAttrs([]slog.Attr) slog.Handler       { return f }
func (f *failCounter) WithGroup(string) slog.Handler            { return f }

func (f *failCounter) Handle(_ context.Context, r slog.Record) error {
	var attempts int64
	var reason string
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "attempts":
			attempts = a.Value.Int64()
		case "err":
			reason = failReason(a.Value.String())
		}
		return true
	})
	f.mu.Lock()
	defer f.mu.Unlock()
	switch r.Message {
	case "broker connection restored":
		f.failed += attempts - 1
	case "cannot connect to the broker; retrying", "subscribe failed; retrying":
		f.reasons[reason]++
	}
	return nil
}

func (f *failCounter) reset() {
	f.mu.Lock()
	f.failed = 0
	clear(f.reasons)
	f.mu.Unlock()
}

func (f *failCounter) snapshot() (int64, map[string]int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed, maps.Clone(f.reasons)
}

// failReason is the gist of a connection error, without addresses.
func failReason(s string) string {
	switch {
	case strings.Contains(s, "connection refused"):
		return "connection refused"
	case strings.Contains(s, "not Authorized"), strings.Contains(s, "not authorized"):
		return "not authorized"
	case strings.Contains(s, "timeout"), strings.Contains(s, "timed out"), strings.Contains(s, "deadline exceeded"):
		return "timeout"
	case strings.Contains(s, "EOF"), strings.Contains(s, "reset by peer"):
		return "connection closed by the server"
	}
	if len(s) > 60 {
		s = s[:60]
	}
	return s
}

// jsStats is a node's JetStream API counters.
type jsStats struct{ Total, Errors int64 }

// jsAPI reads every running node's JetStream API counters (/jsz).
func jsAPI(nc *clustertest.NATS) []jsStats {
	out := make([]jsStats, len(nc.Nodes))
	client := &http.Client{Timeout: 5 * time.Second}
	for i, nd := range nc.Nodes {
		res, err := client.Get(nd.MonitorURL() + "/jsz")
		if err != nil {
			continue
		}
		var v struct {
			API jsStats `json:"api"`
		}
		err = json.NewDecoder(io.LimitReader(res.Body, 1<<20)).Decode(&v)
		_ = res.Body.Close() // read-only request
		if err == nil {
			out[i] = v.API
		}
	}
	return out
}
