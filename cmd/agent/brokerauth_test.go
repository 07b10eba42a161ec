package main

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/agent/agentconf"
	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/broker/passwd"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/testkit"
)

func testHash(t *testing.T, pw string) string {
	t.Helper()
	h, err := passwd.HashCost(pw, 1000)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestBrokerUsersValidated(t *testing.T) {
	good := testHash(t, "a-good-password")
	for _, c := range []struct {
		users []BrokerUser
		field string
	}{
		{[]BrokerUser{{Name: "voice", Role: "guest", PasswordHash: good}}, "broker.users[0].role"},
		{[]BrokerUser{{Name: "voice", Role: agent.RoleApp, PasswordHash: "plain"}}, "broker.users[0].password_hash"},
		{[]BrokerUser{{Name: "a/b", Role: agent.RoleDevice, PasswordHash: good}}, "broker.users[0].name"},
		{[]BrokerUser{{Name: "", Role: agent.RoleApp, PasswordHash: good}}, "broker.users[0].name"},
		{[]BrokerUser{{Name: "v", Role: agent.RoleApp, PasswordHash: good}, {Name: "v", Role: agent.RoleAdmin, PasswordHash: good}}, "broker.users[1].name"},
		{[]BrokerUser{{Name: agent.InternalUser, Role: agent.RoleAdmin, PasswordHash: good}}, "broker.users[0].name"},
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
	cfg.Broker.Users = []BrokerUser{{Name: "voice", Role: agent.RoleApp, PasswordHash: good}}
	cfg.Broker.ServerCertFile, cfg.Broker.ServerKeyFile = "broker.crt", "broker.key"
	err := cfg.Validate("agent.toml")
	for _, field := range []string{"broker.users", "broker.server_cert_file"} {
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s with an external broker: %v", field, err)
		}
	}
	cfg = DefaultConfig()
	cfg.Broker.ServerCertFile = "broker.crt"
	if err := cfg.Validate("agent.toml"); err == nil || !strings.Contains(err.Error(), "server_key_file go together") {
		t.Errorf("a certificate without its key: %v", err)
	}
}

// securedEnv starts the agent with its embedded broker, its simulated
// home and the users voice (app), living-light (device) and ops (admin),
// plus extra [broker] keys; it returns the broker's URL.
func securedEnv(t *testing.T, gw, extra string) (*testEnv, string) {
	t.Helper()
	e := newBareEnv(t, gw)
	e.writeConfig("embedded = true\nlisten = \"127.0.0.1:0\"\n"+extra, fmt.Sprintf(`[simulator]
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
`, testkit.RepoPath("configs/home.toml"), testHash(t, "voice-password"), testHash(t, "light-password"), testHash(t, "ops-password")))
	p := e.start()
	p.mu.Lock()
	defer p.mu.Unlock()
	scheme := "tcp://"
	if extra != "" {
		scheme = "ssl://"
	}
	return e, scheme + p.broker
}

// login connects a paho client, reporting on lost when the broker cuts
// it off.
func login(t *testing.T, url, id, user, pw string, tc *tls.Config, lost chan<- string) (paho.Client, error) {
	t.Helper()
	o := paho.NewClientOptions().AddBroker(url).SetClientID(id).SetAutoReconnect(false).SetConnectRetry(false).
		SetConnectTimeout(5 * time.Second).SetTLSConfig(tc).
		SetConnectionLostHandler(func(paho.Client, error) {
			if lost != nil {
				lost <- id
			}
		})
	if user != "" {
		o.SetUsername(user).SetPassword(pw)
	}
	c := paho.NewClient(o)
	tok := c.Connect()
	if !tok.WaitTimeout(10 * time.Second) {
		t.Fatalf("%s: connect timed out", id)
	}
	if tok.Error() == nil {
		t.Cleanup(func() { c.Disconnect(50) })
	}
	return c, tok.Error()
}

func subscribe(t *testing.T, c paho.Client, filter string, h paho.MessageHandler) byte {
	t.Helper()
	tok := c.Subscribe(filter, 1, h)
	if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe %s: %v", filter, tok.Error())
	}
	return tok.(*paho.SubscribeToken).Result()[filter]
}

// subRefused is the SUBACK code of a refused subscription.
const subRefused = 0x80

// runScene triggers scene as c and waits for its reply and SUCCEEDED.
func runScene(t *testing.T, c paho.Client, gw, scene, req string, log func() string) {
	t.Helper()
	base := "sortie/gateways/" + gw
	replies, events := make(chan string, 8), make(chan string, 64)
	if code := subscribe(t, c, base+"/replies/"+req, func(_ paho.Client, m paho.Message) { replies <- string(m.Payload()) }); code == subRefused {
		t.Fatal("the app may not read replies")
	}
	if code := subscribe(t, c, base+"/missions/+/events", func(_ paho.Client, m paho.Message) { events <- string(m.Payload()) }); code == subRefused {
		t.Fatal("the app may not read events")
	}
	if tok := c.Publish(base+"/trigger", 1, false, fmt.Sprintf(`{"scene":%q,"request_id":%q}`, scene, req)); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("trigger: %v", tok.Error())
	}
	r := testkit.Receive(t, replies, 10*time.Second, "no reply to the app's trigger")
	if !strings.Contains(r, `"accepted"`) {
		t.Fatalf("reply %s, want accepted", r)
	}
	deadline := time.After(30 * time.Second)
	for {
		select {
		case ev := <-events:
			if strings.Contains(ev, `"to":"`+string(driver.StateSucceeded)+`"`) {
				return
			}
		case <-deadline:
			t.Fatalf("%s did not succeed\n%s", scene, log())
		}
	}
}

// With users, the embedded broker lets in only them, each to its role's
// topics, while the agent and its simulated home, which log in as the
// agent's own internal user, work as before.
func TestEmbeddedBrokerUsers(t *testing.T) {
	e, url := securedEnv(t, "sec", "")
	lost := make(chan string, 4)
	for _, c := range []struct{ name, user, pw string }{
		{"anonymous", "", ""}, {"wrong password", "voice", "light-password"}, {"unknown user", "guest", "voice-password"},
		{"the agent's own name", agent.InternalUser, "voice-password"},
	} {
		if _, err := login(t, url, "t-"+strings.ReplaceAll(c.name, " ", "-"), c.user, c.pw, nil, nil); err == nil {
			t.Errorf("%s: connected", c.name)
		}
	}

	// An app runs a scene and follows it; the simulated home, logged in
	// as the agent, carries it out.
	voice, err := login(t, url, "t-voice", "voice", "voice-password", nil, lost)
	if err != nil {
		t.Fatal(err)
	}
	if code := subscribe(t, voice, "sortie/devices/living-light/cmd", nil); code != subRefused {
		t.Errorf("the app may read a device's commands (SUBACK %#x)", code)
	}
	runScene(t, voice, "sec", "go_home", "sec-1", e.proc.log)

	// A device reads its own commands and no one else's.
	light, err := login(t, url, "t-light", "living-light", "light-password", nil, lost)
	if err != nil {
		t.Fatal(err)
	}
	cmds := make(chan string, 8)
	if code := subscribe(t, light, "sortie/devices/living-light/cmd", func(_ paho.Client, m paho.Message) { cmds <- string(m.Payload()) }); code == subRefused {
		t.Fatal("a device may not read its own commands")
	}
	if code := subscribe(t, light, "sortie/devices/+/cmd", nil); code != subRefused {
		t.Errorf("a device may read every device's commands (SUBACK %#x)", code)
	}
	// No other user may take over its session by its client ID.
	if _, err := login(t, url, "t-light", "voice", "voice-password", nil, nil); err == nil {
		t.Error("an app took over a device's session by its client ID")
	}
	// Nor log in with a last will outside its role.
	o := paho.NewClientOptions().AddBroker(url).SetClientID("t-will").SetUsername("voice").SetPassword("voice-password").
		SetAutoReconnect(false).SetWill("sortie/devices/living-light/availability", "offline", 1, true)
	if tok := paho.NewClient(o).Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() == nil {
		t.Error("an app logged in with a last will on a device's availability")
	}

	// An app that publishes a command is cut off, and the command goes
	// nowhere: the first command the device then gets is the admin's.
	voice.Publish("sortie/devices/living-light/cmd", 1, false, "from the app")
	id := testkit.Receive(t, lost, 5*time.Second, "the broker kept an app that published a device command")
	if id != "t-voice" {
		t.Fatalf("%s lost its connection, want t-voice", id)
	}
	ops, err := login(t, url, "t-ops", "ops", "ops-password", nil, lost)
	if err != nil {
		t.Fatal(err)
	}
	if tok := ops.Publish("sortie/devices/living-light/cmd", 1, false, "from ops"); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("admin publish: %v", tok.Error())
	}
	got := testkit.Receive(t, cmds, 5*time.Second, "the admin's command did not reach the device")
	if got != "from ops" {
		t.Errorf("the device got %q first, want the admin's command", got)
	}
	// The same user may take its own session over, as a device that
	// restarted does.
	if _, err := login(t, url, "t-light", "living-light", "light-password", nil, nil); err != nil {
		t.Errorf("a device could not take its own session back: %v", err)
	}
}

// With a server certificate the embedded broker speaks only TLS; its
// simulated home, which trusts exactly that certificate, still carries
// out a scene for an app that verifies it.
func TestEmbeddedBrokerTLS(t *testing.T) {
	certFile, keyFile, pool := brokertest.SelfSigned(t, t.TempDir())
	e, url := securedEnv(t, "tls", fmt.Sprintf("server_cert_file = %q\nserver_key_file = %q\n", certFile, keyFile))
	if !strings.HasPrefix(url, "ssl://") {
		t.Fatalf("broker URL %s", url)
	}
	plain := "tcp://" + strings.TrimPrefix(url, "ssl://")
	if _, err := login(t, plain, "t-plain", "voice", "voice-password", nil, nil); err == nil {
		t.Error("connected without TLS")
	}
	if _, err := login(t, url, "t-untrusting", "voice", "voice-password", &tls.Config{MinVersion: tls.VersionTLS12}, nil); err == nil {
		t.Error("connected to a certificate the client does not trust")
	}
	voice, err := login(t, url, "t-voice", "voice", "voice-password", &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil)
	if err != nil {
		t.Fatal(err)
	}
	runScene(t, voice, "tls", "go_home", "tls-1", e.proc.log)
}

// A client ID belongs to one user at a time: a device's kept session
// (clean session off) cannot be taken by an app while the device is
// away, a user's own name is reserved to it as a client ID, and an ID
// whose clean session ended is free again.
func TestEmbeddedBrokerClientIDs(t *testing.T) {
	_, url := securedEnv(t, "ids", "")
	keep := func(id, user, pw string) (paho.Client, error) {
		o := paho.NewClientOptions().AddBroker(url).SetClientID(id).SetUsername(user).SetPassword(pw).
			SetCleanSession(false).SetAutoReconnect(false).SetConnectRetry(false)
		c := paho.NewClient(o)
		tok := c.Connect()
		if !tok.WaitTimeout(10 * time.Second) {
			t.Fatalf("%s: connect timed out", id)
		}
		return c, tok.Error()
	}
	dev, err := keep("lamp-1", "living-light", "light-password")
	if err != nil {
		t.Fatal(err)
	}
	if code := subscribe(t, dev, "sortie/devices/living-light/cmd", nil); code == subRefused {
		t.Fatal("subscribe refused")
	}
	dev.Disconnect(50)
	if c, err := keep("lamp-1", "voice", "voice-password"); err == nil {
		c.Disconnect(50)
		t.Fatal("an app took a device's kept session")
	}
	if c, err := keep("lamp-1", "living-light", "light-password"); err != nil {
		t.Errorf("the device could not come back to its session: %v", err)
	} else {
		c.Disconnect(50)
	}

	for _, id := range []string{"living-light", "living-light.voice", "sortie-internal.1"} {
		if _, err := login(t, url, id, "voice", "voice-password", nil, nil); err == nil {
			t.Errorf("an app logged in with client ID %q, reserved to another user", id)
		}
	}
	if _, err := login(t, url, "living-light.2", "living-light", "light-password", nil, nil); err != nil {
		t.Errorf("a device could not use a client ID reserved to it: %v", err)
	}

	c, err := login(t, url, "shared-id", "voice", "voice-password", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Disconnect(50)
	// The broker releases the ID when it has handled the disconnection,
	// which the client does not wait for: try until it has.
	testkit.Until(t, 10*time.Second, func() error {
		if _, err := login(t, url, "shared-id", "ops", "ops-password", nil, nil); err != nil {
			return fmt.Errorf("a client ID whose clean session ended is still held: %w", err)
		}
		return nil
	})
}

func TestExposureWarnings(t *testing.T) {
	users := []BrokerUser{{Name: "voice", Role: agent.RoleApp}}
	for _, c := range []struct {
		b    agentconf.BrokerConfig
		h    agentconf.HTTPConfig
		want string
	}{
		{agentconf.BrokerConfig{Embedded: true, Listen: "127.0.0.1:1883"}, agentconf.HTTPConfig{}, ""},
		{agentconf.BrokerConfig{Embedded: true, Listen: "localhost:1883"}, agentconf.HTTPConfig{}, ""},
		{agentconf.BrokerConfig{Embedded: true, Listen: "[::1]:1883"}, agentconf.HTTPConfig{}, ""},
		{agentconf.BrokerConfig{Embedded: false, Listen: "0.0.0.0:1883"}, agentconf.HTTPConfig{}, ""},
		{agentconf.BrokerConfig{Embedded: true, Listen: "0.0.0.0:1883"}, agentconf.HTTPConfig{}, "no [[broker.users]]"},
		{agentconf.BrokerConfig{Embedded: true, Listen: ":1883"}, agentconf.HTTPConfig{}, "no [[broker.users]]"},
		{agentconf.BrokerConfig{Embedded: true, Listen: "192.168.1.2:1883", Users: users}, agentconf.HTTPConfig{}, "passwords cross"},
		{agentconf.BrokerConfig{Embedded: true, Listen: "192.168.1.2:8883", Users: users, ServerCertFile: "c.pem"}, agentconf.HTTPConfig{}, ""},
		{agentconf.BrokerConfig{}, agentconf.HTTPConfig{Listen: "0.0.0.0:8080", Token: "t"}, "token crosses"},
		{agentconf.BrokerConfig{}, agentconf.HTTPConfig{Listen: ":8080"}, "no token"},
		{agentconf.BrokerConfig{}, agentconf.HTTPConfig{Listen: "localhost:8080"}, ""},
		{agentconf.BrokerConfig{}, agentconf.HTTPConfig{Listen: "0.0.0.0:8443", TokenFile: "f", CertFile: "c.pem"}, ""},
		{agentconf.BrokerConfig{}, agentconf.HTTPConfig{Listen: "127.0.0.1:8080", Token: "t"}, ""},
	} {
		got := strings.Join(agentconf.ExposureWarnings(Config{Broker: c.b, HTTP: c.h}), "\n")
		if c.want == "" && got != "" || !strings.Contains(got, c.want) {
			t.Errorf("%+v %+v: %q, want %q", c.b, c.h, got, c.want)
		}
	}
}

// With a certificate the API is HTTPS only; the command line, given the
// agent's config, trusts exactly that certificate.
func TestHTTPAPIOverTLS(t *testing.T) {
	certFile, keyFile, pool := brokertest.SelfSigned(t, t.TempDir())
	e := newBareEnv(t, "https")
	e.writeConfig("embedded = true\nlisten = \"127.0.0.1:0\"\n", fmt.Sprintf("[simulator]\nhome = %q\n", testkit.RepoPath("configs/home.toml")))
	cfg, err := os.ReadFile(e.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	// The API's address is fixed here: the command line reads it from the
	// config, which cannot say ":0".
	addr := testkit.FreeAddr(t)
	cfgText := strings.Replace(string(cfg), "[http]\nlisten = \"127.0.0.1:0\"\n",
		fmt.Sprintf("[http]\nlisten = %q\ntoken = \"api-token-1\"\ncert_file = %q\nkey_file = %q\n", addr, certFile, keyFile), 1)
	if err := os.WriteFile(e.cfgPath, []byte(cfgText), 0o600); err != nil {
		t.Fatal(err)
	}
	e.start()

	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	resp, err := client.Get("https://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close() // only the status matters
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz over TLS: %s", resp.Status)
	}
	if resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + addr + "/healthz"); err == nil {
		_ = resp.Body.Close() // only the status matters
		if resp.StatusCode == http.StatusOK {
			t.Error("the API answered plain HTTP")
		}
	}
	out, err := exec.Command(agentBin, "devices", "-config", e.cfgPath).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "living-light") {
		t.Fatalf("agent devices -config over TLS: %v\n%s", err, out)
	}
}
