package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/internal/testkit"
)

// mosquitto is Debian's mosquitto on a port of 127.0.0.1, keeping its
// sessions across restarts (persistence, saved at each clean stop).
type mosquitto struct {
	t    *testing.T
	bin  string
	conf string
	port int
	cmd  *exec.Cmd
}

func startMosquitto(t *testing.T) *mosquitto {
	t.Helper()
	bin, err := exec.LookPath("mosquitto")
	if err != nil {
		bin = "/usr/sbin/mosquitto"
		if _, serr := os.Stat(bin); serr != nil {
			if os.Getenv("CI") == "true" {
				t.Fatal("mosquitto not found (.ci/run installs it)")
			}
			t.Skip("mosquitto not found")
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close() // mosquitto takes the port; a race with another taker fails start, loudly
	dir := t.TempDir()
	conf := filepath.Join(dir, "mosquitto.conf")
	writeFile(t, conf, fmt.Sprintf(`listener %d 127.0.0.1
allow_anonymous true
user %s
persistence true
persistence_location %s/
set_tcp_nodelay true
max_queued_messages 100000
log_dest none
`, port, currentUser(), dir))
	m := &mosquitto{t: t, bin: bin, conf: conf, port: port}
	m.start()
	t.Cleanup(func() { m.stop() })
	return m
}

// currentUser is who mosquitto should run as: started as root it would
// switch to its own user, which may not write the test's directory (its
// sessions would then not be saved across restarts).
func currentUser() string {
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return "root"
}

func (m *mosquitto) url() string { return fmt.Sprintf("tcp://127.0.0.1:%d", m.port) }

func (m *mosquitto) start() {
	m.t.Helper()
	m.cmd = exec.Command(m.bin, "-c", m.conf)
	if err := m.cmd.Start(); err != nil {
		m.t.Fatal(err)
	}
	testkit.Eventually(m.t, 10*time.Second, "mosquitto listening", func() bool { // polling a port; it has no event
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", m.port))
		if err == nil {
			_ = c.Close() // only probing that it listens
		}
		return err == nil
	})
}

// stop stops it cleanly (it saves its sessions) and waits for its exit.
func (m *mosquitto) stop() {
	if m.cmd == nil || m.cmd.Process == nil || m.cmd.ProcessState != nil {
		return
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	_ = m.cmd.Wait() // its exit status after SIGTERM says nothing more
}

// TestMosquittoRestartsLoseNoTrigger: with Debian's mosquitto as the
// broker, restarted 20 times while an app publishes a trigger every 50 ms
// at QoS 1, every trigger the broker acknowledged gets a reply, and no
// request becomes two missions. The app does what docs/protocol.md asks:
// a persistent session for its replies, and the same request_id sent
// again when no reply comes.
func TestMosquittoRestartsLoseNoTrigger(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts a broker 20 times")
	}
	mq := startMosquitto(t)
	e := newBareEnv(t, "mq")
	e.connect(mq.url())
	e.writeConfig(fmt.Sprintf("embedded = false\nurl = %q\n", mq.url()), "")
	e.start()

	app := newTriggerApp(t, mq.url(), "mq")
	app.flow(50 * time.Millisecond)
	for i := range 20 {
		time.Sleep(300 * time.Millisecond) // triggers flow between restarts
		mq.stop()
		// The broker is down a moment, sometimes long enough for the
		// agent's reconnection to back off past its return: triggers then
		// reach a broker the agent is not connected to.
		time.Sleep(time.Duration(100+400*(i%4)) * time.Millisecond)
		mq.start()
	}
	time.Sleep(500 * time.Millisecond) // a last stretch with the broker up
	ids := app.halt()

	// Replies come by subscription; one the agent published while the
	// broker was going down can be lost, and the app then sends the same
	// request again, as docs/protocol.md says. The answer to that must be
	// a duplicate: the trigger itself was not lost.
	resent := app.answerAll(ids)
	for _, id := range ids {
		switch r := app.reply(id); {
		case r == nil:
			t.Errorf("acknowledged trigger %s got no reply, even sent again", id)
		case slices.Contains(resent, id) && r["duplicate"] != true && r["status"] == "accepted":
			t.Errorf("trigger %s, acknowledged by the broker, was lost: sent again, it made its first mission (%v)", id, r)
		}
	}

	perRequest, _ := e.missionsByRequest()
	for id, n := range perRequest {
		if n > 1 {
			t.Errorf("request %s made %d missions", id, n)
		}
	}
	accepted := 0
	for _, id := range ids {
		if perRequest[id] == 1 {
			accepted++
		}
	}
	t.Logf("%d triggers acknowledged by mosquitto over 20 restarts: %d missions, none twice; %d replies lost on the way back and answered when sent again", len(ids), accepted, len(resent))
}
