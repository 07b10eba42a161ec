package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/internal/testkit"
)

// kills is the SIGKILL loop's length per broker: a dozen in make test,
// hundreds on demand (go test ./cmd/agent -run SIGKILLLoop -kills 150).
var kills = flag.Int("kills", 12, "SIGKILLs per broker in TestSIGKILLLoopEveryRestartComesBack")

// TestSIGKILLLoopEveryRestartComesBack is an operator's watchdog: the
// agent is SIGKILLed at a random moment and started again, over and
// over, against an external broker that outlives it (Sortie's embedded
// broker, in the test process, and Debian's mosquitto), while an app
// publishes triggers at QoS 1, so that kills leave missions in flight
// and triggers in the agent's session. Every restart comes back ready (a
// broker's refusal makes it wait, never exit; the test allows 30 s), every
// acknowledged trigger is answered (sent again if need be, as
// docs/protocol.md asks), every mission ends, and no request makes two
// missions.
//
// The trigger link's persistent session used to come back to mochi with
// deliveries numbered like the new connection's first SUBSCRIBE: the
// broker refused it (0x91), and 5 of 150 restarts gave up at start-up.
func TestSIGKILLLoopEveryRestartComesBack(t *testing.T) {
	if testing.Short() {
		t.Skip("SIGKILLs the agent dozens of times")
	}
	t.Run("embedded", func(t *testing.T) { killLoop(t, brokertest.Start(t).URL(), *kills, killHome{}) })
	t.Run("mosquitto", func(t *testing.T) { killLoop(t, brokertest.StartMosquitto(t, true).URL(), *kills, killHome{}) })
}

// killHome is the home a kill loop runs on: the demo home by default.
type killHome struct {
	// start, when set, starts the devices on the broker instead of
	// configs/home.toml's, and sets the env's registry and scenes.
	start func(e *testEnv, url string)
	// scenes are the scenes the app triggers in turn (default all_off).
	scenes []string
	// check, when set, checks the devices once every mission ended.
	check func(e *testEnv)
}

func killLoop(t *testing.T, url string, kills int, h killHome) {
	gw := fmt.Sprintf("kill%d", rand.IntN(1e6))
	e := newBareEnv(t, gw)
	if h.start != nil {
		h.start(e, url)
	} else {
		e.connect(url)
	}
	e.writeConfig(fmt.Sprintf("embedded = false\nurl = %q\n", url), "")
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	app := newTriggerApp(t, url, gw)
	app.scenes = h.scenes
	app.flow(30 * time.Millisecond)

	began, resumed := time.Now(), 0
	var p *agentProc
	for i := 0; ; i++ {
		p = e.start() // fails the test if the agent exits, or is not ready in 30 s
		if strings.Contains(p.log(), "resuming missions from the last run") {
			resumed++
		}
		if i == kills {
			break
		}
		// The moment of the kill is the test's input: soon after the
		// start, while the session's deliveries are still being acked,
		// or later, with missions running.
		time.Sleep(time.Duration(rng.IntN(400)) * time.Millisecond)
		p.stop(t, syscall.SIGKILL)
	}
	elapsed := time.Since(began)
	ids := app.halt()
	// A trigger the agent took but had not made a mission when it was
	// killed is lost; the app sends the same request again.
	resent := app.answerAll(ids)
	lostTriggers := 0
	for _, id := range ids {
		switch r := app.reply(id); {
		case r == nil:
			t.Errorf("acknowledged trigger %s got no reply, even sent again", id)
		case slices.Contains(resent, id) && r["duplicate"] != true && r["status"] == "accepted":
			lostTriggers++ // taken by the agent, not yet a mission when it was killed
		}
	}
	perRequest, live := e.missionsByRequest()
	for deadline := time.Now().Add(time.Minute); live > 0; perRequest, live = e.missionsByRequest() {
		if time.Now().After(deadline) {
			t.Fatalf("%d missions still live a minute after the last start", live)
		}
		time.Sleep(100 * time.Millisecond) // missions end by themselves; polled as an operator would
	}
	for id, n := range perRequest {
		if n > 1 {
			t.Errorf("request %s made %d missions", id, n)
		}
	}
	if h.check != nil {
		h.check(e)
	}
	if code := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit %d on SIGTERM after the loop", code)
	}
	t.Logf("%d SIGKILLs: %d of %d starts came back ready (%d resumed missions a kill left), in %v; %d triggers acked by the broker, %d missions, all ended, none twice; %d unanswered after 15 s and sent again: %d had their mission already (the reply was lost), %d had none (the trigger was)",
		kills, kills+1, kills+1, resumed, elapsed.Round(time.Millisecond), len(ids), len(perRequest), len(resent), len(resent)-lostTriggers, lostTriggers)
}

// TestAgentWaitsForItsBrokerAndStopsCleanly: the agent binary started
// before its broker listens neither exits nor fails: /readyz says what
// it waits for, and SIGTERM meanwhile is a clean stop (exit 0), as a
// supervisor stopping it expects.
func TestAgentWaitsForItsBrokerAndStopsCleanly(t *testing.T) {
	e := newBareEnv(t, "early")
	e.writeConfig(fmt.Sprintf("embedded = false\nurl = \"tcp://%s\"\n", testkit.FreeAddr(t)), "")
	p := e.launch()
	testkit.Until(t, 30*time.Second, func() error { // polling, as a supervisor does
		select {
		case err := <-p.exited:
			t.Fatalf("agent exited while its broker was not up: %v\n%s", err, p.log())
		default:
		}
		p.mu.Lock()
		addr := p.http
		p.mu.Unlock()
		var r api.Readiness
		if addr == "" || e.get("/readyz", &r) != 503 || len(r.Reasons) != 1 || !strings.HasPrefix(r.Reasons[0], "starting: devices: ") {
			return fmt.Errorf("/readyz never said the agent waits for its broker: %+v\n%s", r, p.log())
		}
		t.Logf("/readyz: %s", r.Reasons[0])
		return nil
	})
	if code := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit %d on SIGTERM while waiting for the broker, want 0\n%s", code, p.log())
	}
}

// triggerApp is an app as docs/protocol.md asks for one: it publishes
// triggers at QoS 1, with a persistent session for its replies, and
// sends a request again when no reply comes. It comes back by itself
// when the broker restarts.
type triggerApp struct {
	t    *testing.T
	c    paho.Client
	base string
	// scenes are what the flow triggers, in turn; none means all_off.
	scenes []string

	mu      sync.Mutex
	acked   []string                  // request IDs the broker acknowledged
	replies map[string]map[string]any // by request ID
	stop    chan struct{}
	done    chan struct{}
}

func newTriggerApp(t *testing.T, url, gw string) *triggerApp {
	t.Helper()
	a := &triggerApp{t: t, base: "sortie/gateways/" + gw, replies: map[string]map[string]any{}}
	opts := paho.NewClientOptions().AddBroker(url).SetClientID("app-" + gw).
		SetCleanSession(false).SetAutoReconnect(true).SetMaxReconnectInterval(100 * time.Millisecond).
		SetConnectRetry(true).SetConnectRetryInterval(100 * time.Millisecond).SetOrderMatters(false)
	opts.SetOnConnectHandler(func(c paho.Client) {
		c.Subscribe(a.base+"/replies/+", 1, func(_ paho.Client, m paho.Message) {
			var r map[string]any
			if json.Unmarshal(m.Payload(), &r) != nil {
				return
			}
			a.mu.Lock()
			a.replies[strings.TrimPrefix(m.Topic(), a.base+"/replies/")] = r
			a.mu.Unlock()
		})
	})
	a.c = paho.NewClient(opts)
	if tok := a.c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("app connect: %v", tok.Error())
	}
	t.Cleanup(func() { a.c.Disconnect(50) })
	return a
}

// send publishes a trigger of all_off, or of the app's scenes in turn,
// and reports whether the broker acknowledged it.
func (a *triggerApp) send(id string) bool {
	scene := "all_off"
	if len(a.scenes) > 0 {
		var n int
		_, _ = fmt.Sscanf(id, "chaos-%d", &n) // an id of another shape takes the first scene
		scene = a.scenes[n%len(a.scenes)]
	}
	payload := fmt.Sprintf(`{"scene":%q,"request_id":%q,"source":"chaos"}`, scene, id)
	tok := a.c.Publish(a.base+"/trigger", 1, false, payload)
	return tok.WaitTimeout(2*time.Second) && tok.Error() == nil
}

// flow publishes a new trigger at every tick until halt.
func (a *triggerApp) flow(every time.Duration) {
	a.stop, a.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(a.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-a.stop:
				return
			case <-tick.C:
			}
			if id := fmt.Sprintf("chaos-%05d", i); a.send(id) {
				a.mu.Lock()
				a.acked = append(a.acked, id)
				a.mu.Unlock()
			}
		}
	}()
}

// halt stops the flow and returns the request IDs the broker
// acknowledged.
func (a *triggerApp) halt() []string {
	close(a.stop)
	<-a.done
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.acked...)
}

func (a *triggerApp) reply(id string) map[string]any {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.replies[id]
}

// answerAll waits up to 15 s for a reply to each of ids, then sends the
// unanswered ones again, every 500 ms for up to 10 s, and returns those
// it sent again.
func (a *triggerApp) answerAll(ids []string) (resent []string) {
	unanswered := func() (missing []string) {
		for _, id := range ids {
			if a.reply(id) == nil {
				missing = append(missing, id)
			}
		}
		return missing
	}
	for deadline := time.Now().Add(15 * time.Second); len(unanswered()) > 0 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond) // replies arrive by subscription
	}
	resent = unanswered()
	for round := 0; round < 20 && len(unanswered()) > 0; round++ {
		for _, id := range unanswered() {
			a.send(id)
		}
		time.Sleep(500 * time.Millisecond) // replies arrive by subscription; this paces the resends
	}
	return resent
}

// missionsByRequest counts the agent's missions by request ID, and
// those not ended.
func (e *testEnv) missionsByRequest() (perRequest map[string]int, live int) {
	perRequest = map[string]int{}
	for cursor := ""; ; {
		var page api.MissionList
		e.get("/api/missions?limit=1000&cursor="+cursor, &page)
		for _, m := range page.Missions {
			perRequest[m.RequestID]++
			if !m.State.Terminal() {
				live++
			}
		}
		if cursor = page.NextCursor; cursor == "" {
			return perRequest, live
		}
	}
}
