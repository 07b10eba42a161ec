package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/internal/testkit"
)

// readyConfig writes an agent config as a gateway runs it (the embedded
// broker, the API on a fixed port, the shipped registry and scenes, no
// simulated home) on dataDir, and returns its path and the API's address.
func readyConfig(b *testing.B, dir, dataDir string) (cfg, api string) {
	b.Helper()
	api = loopbackAddr(b)
	cfg = filepath.Join(dir, "agent.toml")
	writeFile(b, cfg, fmt.Sprintf(`data_dir = %q
devices = %q
scenes = %q
[broker]
listen = %q
[http]
listen = %q
[log]
format = "json"
level = "warn"
`, dataDir, testkit.RepoPath("configs/devices.toml"), testkit.RepoPath("configs/scenes"), loopbackAddr(b), api))
	return cfg, api
}

// loopbackAddr returns a loopback address nothing listens on: a
// supervisor polls a port it knows, so the agent is given one, not :0.
func loopbackAddr(b *testing.B) string {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = ln.Close() }() // only its port was wanted
	return ln.Addr().String()
}

// timeToReady execs bin with cfg and polls http://api/readyz every
// millisecond, as a supervisor would, until it answers 200; it returns
// the time from exec to that answer, then stops the agent with SIGTERM
// and waits for a clean exit (which leaves the data dir as a clean stop
// does for the next start).
func timeToReady(b *testing.B, bin, cfg, api string) time.Duration {
	b.Helper()
	cmd := exec.Command(bin, "run", "-config", cfg)
	cmd.Stderr = os.Stderr // level warn: only what went wrong
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var took time.Duration
	for took == 0 {
		select {
		case err := <-exited:
			b.Fatalf("%s exited before ready: %v", bin, err)
		default:
		}
		if resp, err := client.Get("http://" + api + "/readyz"); err == nil {
			_ = resp.Body.Close() // the status is the answer
			if resp.StatusCode == http.StatusOK {
				took = time.Since(start)
				break
			}
		}
		if time.Since(start) > 30*time.Second {
			_ = cmd.Process.Kill() // the benchmark has failed already
			b.Fatalf("%s not ready after 30s", bin)
		}
		time.Sleep(time.Millisecond) // the polling interval, as a supervisor's
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			b.Fatalf("%s stopped with %v", bin, err)
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		b.Fatalf("%s did not stop within 30s", bin)
	}
	return took
}

// processFloor is exec of `agent version` to its exit: the runtime's
// start and the package inits, which no start-up work can go below.
func processFloor(b *testing.B, bin string) time.Duration {
	b.Helper()
	start := time.Now()
	if out, err := exec.Command(bin, "version").CombinedOutput(); err != nil {
		b.Fatalf("%s version: %v\n%s", bin, err, out)
	}
	return time.Since(start)
}

// BenchmarkTimeToReady measures start-up as a supervisor sees it: exec
// of `agent run` to the first 200 from /readyz, on an empty store left
// by a clean stop and on one holding 10,000 finished go_home missions,
// each started -ready-runs times (default 10) and reported as the
// median, min and max, beside the process floor (exec of `agent
// version` to its exit). With SORTIE_READY_BASELINE set to another
// build of the agent (go build -trimpath -ldflags='-s -w' at another
// commit), the two binaries are started in turn, each on its own copy of
// the stores (what one leaves at a clean stop is what it starts from),
// and the ratio of the medians is reported too: a before/after in one
// run.
//
//	go test ./cmd/agent -run '^$' -bench TimeToReady -benchtime 1x
func BenchmarkTimeToReady(b *testing.B) {
	if testkit.Race {
		b.Skip("start-up under -race is not representative")
	}
	runs := 10
	if v := os.Getenv("SORTIE_READY_RUNS"); v != "" {
		var err error
		if runs, err = strconv.Atoi(v); err != nil || runs < 1 {
			b.Fatalf("SORTIE_READY_RUNS=%q: want a positive count", v)
		}
	}
	bins := map[string]string{"new": agentBin}
	if base := os.Getenv("SORTIE_READY_BASELINE"); base != "" {
		bins["base"] = base
	}
	for range b.N {
		dir := b.TempDir()
		// The history: one go_home run by the agent, copied 10,000 times.
		seedCfg := footprintConfig(b, filepath.Join(dir, "seed"), filepath.Join(dir, "seeddata"), true)
		seed := startFootprint(b, seedCfg)
		seed.burst(b, 1)
		seed.stop(b)
		history := filepath.Join(dir, "history.db")
		copyMissions(b, filepath.Join(dir, "seeddata", "missions.db"), history, 10000)

		stores := []string{"empty", "10k"}
		times := map[string][]time.Duration{}
		floors := map[string][]time.Duration{}
		for _, s := range stores {
			type setup struct{ cfg, api string }
			setups := map[string]setup{}
			for name, bin := range bins {
				data := filepath.Join(dir, name+"-"+s)
				if s == "10k" {
					copyFile(b, history, filepath.Join(data, "missions.db"))
				}
				cfg, api := readyConfig(b, filepath.Join(dir, "cfg-"+name+"-"+s), data)
				setups[name] = setup{cfg, api}
				// A first start makes the empty store, and leaves each as
				// this binary's clean stop leaves it.
				timeToReady(b, bin, cfg, api)
			}
			for i := range runs {
				order := []string{"new", "base"}
				if i%2 == 1 {
					order = []string{"base", "new"}
				}
				for _, name := range order {
					bin, ok := bins[name]
					if !ok {
						continue
					}
					st := setups[name]
					times[name+"/"+s] = append(times[name+"/"+s], timeToReady(b, bin, st.cfg, st.api))
					floors[name] = append(floors[name], processFloor(b, bin))
				}
			}
		}
		med := func(ds []time.Duration) float64 {
			s := slices.Clone(ds)
			slices.Sort(s)
			return float64(s[len(s)/2].Microseconds()) / 1000
		}
		for name := range bins {
			for _, s := range stores {
				ds := times[name+"/"+s]
				b.ReportMetric(med(ds), name+"-ready-"+s+"-ms")
				b.ReportMetric(float64(slices.Min(ds).Microseconds())/1000, name+"-ready-"+s+"-min-ms")
				b.ReportMetric(float64(slices.Max(ds).Microseconds())/1000, name+"-ready-"+s+"-max-ms")
				if _, ok := bins["base"]; ok && name == "new" {
					b.ReportMetric(med(ds)/med(times["base/"+s]), "new/base-"+s)
				}
			}
			b.ReportMetric(med(floors[name]), name+"-floor-ms")
		}
	}
	b.ReportMetric(0, "ns/op")
}

// copyFile copies the file at from to to, making to's directory.
func copyFile(b *testing.B, from, to string) {
	b.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		b.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o700); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o600); err != nil {
		b.Fatal(err)
	}
}
