package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/store"
)

// fillFinished stores n finished 3-step missions with realistic
// timelines, as weeks of use would leave them.
func fillFinished(b *testing.B, path string, n int) {
	db, err := store.Open(path, store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := db.Close(); err != nil {
			b.Error(err)
		}
	}()
	var wg sync.WaitGroup
	work := make(chan int)
	for range 32 {
		wg.Go(func() {
			for i := range work {
				now := time.Now().Add(-time.Duration(n-i) * time.Minute)
				id := fmt.Sprintf("%012x%012x", now.UnixMilli(), i)
				m := &driver.Mission{
					ID: id, Type: "go_home", Priority: 50, State: driver.StateSucceeded, Version: 1,
					Context: driver.Context{Schema: driver.ContextSchema, Values: map[string]any{"temperature": 24}},
					Meta:    driver.Metadata{Created: now, Updated: now, Finished: now, TraceID: strings.Repeat("ab", 16), RequestKey: "req-" + id},
				}
				var evs []driver.Event
				for s := range 3 {
					m.Steps = append(m.Steps, driver.Step{ID: fmt.Sprintf("%d-dev", s), Kind: "device.command", Params: []byte(`{"device":"living-light","action":"turn_on","params":{"brightness":80}}`)})
					m.Results = append(m.Results, driver.StepResult{Status: driver.StepSucceeded, Attempts: 1, Started: now, Finished: now,
						Outputs: map[string]any{"state": map[string]any{"power": "on", "brightness": 80}, "prior_state": map[string]any{"power": "off"}}})
				}
				for k, in := range []driver.Input{driver.InSubmit, driver.InStart, driver.InBeginStep, driver.InStepOK, driver.InNext, driver.InBeginStep, driver.InStepOK, driver.InNext, driver.InBeginStep, driver.InStepOK, driver.InNext, driver.InComplete} {
					evs = append(evs, driver.Event{MissionID: id, Seq: uint64(k + 1), Type: "go_home", Input: in, Time: now})
				}
				m.Seq = uint64(len(evs))
				if _, _, err := db.Create(context.Background(), m, evs); err != nil {
					b.Error(err)
				}
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
}

// agentRSS starts the agent binary on dataDir and returns its resident
// set size once it is ready and has settled.
func agentRSS(b *testing.B, dataDir string) (rss, anon float64) {
	cfg := filepath.Join(b.TempDir(), "agent.toml")
	writeFile(b, cfg, fmt.Sprintf(`data_dir = %q
devices = %q
scenes = %q
[broker]
listen = "127.0.0.1:0"
[http]
listen = "127.0.0.1:0"
[log]
format = "json"
`, dataDir, repoPath(b, "configs/devices.toml"), repoPath(b, "configs/scenes")))
	cmd := exec.Command(agentBin, "run", "-config", cfg)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		// Sampled and done: the kill and its exit status are expected.
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	sc := bufio.NewScanner(stderr)
	ready := false
	for sc.Scan() {
		if strings.Contains(sc.Text(), `"agent ready"`) {
			ready = true
			break
		}
	}
	if !ready {
		b.Fatal("agent did not start")
	}
	go func() {
		for sc.Scan() {
		}
	}()
	// Resident size after start-up work is done: sample until it stops
	// growing (bounded).
	for range 20 {
		r := readRSS(b, cmd.Process.Pid)
		if r <= rss {
			break
		}
		rss = r
		time.Sleep(100 * time.Millisecond) // sampling interval, not synchronisation
	}
	return rss, readAnon(b, cmd.Process.Pid)
}

// readRSS returns VmRSS in MiB; readAnon the anonymous part (heap and
// stacks), without the file-backed bbolt pages the kernel can reclaim.
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

// BenchmarkAgentRSS reports the agent's resident memory at idle and with
// 10,000 finished missions stored (the default retention count).
func BenchmarkAgentRSS(b *testing.B) {
	if raceEnabled {
		b.Skip("memory under -race is not representative")
	}
	idleDir := b.TempDir()
	fullDir := b.TempDir()
	fillFinished(b, filepath.Join(fullDir, "missions.db"), 10000)
	b.ResetTimer()
	var idle, full, idleAnon, fullAnon float64
	for range b.N {
		idle, idleAnon = agentRSS(b, idleDir)
		full, fullAnon = agentRSS(b, fullDir)
	}
	fi, _ := os.Stat(filepath.Join(fullDir, "missions.db"))
	b.ReportMetric(idle, "rss-idle-MiB")
	b.ReportMetric(full, "rss-10k-MiB")
	b.ReportMetric(idleAnon, "anon-idle-MiB")
	b.ReportMetric(fullAnon, "anon-10k-MiB")
	b.ReportMetric(float64(fi.Size())/(1<<20), "db-10k-MiB")
	b.ReportMetric(0, "ns/op")
}
