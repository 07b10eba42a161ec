package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/store"
)

// footprintHome: the three devices of go_home, healthy, acking after
// 50–150 ms, as Wi-Fi devices do.
const footprintHome = `seed = 7
[[device]]
id = "living-light"
type = "light"
[device.faults]
ack_delay = "50ms"
ack_jitter = "100ms"
[[device]]
id = "living-ac"
type = "ac"
[device.faults]
ack_delay = "50ms"
ack_jitter = "100ms"
[[device]]
id = "living-speaker"
type = "speaker"
[device.faults]
ack_delay = "50ms"
ack_jitter = "100ms"
`

// footprintAgent is the agent binary on a data directory, with the
// shipped go_home scene (run in parallel, so that a burst is not
// restarts) on the three devices above.
type footprintAgent struct {
	cmd     *exec.Cmd
	started time.Time
	ready   time.Duration // start to "agent ready"
	http    string
	exited  chan error
}

func footprintConfig(b *testing.B, dir, dataDir string, home bool) string {
	b.Helper()
	goHome, err := os.ReadFile(testkit.RepoPath("configs/scenes/go_home.toml"))
	if err != nil {
		b.Fatal(err)
	}
	scene := regexp.MustCompile(`(?m)^mode = .*$`).ReplaceAll(goHome, []byte(`mode = "parallel"`))
	writeFile(b, filepath.Join(dir, "scenes", "go_home.toml"), string(scene))
	writeFile(b, filepath.Join(dir, "home.toml"), footprintHome)
	cfg := filepath.Join(dir, "agent.toml")
	writeFile(b, cfg, fmt.Sprintf(`data_dir = %q
devices = %q
scenes = "scenes"
[broker]
listen = "127.0.0.1:0"
[http]
listen = "127.0.0.1:0"
[log]
format = "json"
level = "info"
[simulator]
home = %q
`, dataDir, benchRegistry(b, dir), map[bool]string{true: "home.toml"}[home]))
	return cfg
}

func startFootprint(b *testing.B, cfg string) *footprintAgent {
	b.Helper()
	p := &footprintAgent{cmd: exec.Command(agentBin, "run", "-config", cfg), exited: make(chan error, 1)}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		b.Fatal(err)
	}
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var rec map[string]any
			if json.Unmarshal(sc.Bytes(), &rec) != nil {
				continue
			}
			switch rec["msg"] {
			case "http listening":
				p.http, _ = rec["addr"].(string)
			case "agent ready":
				p.ready = time.Since(p.started)
				close(ready)
			}
		}
		p.exited <- p.cmd.Wait()
	}()
	b.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill() // the benchmark is over
			if err := <-p.exited; err == nil {
				b.Log("agent exited cleanly before its kill")
			}
		}
	})
	select {
	case <-ready:
	case err := <-p.exited:
		b.Fatalf("agent exited before ready: %v", err)
	case <-time.After(60 * time.Second):
		b.Fatal("agent not ready after 60s")
	}
	return p
}

func (p *footprintAgent) stop(b *testing.B) {
	b.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	err := testkit.Receive(b, p.exited, 60*time.Second, "agent did not stop within 60s")
	if err != nil {
		b.Fatalf("agent stopped with %v", err)
	}
}

// settledRSS samples the resident set every 200 ms until it is the same
// twice, then returns it: what the process holds once start-up is over
// (bounded to 5 s).
func (p *footprintAgent) settledRSS(b *testing.B) float64 {
	rss := readRSS(b, p.cmd.Process.Pid)
	for range 25 {
		time.Sleep(200 * time.Millisecond) // sampling interval, not synchronisation
		r := readRSS(b, p.cmd.Process.Pid)
		if r == rss {
			break
		}
		rss = r
	}
	return rss
}

// burst submits n go_home missions through the API, 32 requests at a
// time, and waits until the store holds n SUCCEEDED; it returns the
// highest resident set sampled every 20 ms meanwhile.
func (p *footprintAgent) burst(b *testing.B, n int) (peak float64) {
	b.Helper()
	var peakBits atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			if r := readRSS(b, p.cmd.Process.Pid); r > float64(peakBits.Load())/1024 {
				peakBits.Store(uint64(r * 1024))
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	work := make(chan int)
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for i := range work {
				body := fmt.Sprintf(`{"scene":"go_home","request_id":"fp-%d","params":{"temperature":%d}}`, i, 18+i%10)
				for {
					resp, err := http.Post("http://"+p.http+"/api/missions", "application/json", strings.NewReader(body))
					if err != nil {
						b.Error(err)
						return
					}
					_ = resp.Body.Close() // nothing in it is needed
					if resp.StatusCode == http.StatusServiceUnavailable {
						time.Sleep(10 * time.Millisecond) // the agent asks to retry later
						continue
					}
					if resp.StatusCode != http.StatusCreated {
						b.Errorf("submit %d: %s", i, resp.Status)
					}
					break
				}
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	deadline := time.Now().Add(10 * time.Minute)
	for p.succeeded(b) < n {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d missions succeeded after 10 minutes", p.succeeded(b), n)
		}
		time.Sleep(100 * time.Millisecond) // polling the metrics
	}
	close(stop)
	<-sampled
	return float64(peakBits.Load()) / 1024
}

var succeededGauge = regexp.MustCompile(`(?m)^sortie_missions\{state="succeeded"\} (\d+)`)

func (p *footprintAgent) succeeded(b *testing.B) int {
	resp, err := http.Get("http://" + p.http + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }() // read to the end
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	n := 0
	if m := succeededGauge.FindSubmatch(buf.Bytes()); m != nil {
		_, _ = fmt.Sscan(string(m[1]), &n)
	}
	return n
}

func fileSize(b *testing.B, path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	return fi.Size()
}

// copyMissions fills a new store at path with n copies of a stored
// mission and its timeline, under new IDs and request keys: a history of
// n real go_home runs, without running them.
func copyMissions(b *testing.B, from, path string, n int) {
	b.Helper()
	src, err := store.Open(from, store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	ms, _, err := src.List(ctx, driver.Filter{Limit: 1})
	if err != nil || len(ms) == 0 {
		b.Fatalf("no mission to copy: %v", err)
	}
	tmpl := ms[0]
	tl, err := src.Timeline(ctx, tmpl.ID)
	if err != nil {
		b.Fatal(err)
	}
	if err := src.Close(); err != nil {
		b.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		b.Fatal(err)
	}
	dst, err := store.Open(path, store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	work := make(chan int)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := range work {
				m := tmpl.Clone()
				m.ID = fmt.Sprintf("%012x%012x", time.Now().UnixMilli(), i)
				m.Meta.RequestKey = fmt.Sprintf("copy-%d", i)
				evs := append([]driver.Event(nil), tl...)
				for k := range evs {
					evs[k].MissionID = m.ID
				}
				if _, _, err := dst.Create(ctx, m, evs); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	if err := dst.Close(); err != nil {
		b.Fatal(err)
	}
}

// readRSS returns VmRSS in MiB; readAnon the anonymous part (heap and
// stacks), without the file-backed pages (the binary, bbolt's mapping)
// the kernel can reclaim.
func readRSS(b *testing.B, pid int) float64 { return readStatus(b, pid, "VmRSS:") }

func readAnon(b *testing.B, pid int) float64 { return readStatus(b, pid, "RssAnon:") }

func readStatus(b *testing.B, pid int, field string) float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = f.Close() }() // read-only: nothing to lose
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field); ok {
			kb, _ := strconv.Atoi(strings.Fields(v)[0])
			return float64(kb) / 1024
		}
	}
	b.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// BenchmarkFootprint measures what the agent costs a gateway: 10,000
// go_home missions submitted through the API at once (peak resident set
// during the burst, bytes per stored mission), a restart on that history
// (time to ready, resident set), an idle agent with an empty store, and
// a restart on 100,000 stored missions.
func BenchmarkFootprint(b *testing.B) {
	if testkit.Race {
		b.Skip("memory under -race is not representative")
	}
	const n = 10000
	for range b.N {
		dir := b.TempDir()
		data := filepath.Join(dir, "data")
		// Idle as deployed: the embedded broker, no simulated home.
		idle := startFootprint(b, footprintConfig(b, filepath.Join(dir, "idle"), filepath.Join(dir, "empty"), false))
		idleRSS, idleAnon := idle.settledRSS(b), readAnon(b, idle.cmd.Process.Pid)
		emptyReady := idle.ready
		idle.stop(b)

		cfg := footprintConfig(b, dir, data, true)
		run := startFootprint(b, cfg)
		start := time.Now()
		peak := run.burst(b, n)
		took := time.Since(start)
		run.stop(b)
		db := filepath.Join(data, "missions.db")
		size := fileSize(b, db)

		again := startFootprint(b, cfg)
		restartRSS := again.settledRSS(b)
		ready10k := again.ready
		again.stop(b)
		// Without the free pages the burst's live missions left, as
		// retention's Reclaim (or agent compact) leaves it.
		res, err := store.Compact(db, store.Options{})
		if err != nil {
			b.Fatal(err)
		}
		compacted := res.After

		big := filepath.Join(dir, "big")
		copyMissions(b, db, filepath.Join(big, "missions.db"), 10*n)
		bigSize := fileSize(b, filepath.Join(big, "missions.db"))
		bigCfg := footprintConfig(b, filepath.Join(dir, "bigcfg"), big, false)
		huge := startFootprint(b, bigCfg)
		ready100k := huge.ready
		huge.stop(b)

		b.ReportMetric(float64(size)/n, "B/mission")
		b.ReportMetric(float64(compacted)/n, "B/mission-compacted")
		b.ReportMetric(float64(bigSize)/(10*n), "B/mission-100k")
		b.ReportMetric(peak, "rss-burst-MiB")
		b.ReportMetric(restartRSS, "rss-10k-MiB")
		b.ReportMetric(idleRSS, "rss-idle-MiB")
		b.ReportMetric(idleAnon, "anon-idle-MiB")
		b.ReportMetric(float64(emptyReady.Microseconds())/1000, "ready-empty-ms")
		b.ReportMetric(float64(ready10k.Microseconds())/1000, "ready-10k-ms")
		b.ReportMetric(float64(ready100k.Microseconds())/1000, "ready-100k-ms")
		b.ReportMetric(float64(n)/took.Seconds(), "missions/s")
	}
	b.ReportMetric(0, "ns/op")
}
