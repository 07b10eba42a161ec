package fleetsim_test

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/broker"
	"github.com/sortie-edge/sortie/broker/passwd"
	"github.com/sortie-edge/sortie/hub"
	"github.com/sortie-edge/sortie/internal/fleetsim"
	"github.com/sortie-edge/sortie/internal/testkit"
)

var benchGateways = flag.Int("fleet-gateways", 1000, "gateways of BenchmarkFleet (the issue's scale: 10000)")

// benchRounds is how many heartbeats each gateway sends at once for the
// ingestion figure.
const benchRounds = 5

func fleetIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s%05d", fleetsim.DefaultIDPrefix, i)
	}
	return ids
}

// BenchmarkFleet brings up -fleet-gateways light gateways (1,000; 10,000
// with -args -fleet-gateways 10000) against a real single-process hub:
// the cmd/hub binary as a child process, its embedded broker with every
// gateway's credentials and ACL, its bbolt store. Figures:
//
//	connect-s          Start until the hub's API shows every gateway online
//	raw-connect-s      the same fleet against a bare embedded broker in this
//	                   process (no ACL, no hub), measured first: the baseline
//	connect/raw        their ratio
//	hub-cpu-us/gw      the hub process's CPU (user+system) for one gateway's
//	                   connection (login at the test's PBKDF2 cost, presence,
//	                   first heartbeat stored)
//	hb/s               heartbeats stored by the hub per second: every gateway
//	                   sends 5 at once, until the API shows the last of each
//	hub-cpu-us/hb      the hub's CPU per heartbeat stored
//	hub-KB/gw          the hub's resident memory per gateway connected
//	fleet-KB/gw        this process's heap and stacks per light gateway
//	goroutines/gw      this process's goroutines per light gateway
//	login-ms           the CPU of one first login at production's PBKDF2 cost
//	                   (210,000 iterations), which the hub pays once per gateway
//	                   and process, two at a time (broker/passwd.Parallel)
//
// The fleet, the broker and the hub share the machine's CPUs.
func BenchmarkFleet(b *testing.B) {
	n := *benchGateways
	ids := fleetIDs(n)
	for range b.N {
		raw := rawConnect(b, ids)
		hub := startHub(b, ids, hashIterations)

		runtime.GC()
		var m0 runtime.MemStats
		runtime.ReadMemStats(&m0)
		g0 := runtime.NumGoroutine()
		rss0, cpu0 := hub.rss(), hub.cpu()
		f, err := fleetsim.New(fleetsim.Options{Broker: hub.broker, IDs: ids, Password: gatewayPassword, Heartbeat: time.Hour, Connecting: 256})
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		if err := f.Start(ctx); err != nil {
			b.Fatal(err)
		}
		hub.waitGateways("every gateway online with a heartbeat", 10*time.Minute, func(gws []hubGateway) bool {
			on := 0
			for _, g := range gws {
				if g.State == "online" && g.Heartbeat != nil {
					on++
				}
			}
			return on == n
		})
		connect := time.Since(start)
		cpu1 := hub.cpu()
		rss1 := hub.rss()
		runtime.GC()
		var m1 runtime.MemStats
		runtime.ReadMemStats(&m1)
		g1 := runtime.NumGoroutine()

		hbStart := time.Now()
		sent := 0
		for range benchRounds {
			sent += f.Beat(ctx)
		}
		waitIngested(b, hub, n, hbStart)
		hbTime := time.Since(hbStart)
		cpu2 := hub.cpu()
		cancel()
		f.Close()

		b.ReportMetric(float64(n), "gateways")
		b.ReportMetric(connect.Seconds(), "connect-s")
		b.ReportMetric(raw.Seconds(), "raw-connect-s")
		b.ReportMetric(connect.Seconds()/raw.Seconds(), "connect/raw")
		b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(n), "hub-cpu-us/gw")
		b.ReportMetric(float64(sent)/hbTime.Seconds(), "hb/s")
		b.ReportMetric(float64((cpu2-cpu1).Microseconds())/float64(sent), "hub-cpu-us/hb")
		b.ReportMetric(float64(rss1-rss0)/1024/float64(n), "hub-KB/gw")
		heap := float64(m1.HeapInuse+m1.StackInuse) - float64(m0.HeapInuse+m0.StackInuse)
		b.ReportMetric(heap/1024/float64(n), "fleet-KB/gw")
		b.ReportMetric(float64(g1-g0)/float64(n), "goroutines/gw")
		b.ReportMetric(loginCost(b).Seconds()*1000, "login-ms")
	}
}

// rawConnect is the baseline: how long the same fleet takes to connect
// to a bare broker (package broker, no ACL, no hub), run as a child
// process as the hub is: 10,000 sockets at each end would not fit one
// process's usual limit of open files.
func rawConnect(b *testing.B, ids []string) time.Duration {
	b.Helper()
	addr := testkit.FreeAddr(b)
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), bareBrokerEnv+"="+addr)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill() // the baseline's broker has nothing to keep
		_ = cmd.Wait()
	}()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) { // another process: nothing to wait on but its port
		if c, err := net.Dial("tcp", addr); err == nil {
			_ = c.Close() // only checking that it listens
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("the bare broker did not listen in 30s")
		}
	}
	f, err := fleetsim.New(fleetsim.Options{Broker: "tcp://" + addr, IDs: ids, Heartbeat: time.Hour, Connecting: 256})
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := f.Start(ctx); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}

// bareBrokerEnv, set to an address, makes the test binary a bare broker
// listening there until it is killed (TestMain).
const bareBrokerEnv = "FLEETSIM_BARE_BROKER"

// serveBareBroker is the child process of rawConnect.
func serveBareBroker(addr string) {
	br, err := broker.Start(broker.Options{Addr: addr})
	if err != nil {
		fmt.Fprintln(os.Stderr, "bare broker:", err)
		os.Exit(1)
	}
	defer func() { _ = br.Close() }()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}

// waitIngested waits until the hub's queue is empty and its API shows,
// for every gateway, a heartbeat sent at or after since. The queue is
// read from /metrics, which costs the hub far less than the gateway
// list; the list is read once the queue is empty.
func waitIngested(b *testing.B, hub *hubProc, n int, since time.Time) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for {
		if queueDepth(ctx, hub) == 0 {
			gws, err := hub.gateways(ctx)
			if err == nil {
				fresh := 0
				for _, g := range gws {
					if g.Heartbeat != nil && !g.Heartbeat.Time.Before(since) {
						fresh++
					}
				}
				if fresh == n {
					return
				}
			}
		}
		select {
		case <-ctx.Done():
			b.Fatal("the hub did not store the heartbeats in 10 minutes")
		case <-time.After(50 * time.Millisecond): // polling another process
		}
	}
}

// queueDepth reads sortie_hub_queue_depth from the hub's /metrics; -1
// when it cannot.
func queueDepth(ctx context.Context, hub *hubProc) int {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, hub.api+"/metrics", nil)
	if err != nil {
		return -1
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return -1
	}
	defer func() { _ = res.Body.Close() }()
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "sortie_hub_queue_depth "); ok {
			d, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return -1
			}
			return int(d)
		}
	}
	return -1
}

// loginCost is the CPU of verifying one password at production's cost.
func loginCost(b *testing.B) time.Duration {
	b.Helper()
	h, err := passwd.Hash("a-gateway-password")
	if err != nil {
		b.Fatal(err)
	}
	c, err := passwd.Parse(h)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if !c.Verify([]byte("a-gateway-password")) {
		b.Fatal("the password does not verify")
	}
	return time.Since(start)
}

// BenchmarkRollout rolls a good bundle out to -fleet-gateways light
// gateways (1,000; 10,000 with -args -fleet-gateways 10000) on the hub
// binary, 1% canary then waves doubling, gateway soak 1s, stage soak
// 0.5s, heartbeats every 30s (the agent's default). Figures:
//
//	rollout-s        from the start until every gateway is healthy
//	hub-cpu-ms/gw    the hub process's CPU over that time, per gateway
//	                 (the heartbeats it stores meanwhile included)
//	idle-cpu-ms/gw   the baseline: the hub's CPU per gateway over the same
//	                 time just before, with no rollout (the heartbeats alone)
//	stages           the canary and the waves
func BenchmarkRollout(b *testing.B) {
	for range b.N {
		r := startMeasure(b, *benchGateways, fleetsim.Faults{}, func(o *fleetsim.Options) { o.Heartbeat = fleetsim.DefaultHeartbeat })
		n := len(r.ids)
		good := goodBundle(b)
		r.push(good)
		// The baseline first: the same fleet, heartbeats only, for as long
		// as the rollout takes (measured after it, applied before it
		// would be too late), so a fixed 10 s window stands in.
		idle0 := r.hub.cpu()
		time.Sleep(10 * time.Second) // a window of the hub's idle CPU, not a synchronisation
		idle := r.hub.cpu() - idle0
		cpu0, start := r.hub.cpu(), time.Now()
		v := r.start(spec())
		v = r.waitRollout(v.ID, "ended", 20*time.Minute, ended)
		took, cpu := time.Since(start), r.hub.cpu()-cpu0
		if v.State != hub.RolloutCompleted || v.Counts[hub.TargetHealthy] != n {
			b.Fatalf("rollout %s: %s (%s), %v", v.ID, v.State, v.Reason, v.Counts)
		}
		b.ReportMetric(float64(n), "gateways")
		b.ReportMetric(took.Seconds(), "rollout-s")
		b.ReportMetric(float64(cpu.Microseconds())/1000/float64(n), "hub-cpu-ms/gw")
		b.ReportMetric(float64(idle.Microseconds())/1000/float64(n)*took.Seconds()/10, "idle-cpu-ms/gw")
		b.ReportMetric(float64(len(v.Stages)), "stages")
	}
}
