package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/passwd"
)

func testHash(t *testing.T, pw string) string {
	t.Helper()
	h, err := passwd.HashCost(pw, 1000)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestBrokerAuthRoles(t *testing.T) {
	b := BrokerConfig{Prefix: "sortie", Users: []BrokerUser{
		{Name: "voice", Role: roleApp, PasswordHash: testHash(t, "voice-password")},
		{Name: "living-light", Role: roleDevice, PasswordHash: testHash(t, "light-password")},
		{Name: "ops", Role: roleAdmin, PasswordHash: testHash(t, "ops-password")},
	}}
	a, internal, err := newBrokerAuth(b, "home")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		user, topic string
		write, want bool
	}{
		{"voice", "sortie/gateways/home/trigger", true, true},
		{"voice", "sortie/gateways/other/trigger", true, false},
		{"voice", "sortie/gateways/home/replies/r1", true, false},
		{"voice", "sortie/devices/living-light/cmd", true, false},
		{"voice", "sortie/gateways/home/replies/#", false, true},
		{"voice", "sortie/gateways/home/replies/r1", false, true},
		{"voice", "sortie/gateways/home/missions/+/events", false, true},
		{"voice", "sortie/gateways/home/#", false, false},
		{"voice", "sortie/gateways/home/trigger", false, false},
		{"voice", "sortie/devices/+/state", false, true},
		{"voice", "sortie/devices/front-door/availability", false, true},
		{"voice", "sortie/devices/+/cmd", false, false},
		{"voice", "sortie/devices/#", false, false},
		{"voice", "#", false, false},
		{"living-light", "sortie/devices/living-light/ack", true, true},
		{"living-light", "sortie/devices/living-light/state", true, true},
		{"living-light", "sortie/devices/living-light/availability", true, true},
		{"living-light", "sortie/devices/kitchen-light/state", true, false},
		{"living-light", "sortie/devices/living-light/cmd", true, false},
		{"living-light", "sortie/gateways/home/trigger", true, false},
		{"living-light", "sortie/devices/living-light/cmd", false, true},
		{"living-light", "sortie/devices/+/cmd", false, false},
		{"living-light", "sortie/devices/kitchen-light/cmd", false, false},
		{"ops", "sortie/devices/kitchen-light/cmd", true, true},
		{"ops", "#", false, true},
		{internalUser, "sortie/devices/kitchen-light/state", true, true},
		{"stranger", "sortie/gateways/home/trigger", true, false},
		{"", "sortie/gateways/home/replies/#", false, false},
	} {
		if got := a.may(c.user, c.topic, c.write); got != c.want {
			t.Errorf("%s %s (write %v): %v, want %v", c.user, c.topic, c.write, got, c.want)
		}
	}
	if internal == "" || len(internal) < 16 {
		t.Errorf("internal password %q is too short", internal)
	}
}

func TestBrokerUsersValidated(t *testing.T) {
	good := testHash(t, "a-good-password")
	for _, c := range []struct {
		users []BrokerUser
		field string
	}{
		{[]BrokerUser{{Name: "voice", Role: "guest", PasswordHash: good}}, "broker.users[0].role"},
		{[]BrokerUser{{Name: "voice", Role: roleApp, PasswordHash: "plain"}}, "broker.users[0].password_hash"},
		{[]BrokerUser{{Name: "a/b", Role: roleDevice, PasswordHash: good}}, "broker.users[0].name"},
		{[]BrokerUser{{Name: "", Role: roleApp, PasswordHash: good}}, "broker.users[0].name"},
		{[]BrokerUser{{Name: "v", Role: roleApp, PasswordHash: good}, {Name: "v", Role: roleAdmin, PasswordHash: good}}, "broker.users[1].name"},
		{[]BrokerUser{{Name: internalUser, Role: roleAdmin, PasswordHash: good}}, "broker.users[0].name"},
	} {
		cfg := DefaultConfig()
		cfg.Broker.Users = c.users
		err := cfg.Validate("agent.toml")
		if err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%+v: %v, want an error naming %s", c.users, err, c.field)
		}
	}
	cfg := DefaultConfig()
	cfg.Broker.Embedded, cfg.Broker.URL = false, "tcp://127.0.0.1:1883"
	cfg.Broker.Users = []BrokerUser{{Name: "voice", Role: roleApp, PasswordHash: good}}
	if err := cfg.Validate("agent.toml"); err == nil || !strings.Contains(err.Error(), "broker.users") {
		t.Errorf("users with an external broker: %v", err)
	}
}

// With users, the embedded broker lets in only them, each to its role's
// topics, while the agent and its simulated home, which log in as the
// agent's own internal user, work as before.
func TestEmbeddedBrokerUsers(t *testing.T) {
	e := newBareEnv(t, "sec")
	e.writeConfig("embedded = true\nlisten = \"127.0.0.1:0\"\n", fmt.Sprintf(`[simulator]
home = %q
[[broker.users]]
name = "voice"
role = "app"
password_hash = %q
[[broker.users]]
name = "living-light"
role = "device"
password_hash = %q
[[broker.users]]
name = "ops"
role = "admin"
password_hash = %q
`, repoPath(t, "configs/home.toml"), testHash(t, "voice-password"), testHash(t, "light-password"), testHash(t, "ops-password")))
	p := e.start()
	p.mu.Lock()
	url := "tcp://" + p.broker
	p.mu.Unlock()

	lost := make(chan string, 4)
	login := func(id, user, pw string) (paho.Client, error) {
		o := paho.NewClientOptions().AddBroker(url).SetClientID(id).SetAutoReconnect(false).SetConnectRetry(false).
			SetConnectionLostHandler(func(paho.Client, error) { lost <- id })
		if user != "" {
			o.SetUsername(user).SetPassword(pw)
		}
		c := paho.NewClient(o)
		tok := c.Connect()
		if !tok.WaitTimeout(5 * time.Second) {
			t.Fatalf("%s: connect timed out", id)
		}
		if tok.Error() == nil {
			t.Cleanup(func() { c.Disconnect(50) })
		}
		return c, tok.Error()
	}
	for _, c := range []struct{ name, user, pw string }{
		{"anonymous", "", ""}, {"wrong password", "voice", "light-password"}, {"unknown user", "guest", "voice-password"},
		{"the agent's own name", internalUser, "voice-password"},
	} {
		if _, err := login("t-"+strings.ReplaceAll(c.name, " ", "-"), c.user, c.pw); err == nil {
			t.Errorf("%s: connected", c.name)
		}
	}

	subscribe := func(c paho.Client, filter string, h paho.MessageHandler) byte {
		tok := c.Subscribe(filter, 1, h)
		if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Fatalf("subscribe %s: %v", filter, tok.Error())
		}
		return tok.(*paho.SubscribeToken).Result()[filter]
	}
	const refused = 0x80

	// An app runs a scene and follows it; the simulated home, logged in
	// as the agent, carries it out.
	voice, err := login("t-voice", "voice", "voice-password")
	if err != nil {
		t.Fatal(err)
	}
	replies, events := make(chan string, 8), make(chan string, 64)
	if code := subscribe(voice, "sortie/gateways/sec/replies/#", func(_ paho.Client, m paho.Message) { replies <- string(m.Payload()) }); code == refused {
		t.Fatal("the app may not read replies")
	}
	if code := subscribe(voice, "sortie/gateways/sec/missions/+/events", func(_ paho.Client, m paho.Message) { events <- string(m.Payload()) }); code == refused {
		t.Fatal("the app may not read events")
	}
	if code := subscribe(voice, "sortie/devices/living-light/cmd", nil); code != refused {
		t.Errorf("the app may read a device's commands (SUBACK %#x)", code)
	}
	if tok := voice.Publish("sortie/gateways/sec/trigger", 1, false, `{"scene":"go_home","request_id":"sec-1"}`); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("trigger: %v", tok.Error())
	}
	select {
	case r := <-replies:
		if !strings.Contains(r, `"accepted"`) {
			t.Fatalf("reply %s, want accepted", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no reply to the app's trigger")
	}
	deadline := time.After(30 * time.Second)
	for done := false; !done; {
		select {
		case ev := <-events:
			done = strings.Contains(ev, `"to":"`+string(driver.StateSucceeded)+`"`)
		case <-deadline:
			t.Fatalf("go_home did not succeed\n%s", p.log())
		}
	}

	// A device reads its own commands and no one else's.
	light, err := login("t-light", "living-light", "light-password")
	if err != nil {
		t.Fatal(err)
	}
	cmds := make(chan string, 8)
	if code := subscribe(light, "sortie/devices/living-light/cmd", func(_ paho.Client, m paho.Message) { cmds <- string(m.Payload()) }); code == refused {
		t.Fatal("a device may not read its own commands")
	}
	if code := subscribe(light, "sortie/devices/+/cmd", nil); code != refused {
		t.Errorf("a device may read every device's commands (SUBACK %#x)", code)
	}

	// An app that publishes a command is cut off, and the command goes
	// nowhere: the first command the device then gets is the admin's.
	voice.Publish("sortie/devices/living-light/cmd", 1, false, "from the app")
	select {
	case id := <-lost:
		if id != "t-voice" {
			t.Fatalf("%s lost its connection, want t-voice", id)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the broker kept an app that published a device command")
	}
	ops, err := login("t-ops", "ops", "ops-password")
	if err != nil {
		t.Fatal(err)
	}
	if tok := ops.Publish("sortie/devices/living-light/cmd", 1, false, "from ops"); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("admin publish: %v", tok.Error())
	}
	select {
	case got := <-cmds:
		if got != "from ops" {
			t.Errorf("the device got %q first, want the admin's command", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the admin's command did not reach the device")
	}
}
