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
	conf := filepath.Join(dir, "mosquitto.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, "listener %d 127.0.0.1\nallow_anonymous true\nuser %s\nset_tcp_nodelay true\nlog_dest none\n", port, who), 0o600); err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", conf)
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait() // its exit status after SIGTERM says nothing more
	})
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c, err := net.Dial("tcp", addr); err == nil {
			_ = c.Close() // only probing that it listens
			return "tcp://" + addr
		}
		if time.Now().After(deadline) {
			tb.Fatal("mosquitto does not listen after 10s")
		}
		time.Sleep(10 * time.Millisecond) // polling a port: mosquitto offers no event for it
	}
}
