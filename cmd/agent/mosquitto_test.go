package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/sortie-edge/sortie/agent/api"
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
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", m.port)); err == nil {
			_ = c.Close() // only probing that it listens
			return
		}
		if time.Now().After(deadline) {
			m.t.Fatal("mosquitto does not listen after 10s")
		}
		time.Sleep(10 * time.Millisecond) // polling a port; it has no event
	}
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

	base := "sortie/gateways/mq"
	var mu sync.Mutex
	replies := map[string]map[string]any{}
	opts := paho.NewClientOptions().AddBroker(mq.url()).SetClientID("chaos-app").
		SetCleanSession(false).SetAutoReconnect(true).SetMaxReconnectInterval(100 * time.Millisecond).
		SetConnectRetry(true).SetConnectRetryInterval(100 * time.Millisecond).SetOrderMatters(false)
	opts.SetOnConnectHandler(func(c paho.Client) {
		c.Subscribe(base+"/replies/+", 1, func(_ paho.Client, m paho.Message) {
			var r map[string]any
			if json.Unmarshal(m.Payload(), &r) != nil {
				return
			}
			mu.Lock()
			replies[strings.TrimPrefix(m.Topic(), base+"/replies/")] = r
			mu.Unlock()
		})
	})
	app := paho.NewClient(opts)
	if tok := app.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("app connect: %v", tok.Error())
	}
	defer app.Disconnect(50)
	send := func(id string) bool {
		payload := fmt.Sprintf(`{"scene":"all_off","request_id":%q,"source":"chaos"}`, id)
		tok := app.Publish(base+"/trigger", 1, false, payload)
		return tok.WaitTimeout(2*time.Second) && tok.Error() == nil
	}

	var acked []string
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			id := fmt.Sprintf("chaos-%04d", i)
			if send(id) {
				mu.Lock()
				acked = append(acked, id)
				mu.Unlock()
			}
		}
	}()
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
	close(stop)
	<-done

	// Replies come by subscription; one the agent published while the
	// broker was going down can be lost, and the app then sends the same
	// request again, as docs/protocol.md says. The answer to that must be
	// a duplicate: the trigger itself was not lost.
	mu.Lock()
	ids := append([]string(nil), acked...)
	mu.Unlock()
	unanswered := func() (missing []string) {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range ids {
			if replies[id] == nil {
				missing = append(missing, id)
			}
		}
		return missing
	}
	for deadline := time.Now().Add(15 * time.Second); len(unanswered()) > 0 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond) // replies arrive by subscription
	}
	resent := unanswered()
	for round := 0; round < 20 && len(unanswered()) > 0; round++ {
		for _, id := range unanswered() {
			send(id)
		}
		time.Sleep(500 * time.Millisecond) // replies arrive by subscription; this paces the resends
	}
	mu.Lock()
	for _, id := range ids {
		switch r := replies[id]; {
		case r == nil:
			t.Errorf("acknowledged trigger %s got no reply, even sent again", id)
		case slices.Contains(resent, id) && r["duplicate"] != true && r["status"] == "accepted":
			t.Errorf("trigger %s, acknowledged by the broker, was lost: sent again, it made its first mission (%v)", id, r)
		}
	}
	mu.Unlock()

	// No request became two missions.
	perRequest := map[string]int{}
	for cursor := ""; ; {
		var page api.MissionList
		e.get("/api/missions?limit=1000&cursor="+cursor, &page)
		for _, m := range page.Missions {
			perRequest[m.RequestID]++
		}
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
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
