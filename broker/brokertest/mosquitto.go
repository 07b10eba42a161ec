package brokertest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// Mosquitto starts Debian's mosquitto on a free port of 127.0.0.1, open
// to every client, and stops it when the test ends; it returns the
// broker's URL. Without mosquitto the test is skipped, or fails when
// CI=true (.ci/run installs it): device ecosystems are most often run
// against it, so their tests must not pass by skipping in CI.
func Mosquitto(tb testing.TB) string {
	tb.Helper()
	return StartMosquitto(tb, false).URL()
}

// MosquittoProc is a mosquitto process that a test stops and starts
// again on the same port.
type MosquittoProc struct {
	tb   testing.TB
	bin  string
	conf string
	addr string
	cmd  *exec.Cmd
}

// StartMosquitto starts mosquitto as Mosquitto does. With persistent it
// keeps its sessions and queued messages (100,000 a client) across
// restarts, saving them at each clean Stop.
func StartMosquitto(tb testing.TB, persistent bool) *MosquittoProc {
	tb.Helper()
	bin, err := exec.LookPath("mosquitto")
	if err != nil {
		bin = "/usr/sbin/mosquitto"
		if _, serr := os.Stat(bin); serr != nil {
			if os.Getenv("CI") == "true" {
				tb.Fatal("mosquitto not found (.ci/run installs it)")
			}
			tb.Skip("mosquitto not found")
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := l.Addr().String()
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close() // mosquitto takes the port; a race with another taker fails its start, loudly
	dir := tb.TempDir()
	who := "root"
	if u, err := user.Current(); err == nil {
		who = u.Username // started as root it would switch to a user that may not write dir
	}
	conf := fmt.Sprintf("listener %d 127.0.0.1\nallow_anonymous true\nuser %s\nset_tcp_nodelay true\nlog_dest none\n", port, who)
	if persistent {
		conf += fmt.Sprintf("persistence true\npersistence_location %s/\nmax_queued_messages 100000\n", dir)
	}
	m := &MosquittoProc{tb: tb, bin: bin, conf: filepath.Join(dir, "mosquitto.conf"), addr: addr}
	if err := os.WriteFile(m.conf, []byte(conf), 0o600); err != nil {
		tb.Fatal(err)
	}
	m.Start()
	tb.Cleanup(m.Stop)
	return m
}

// URL is the broker's tcp:// URL.
func (m *MosquittoProc) URL() string { return "tcp://" + m.addr }

// Start starts the process and waits until it listens.
func (m *MosquittoProc) Start() {
	m.tb.Helper()
	m.cmd = exec.Command(m.bin, "-c", m.conf)
	if err := m.cmd.Start(); err != nil {
		m.tb.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c, err := net.Dial("tcp", m.addr); err == nil {
			_ = c.Close() // only probing that it listens
			return
		}
		if time.Now().After(deadline) {
			m.tb.Fatal("mosquitto does not listen after 10s")
		}
		time.Sleep(10 * time.Millisecond) // polling a port: mosquitto offers no event for it
	}
}

// Stop stops the process cleanly (it saves its sessions) and waits for
// its exit; a stopped one is left alone.
func (m *MosquittoProc) Stop() {
	if m.cmd == nil || m.cmd.Process == nil || m.cmd.ProcessState != nil {
		return
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	_ = m.cmd.Wait() // its exit status after SIGTERM says nothing more
}
