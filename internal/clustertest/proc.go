package clustertest

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// errNotRunning is returned by a fault asked of a process that is not
// running.
var errNotRunning = errors.New("not running")

// proc is one external process that can be started again with the same
// command line after it stopped or was killed. Its output is appended to
// one log file across runs. Safe for concurrent use.
type proc struct {
	name string // for messages: "nats n1", "postgres"
	path string
	args []string
	dir  string   // working directory; "": the test's
	env  []string // nil: the test's environment
	cred *syscall.Credential
	log  string // log file path

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
	err  error         // cmd.Wait's result, once done is closed
}

// start starts the process; it must not be running.
func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.running() {
		return fmt.Errorf("%s: already running (pid %d)", p.name, p.cmd.Process.Pid)
	}
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("%s: open log: %w", p.name, err)
	}
	// The child has its own copy of the descriptor once started.
	defer func() { _ = f.Close() }()
	_, _ = fmt.Fprintf(f, "\n=== clustertest: start %s at %s\n", p.name, time.Now().Format(time.RFC3339Nano))

	cmd := exec.Command(p.path, p.args...)
	cmd.Dir, cmd.Env = p.dir, p.env
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = ProcAttr(p.cred)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: start: %w", p.name, err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.err = cmd, done, nil
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// running reports whether the last start's process has not exited (as
// far as Wait knows). p.mu held.
func (p *proc) running() bool {
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// pid is the running process's ID, or 0.
func (p *proc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.running() {
		return 0
	}
	return p.cmd.Process.Pid
}

// exited is closed when the current process has exited; nil before the
// first start.
func (p *proc) exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// exitErr is the exit status of the last process, once exited; never
// nil then, even for a zero status.
func (p *proc) exitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err == nil {
		return errors.New("exit status 0")
	}
	return p.err
}

// signal sends sig to the running process and waits up to timeout for it
// to exit; past that it sends SIGKILL and waits for that.
func (p *proc) signal(sig syscall.Signal, timeout time.Duration) error {
	p.mu.Lock()
	if !p.running() {
		p.mu.Unlock()
		return fmt.Errorf("%s: %w", p.name, errNotRunning)
	}
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if err := cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("%s: signal %v: %w", p.name, sig, err)
	}
	select {
	case <-done:
		return nil
	case <-time.After(timeout):
	}
	_ = cmd.Process.Kill() // it may have exited in between: done tells
	select {
	case <-done:
		return fmt.Errorf("%s: no exit within %v of %v; killed", p.name, timeout, sig)
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s: pid %d did not exit after SIGKILL", p.name, cmd.Process.Pid)
	}
}

// stopQuietly ends the process if it runs, for a cleanup.
func (p *proc) stopQuietly() {
	if p.pid() != 0 {
		_ = p.signal(syscall.SIGKILL, 10*time.Second) // cleanup: nothing to keep
	}
}

// tail returns the last max bytes of the log, starting at a line.
func (p *proc) tail(max int) string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(b) > max {
		b = b[len(b)-max:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
		b = append([]byte("...\n"), b...)
	}
	return string(b)
}

// logTailBytes is how much of each log a failed test prints.
const logTailBytes = 16 << 10

// printLogsOnFailure registers a cleanup that prints the end of each
// process's log if the test failed. Register it before the cleanup that
// stops the processes, so that it runs after it and the logs are whole.
func printLogsOnFailure(tb testing.TB, procs ...*proc) {
	tb.Cleanup(func() {
		if !tb.Failed() {
			return
		}
		for _, p := range procs {
			tb.Logf("--- log of %s (%s), last %d KiB:\n%s", p.name, p.log, logTailBytes>>10, p.tail(logTailBytes))
		}
	})
}

// freePorts returns n distinct TCP ports of 127.0.0.1 that were free a
// moment ago. Another process may take one before the server binds it:
// the starters retry on "address already in use".
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close() // only held to keep the ports distinct
		}
	}()
	lo, hi := fixedPortRange()
	for tries := 0; len(ports) < n; tries++ {
		addr := "127.0.0.1:0"
		if hi > lo && tries < 100*n {
			addr = hostPort(lo + rand.IntN(hi-lo))
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			if addr != "127.0.0.1:0" {
				continue // taken: another
			}
			return nil, fmt.Errorf("free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// fixedPortRange is where freePorts looks first: below the kernel's
// ephemeral range, which it never hands out by itself. A node killed
// and started again on its ports found one of them taken by another
// test process's node (picked with :0) or an outgoing connection, and
// its cluster routed to a stranger ("duplicate name n1"). Empty when
// the ephemeral range leaves no room below it.
func fixedPortRange() (lo, hi int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0
	}
	first, err := strconv.Atoi(f[0])
	if err != nil || first < 12000 {
		return 0, 0
	}
	return 10000, first
}

// hostPort is "127.0.0.1:port".
func hostPort(port int) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}
