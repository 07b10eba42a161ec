package fleetsim_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/broker/passwd"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/uplink"
)

// hubBin is the hub binary, built once per test binary.
var hubBin struct {
	once sync.Once
	path string
	err  error
}

// TestMain removes the hub binary once the tests are done.
func TestMain(m *testing.M) {
	flag.Parse()
	if addr := os.Getenv(bareBrokerEnv); addr != "" {
		serveBareBroker(addr)
		return
	}
	code := m.Run()
	if hubBin.path != "" {
		_ = os.RemoveAll(filepath.Dir(hubBin.path)) // a temporary directory of ours
	}
	os.Exit(code)
}

// buildHub builds cmd/hub into a directory that lives as long as the
// test binary.
func buildHub(tb testing.TB) string {
	tb.Helper()
	hubBin.once.Do(func() {
		dir, err := os.MkdirTemp("", "fleetsim-hub")
		if err != nil {
			hubBin.err = err
			return
		}
		hubBin.path = filepath.Join(dir, "hub")
		cmd := exec.Command("go", "build", "-o", hubBin.path, "./cmd/hub")
		cmd.Dir = filepath.Join("..", "..")
		if out, err := cmd.CombinedOutput(); err != nil {
			hubBin.err = fmt.Errorf("go build ./cmd/hub: %w\n%s", err, out)
		}
	})
	if hubBin.err != nil {
		tb.Fatal(hubBin.err)
	}
	return hubBin.path
}

// hubProc is a real single-process hub (the cmd/hub binary, embedded
// broker with the gateways' ACL, bbolt store) run as a child process.
type hubProc struct {
	tb     testing.TB
	cmd    *exec.Cmd
	broker string // tcp://127.0.0.1:port
	api    string // http://127.0.0.1:port
	token  string
}

// gatewayPassword is every simulated gateway's password on the hub.
func gatewayPassword(id string) string { return "pw-" + id + "-long-enough" }

// hashIterations is the PBKDF2 cost of the gateways' hashes in these
// tests: production's (passwd.Iterations, 210,000) costs the hub tens of
// milliseconds of CPU per gateway's first login, which would drown what
// is measured here; BenchmarkFleetConnect reports it apart.
const hashIterations = 1000

// startHub runs the hub for gateways ids and waits until its broker and
// API answer.
func startHub(tb testing.TB, ids []string, iterations int) *hubProc {
	tb.Helper()
	bin := buildHub(tb)
	dir := tb.TempDir()
	var conf strings.Builder
	brokerAddr, apiAddr := testkit.FreeAddr(tb), testkit.FreeAddr(tb)
	h := &hubProc{tb: tb, broker: "tcp://" + brokerAddr, api: "http://" + apiAddr, token: "fleetsim-bench-token"}
	fmt.Fprintf(&conf, "data_dir = %q\n[broker]\nlisten = %q\n[http]\nlisten = %q\ntoken = %q\n[log]\nlevel = \"warn\"\n[gateways]\n",
		filepath.Join(dir, "data"), brokerAddr, apiAddr, h.token)
	for _, id := range ids {
		hash, err := passwd.HashCost(gatewayPassword(id), iterations)
		if err != nil {
			tb.Fatal(err)
		}
		fmt.Fprintf(&conf, "%q = %q\n", id, hash)
	}
	path := filepath.Join(dir, "hub.toml")
	if err := os.WriteFile(path, []byte(conf.String()), 0o600); err != nil {
		tb.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "hub.log"))
	if err != nil {
		tb.Fatal(err)
	}
	h.cmd = exec.Command(bin, "run", "-config", path)
	h.cmd.Stdout, h.cmd.Stderr = logf, logf
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := h.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = h.cmd.Process.Signal(syscall.SIGTERM) // a clean stop; Wait reaps it either way
		done := make(chan struct{})
		go func() { _ = h.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = h.cmd.Process.Kill() // it did not stop in time; the test is over
			<-done
		}
		_ = logf.Close()
		if tb.Failed() {
			if b, err := os.ReadFile(logf.Name()); err == nil {
				tb.Logf("hub log:\n%s", b)
			}
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		if res, err := http.Get(h.api + "/readyz"); err == nil {
			_ = res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return h
			}
		}
		if time.Now().After(deadline) {
			tb.Fatal("the hub did not get ready in 60s")
		}
		time.Sleep(50 * time.Millisecond) // polling a process we do not control
	}
}

// cpu is the hub process's CPU time so far (user and system).
func (h *hubProc) cpu() time.Duration {
	h.tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", h.cmd.Process.Pid))
	if err != nil {
		h.tb.Fatal(err)
	}
	// The fields after the command name, which is in parentheses.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ is 100 on Linux
}

// rss is the hub process's resident memory, in bytes.
func (h *hubProc) rss() int64 {
	h.tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", h.cmd.Process.Pid))
	if err != nil {
		h.tb.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// hubGateway is what the hub's API says of a gateway (the fields used).
type hubGateway struct {
	ID            string            `json:"id"`
	State         string            `json:"state"`
	LastHeartbeat time.Time         `json:"last_heartbeat"`
	Heartbeat     *uplink.Heartbeat `json:"heartbeat"`
}

// gateways reads GET /api/gateways.
func (h *hubProc) gateways(ctx context.Context) ([]hubGateway, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.api+"/api/gateways", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+h.token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = res.Body.Close() }()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /api/gateways: %s", res.Status)
	}
	var out struct {
		Gateways []hubGateway `json:"gateways"`
	}
	err = json.NewDecoder(res.Body).Decode(&out)
	return out.Gateways, err
}

// waitGateways polls the hub's API, every 250 ms, until cond holds
// over its gateways.
func (h *hubProc) waitGateways(what string, d time.Duration, cond func([]hubGateway) bool) {
	h.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for {
		gws, err := h.gateways(ctx)
		if err == nil && cond(gws) {
			return
		}
		select {
		case <-ctx.Done():
			h.tb.Fatalf("the hub did not see %s within %s (last error: %v)", what, d, err)
		case <-time.After(250 * time.Millisecond): // the hub has no event to wait on from outside
		}
	}
}
