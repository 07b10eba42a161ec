package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/agent/agenttest"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/testkit"
)

// benchScene is a 3-step scene in parallel mode, so that concurrent
// triggers run side by side (the shipped scenes are single/restart).
const benchScene = `[[scene]]
name = "bench"
mode = "parallel"
deadline = "1m"
[[scene.step]]
device = "living-light"
action = "turn_on"
[[scene.step]]
device = "living-ac"
action = "set"
params = { target = 22 }
[[scene.step]]
device = "living-speaker"
action = "pause"
`

const benchHome = `seed = 1
[[device]]
id = "living-light"
type = "light"
[[device]]
id = "living-ac"
type = "ac"
[[device]]
id = "living-speaker"
type = "speaker"
`

// benchAgent runs a whole agent in this process: embedded broker,
// zero-latency simulated devices, real bbolt store, and an app client.
type benchAgent struct {
	a   *agenttest.Agent
	app paho.Client
	url string

	mu       sync.Mutex
	firstCmd map[string]time.Time // mission ID -> first device command
	finished map[string]chan time.Time
	accepted map[string]chan string // request ID -> mission ID
}

// benchRegistry writes the shipped device registry with every type
// taking 64 commands at once. The benchmarks' simulated devices answer
// at once and take any number in parallel; measured with the shipped
// one-at-a-time default, the 64 missions would queue on three devices
// and the figure would be the devices', not the engine's.
func benchRegistry(b *testing.B, dir string) string {
	b.Helper()
	src, err := os.ReadFile(testkit.RepoPath("configs/devices.toml"))
	if err != nil {
		b.Fatal(err)
	}
	reg := regexp.MustCompile(`(?m)^(\[types\.[a-z_-]+\])$`).ReplaceAllString(string(src), "$1\nmax_in_flight = 64")
	path := filepath.Join(dir, "devices.toml")
	writeFile(b, path, reg)
	return path
}

// benchLinks are the two ways the agent can reach its embedded broker:
// in process (the default) and over TCP, as it reaches an external one.
var benchLinks = []struct {
	name    string
	overTCP bool
}{{"link=in-process", false}, {"link=tcp", true}}

func startBenchAgent(b *testing.B, overTCP bool) *benchAgent {
	b.Helper()
	dir := b.TempDir()
	writeFile(b, filepath.Join(dir, "scenes", "bench.toml"), benchScene)
	writeFile(b, filepath.Join(dir, "home.toml"), benchHome)
	cfg := DefaultConfig()
	cfg.Dir = dir
	cfg.GatewayID = "bench"
	cfg.Devices = benchRegistry(b, dir)
	cfg.Broker.Listen = "127.0.0.1:0"
	cfg.HTTP.Listen = ""
	cfg.Simulator.Home = "home.toml"
	cfg.Driver.Workers = 64
	cfg.Log.Level = "error"
	ba := &benchAgent{firstCmd: map[string]time.Time{}, finished: map[string]chan time.Time{}, accepted: map[string]chan string{}}
	// The agent's own logger for the configured level (error), as a
	// deployment makes it: at info, the simulated devices log every command.
	// The garbage collector as the agent binary sets it (run does this
	// before it builds the agent, which leaves the process's GOGC alone).
	tuneGC()
	opts, err := agentOptions(cfg, newLogger(cfg.Log, io.Discard))
	if err != nil {
		b.Fatal(err)
	}
	opts.OverTCP = overTCP
	ba.a = agenttest.Start(b, opts)
	ba.url = ba.a.Addrs().BrokerURL
	ba.app = paho.NewClient(paho.NewClientOptions().AddBroker(ba.url).SetClientID("bench-app").SetOrderMatters(false))
	if tok := ba.app.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		b.Fatal(tok.Error())
	}
	b.Cleanup(func() { ba.app.Disconnect(10) })
	sub := func(topic string, h paho.MessageHandler) {
		if tok := ba.app.Subscribe(topic, 1, h); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			b.Fatal(tok.Error())
		}
	}
	// Commands are timed where the broker receives them: a subscriber
	// would add a delivery per command to the load being measured.
	if err := ba.a.Broker().Server().AddHook(&cmdHook{ba: ba}, nil); err != nil {
		b.Fatal(err)
	}
	sub("sortie/gateways/bench/replies/+", func(_ paho.Client, m paho.Message) {
		var r struct {
			RequestID string `json:"request_id"`
			MissionID string `json:"mission_id"`
		}
		if err := json.Unmarshal(m.Payload(), &r); err != nil {
			b.Errorf("reply %s: %v", m.Payload(), err)
			return
		}
		ba.mu.Lock()
		ch := ba.accepted[r.RequestID]
		ba.mu.Unlock()
		if ch != nil {
			ch <- r.MissionID
		}
	})
	// Completion is observed in-process: the event feed is best effort by
	// design, and the benchmark must not lose a completion.
	ba.a.Driver().Observe(driver.ObserverFunc(func(ev driver.Event, m *driver.Mission) {
		if ev.To == driver.StateSucceeded {
			ba.done2(m.ID) <- time.Now()
		}
	}))
	return ba
}

// cmdHook records when the first device command of each mission reaches
// the broker. Command IDs are "<mission>-<gen>-<step>".
type cmdHook struct {
	mqtt.HookBase
	ba *benchAgent
}

func (h *cmdHook) ID() string { return "bench-first-command" }

func (h *cmdHook) Provides(b byte) bool { return b == mqtt.OnPublish }

func (h *cmdHook) OnPublish(_ *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if !strings.HasPrefix(pk.TopicName, "sortie/devices/") || !strings.HasSuffix(pk.TopicName, "/cmd") {
		return pk, nil
	}
	now := time.Now()
	_, rest, ok := bytes.Cut(pk.Payload, []byte(`"id":"`))
	if !ok {
		return pk, nil
	}
	id, _, _ := bytes.Cut(rest, []byte("-"))
	h.ba.mu.Lock()
	if _, seen := h.ba.firstCmd[string(id)]; !seen {
		h.ba.firstCmd[string(id)] = now
	}
	h.ba.mu.Unlock()
	return pk, nil
}

func (ba *benchAgent) done2(id string) chan time.Time {
	ba.mu.Lock()
	defer ba.mu.Unlock()
	ch := ba.finished[id]
	if ch == nil {
		ch = make(chan time.Time, 1)
		ba.finished[id] = ch
	}
	return ch
}

// run triggers one mission and returns (trigger->first command,
// trigger->SUCCEEDED).
func (ba *benchAgent) run(b *testing.B, req string) (time.Duration, time.Duration) {
	acc := make(chan string, 1)
	ba.mu.Lock()
	ba.accepted[req] = acc
	ba.mu.Unlock()
	start := time.Now()
	if tok := ba.app.Publish("sortie/gateways/bench/trigger", 1, false, fmt.Sprintf(`{"scene":"bench","request_id":%q}`, req)); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		b.Fatal(tok.Error())
	}
	id := testkit.Receive(b, acc, 10*time.Second, "no reply")
	end := testkit.Receive(b, ba.done2(id), 10*time.Second, "mission did not finish")
	ba.mu.Lock()
	first := ba.firstCmd[id]
	delete(ba.firstCmd, id)
	delete(ba.finished, id)
	delete(ba.accepted, req)
	ba.mu.Unlock()
	return first.Sub(start), end.Sub(start)
}

func pct(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// baseline measures, through the same broker and on the same disk as
// the agent under test, what a device command and a durable write cost
// at least: a raw paho QoS 1 publish -> echo -> receive round trip, one
// small fsync'd bbolt put per transaction, and the raw log append a step
// really needs (rawAppender). Benchmarks sample it
// between slices of their own work, so that both see the same machine:
// on these shared machines either can move by a third within a minute.
type baseline struct {
	b         *testing.B
	echo, req paho.Client
	got       chan struct{}
	db        *bolt.DB
	key       uint64
	rtts      []time.Duration
	commits   []time.Duration
	app       *rawAppender
	appends   []time.Duration
}

func newBaseline(b *testing.B, url string) *baseline {
	b.Helper()
	mk := func(id string) paho.Client {
		c := paho.NewClient(paho.NewClientOptions().AddBroker(url).SetClientID(id).SetOrderMatters(false))
		if tok := c.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			b.Fatal(tok.Error())
		}
		return c
	}
	bl := &baseline{b: b, echo: mk("raw-echo"), req: mk("raw-req"), got: make(chan struct{}, 1)}
	b.Cleanup(func() { bl.echo.Disconnect(10); bl.req.Disconnect(10) })
	sub := func(c paho.Client, topic string, h paho.MessageHandler) {
		if tok := c.Subscribe(topic, 1, h); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			b.Fatal(tok.Error())
		}
	}
	sub(bl.echo, "raw/cmd", func(c paho.Client, m paho.Message) {
		p := m.Payload()
		go c.Publish("raw/ack", 1, false, p) // never publish-and-wait inside a handler
	})
	sub(bl.req, "raw/ack", func(paho.Client, paho.Message) { bl.got <- struct{}{} })
	var err error
	dir := b.TempDir()
	bl.app = newRawAppender(b, dir)
	if bl.db, err = bolt.Open(filepath.Join(dir, "raw.db"), 0o600, &bolt.Options{Timeout: time.Second}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := bl.db.Close(); err != nil {
			b.Errorf("close raw.db: %v", err)
		}
	})
	return bl
}

// sample takes n round trips and c commits.
func (bl *baseline) sample(n, c int) {
	for range n {
		start := time.Now()
		if tok := bl.req.Publish("raw/cmd", 1, false, `{"id":"x"}`); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			bl.b.Fatal("raw publish: ", tok.Error())
		}
		testkit.Receive(bl.b, bl.got, 5*time.Second, "raw echo lost")
		bl.rtts = append(bl.rtts, time.Since(start))
	}
	k := make([]byte, 8)
	for range c {
		bl.key++
		binary.BigEndian.PutUint64(k, bl.key)
		start := time.Now()
		if err := bl.db.Update(func(tx *bolt.Tx) error {
			bk, err := tx.CreateBucketIfNotExists([]byte("raw"))
			if err != nil {
				return err
			}
			return bk.Put(k, []byte("0123456789abcdef"))
		}); err != nil {
			bl.b.Fatal(err)
		}
		bl.commits = append(bl.commits, time.Since(start))
	}
	for range c {
		start := time.Now()
		if err := bl.app.append(); err != nil {
			bl.b.Fatal(err)
		}
		bl.appends = append(bl.appends, time.Since(start))
	}
}

// rtt and commit are the medians, to compare with the medians of the
// work measured.
func (bl *baseline) rtt() time.Duration    { return pct(bl.rtts, 0.5) }
func (bl *baseline) commit() time.Duration { return pct(bl.commits, 0.5) }
func (bl *baseline) append() time.Duration { return pct(bl.appends, 0.5) }

// benchSlices is how many times a benchmark alternates its own work with
// baseline samples.
const benchSlices = 10

// BenchmarkEndToEnd: 3-step scenes triggered over MQTT through the
// embedded broker to zero-latency simulated devices, one at a time. The
// step latency is reported two ways: trigger→SUCCEEDED over 3 (which
// includes the trigger's intake), and first command→SUCCEEDED over 3.
func BenchmarkEndToEnd(b *testing.B) {
	for _, l := range benchLinks {
		b.Run(l.name, func(b *testing.B) { benchEndToEnd(b, l.overTCP) })
	}
}

func benchEndToEnd(b *testing.B, overTCP bool) {
	ba := startBenchAgent(b, overTCP)
	for i := range 20 { // warm up connections, caches and the file
		ba.run(b, fmt.Sprintf("warm-%d", i))
	}
	bl := newBaseline(b, ba.url)
	firsts := make([]time.Duration, 0, b.N)
	totals := make([]time.Duration, 0, b.N)
	devSteps := make([]time.Duration, 0, b.N)
	per := max(b.N/benchSlices, 1)
	b.ResetTimer()
	for i := range b.N {
		if i%per == 0 {
			b.StopTimer()
			bl.sample(100, 30)
			b.StartTimer()
		}
		f, t := ba.run(b, fmt.Sprintf("seq-%d", i))
		firsts = append(firsts, f)
		totals = append(totals, t)
		devSteps = append(devSteps, (t-f)/3)
	}
	b.StopTimer()
	bl.sample(100, 30)
	rtt, commit := bl.rtt(), bl.commit()
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	perStep := pct(totals, 0.5) / 3
	b.ReportMetric(ms(pct(firsts, 0.5)), "first-cmd-p50-ms")
	b.ReportMetric(ms(pct(firsts, 0.99)), "first-cmd-p99-ms")
	b.ReportMetric(ms(pct(totals, 0.5)), "succeeded-p50-ms")
	b.ReportMetric(ms(pct(totals, 0.99)), "succeeded-p99-ms")
	b.ReportMetric(ms(perStep), "step-p50-ms")
	b.ReportMetric(ms(rtt), "raw-rtt-p50-ms")
	b.ReportMetric(ms(commit), "raw-commit-p50-ms")
	b.ReportMetric(float64(perStep)/float64(rtt+commit*12/10), "step/(rtt+1.2commit)")
	// The same without the trigger's intake (reported above as
	// first-cmd): from a step's command to the next one's, or to
	// SUCCEEDED for the last.
	b.ReportMetric(ms(pct(devSteps, 0.5)), "cmd-to-cmd-p50-ms")
	b.ReportMetric(float64(pct(devSteps, 0.5))/float64(rtt+commit*12/10), "cmd-to-cmd/(rtt+1.2commit)")
	// The same against what a step needs at least on any machine: one
	// round trip and one log append (a bbolt commit's cost varies 3-4x
	// between machines; a step's durable write is not a bbolt commit).
	app := bl.append()
	b.ReportMetric(ms(app), "raw-append-p50-ms")
	b.ReportMetric(float64(pct(devSteps, 0.5))/float64(rtt+app), "cmd-to-cmd/(rtt+append)")
	// The trigger's intake needs one append too (the mission's
	// creation): its p99 is compared with a round trip and an append.
	b.ReportMetric(float64(pct(firsts, 0.99))/float64(rtt+app), "first-cmd-p99/(rtt+append)")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkConcurrent64: durable steps/s with 64 missions in flight,
// beside the raw QoS 1 round-trip rate (one at a time, as the raw commit
// rate is) measured between slices of the same run.
func BenchmarkConcurrent64(b *testing.B) {
	for _, l := range benchLinks {
		b.Run(l.name, func(b *testing.B) { benchConcurrent64(b, l.overTCP) })
	}
}

func benchConcurrent64(b *testing.B, overTCP bool) {
	ba := startBenchAgent(b, overTCP)
	for i := range 20 {
		ba.run(b, fmt.Sprintf("warm-%d", i))
	}
	bl := newBaseline(b, ba.url)
	const inflight = 64
	per := max(b.N/benchSlices, inflight)
	var elapsed time.Duration
	var missions int
	b.ResetTimer()
	for slice := range benchSlices {
		b.StopTimer()
		bl.sample(200, 0)
		b.StartTimer()
		start := time.Now()
		var wg sync.WaitGroup
		sem := make(chan struct{}, inflight)
		for i := range per {
			sem <- struct{}{}
			wg.Go(func() {
				ba.run(b, fmt.Sprintf("c-%d-%d", slice, i))
				<-sem
			})
		}
		wg.Wait()
		elapsed += time.Since(start)
		missions += per
	}
	b.StopTimer()
	bl.sample(200, 0)
	steps := float64(3*missions) / elapsed.Seconds()
	raw := float64(time.Second) / float64(bl.rtt())
	b.ReportMetric(steps, "steps/s")
	b.ReportMetric(raw, "raw-rtt/s")
	b.ReportMetric(steps/raw, "ratio")
	b.ReportMetric(0, "ns/op")
}
