package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/hub"
	"github.com/sortie-edge/sortie/internal/cli"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/uplink"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "hub.toml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestShippedConfigValidates(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"validate", "-config", "../../configs/hub.toml"}, nil, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	cfg, err := LoadConfig("../../configs/hub.toml")
	if err != nil {
		t.Fatal(err)
	}
	want := DefaultConfig()
	want.DataDir, want.Gateways, want.HTTP.Token, want.dir = cfg.DataDir, cfg.Gateways, cfg.HTTP.Token, cfg.dir
	if got, _ := json.Marshal(cfg); string(got) != string(mustMarshal(t, want)) {
		t.Errorf("shipped config differs from the defaults beyond the demo values:\n got %s\nwant %s", got, mustMarshal(t, want))
	}
}

// TestValidateReadsTheClusterSecrets: a secret file run would fail to
// read is named by validate, not found only at start.
func TestValidateReadsTheClusterSecrets(t *testing.T) {
	base := "[http]\ntoken = \"0123456789abcdef0123\"\n[cluster]\nenabled = true\nnats = \"nats://n1:4222\"\n"
	for _, tc := range []struct{ name, body, want string }{
		{"nats password file missing", base + "nats_password_file = \"nope.secret\"\npostgres = \"postgres://h/db\"\n", "cluster.nats_password_file"},
		{"postgres file missing", base + "nats_password = \"x\"\npostgres_file = \"nope.dsn\"\n", "cluster.postgres_file"},
		{"everything there", base + "nats_password = \"x\"\npostgres = \"postgres://h/db\"\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(context.Background(), []string{"validate", "-config", writeConfig(t, tc.body)}, nil, &out, &errb)
			switch {
			case tc.want == "" && code != 0:
				t.Fatalf("exit %d: %s", code, errb.String())
			case tc.want != "" && (code == 0 || !strings.Contains(errb.String(), tc.want)):
				t.Fatalf("exit %d, stderr %q; want a failure naming %s", code, errb.String(), tc.want)
			}
		})
	}
}

func mustMarshal(t *testing.T, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestConfigErrors(t *testing.T) {
	h, err := hub.HashPassword("password1")
	if err != nil {
		t.Fatal(err)
	}
	gw := "\n[gateways]\nhome = \"" + h + "\"\n"
	cases := []struct{ name, body, field string }{
		{"unknown key", "nope = 1\n" + gw, "nope"},
		{"unknown nested key", "[http]\nlisten = \"127.0.0.1:1\"\nport = 3\n" + gw, "http.port"},
		{"plain password", "[gateways]\nhome = \"secret\"\n", "gateways.home"},
		{"no gateways", "", "gateways"},
		{"bad gateway id", "[gateways]\n\"a/b\" = \"" + h + "\"\n", "gateways.a/b"},
		{"gateway named like the hub", "[gateways]\nhub = \"" + h + "\"\n", "gateways.hub"},
		{"external without url", "[broker]\nembedded = false\n" + gw, "broker.url"},
		{"external without password", "[broker]\nembedded = false\nurl = \"tcp://x:1883\"\n" + gw, "identity.password"},
		{"cert without key", "[broker]\ncert_file = \"c.pem\"\n" + gw, "broker.cert_file"},
		{"bad listen", "[http]\nlisten = \"8090\"\n" + gw, "http.listen"},
		{"bad level", "[log]\nlevel = \"loud\"\n" + gw, "log.level"},
		{"bad prefix", "prefix = \"a/#\"\n" + gw, "prefix"},
		{"bad duration", "[http]\ncontrol_timeout = \"soon\"\n" + gw, ""},
		{"control_resend in its old place", "[cluster]\ncontrol_resend = \"1s\"\n" + gw, "cluster.control_resend"},
		{"control resent no sooner than it times out", "[http]\ncontrol_timeout = \"2s\"\ncontrol_resend = \"2s\"\n" + gw, "http.control_resend"},
		{"offline after less than a second", "[presence]\noffline_after = \"500ms\"\n" + gw, "presence.offline_after"},
		{"cluster without nats", "[cluster]\nenabled = true\n", "cluster.nats"},
		{"cluster with a broker URL for nats", "[cluster]\nenabled = true\nnats = \"tcp://n1:1883\"\n", "cluster.nats"},
		{"cluster without a password", "[cluster]\nenabled = true\nnats = \"nats://n1:4222\"\n", "cluster.nats_user"},
		{"cluster without postgres", "[cluster]\nenabled = true\nnats = \"nats://n1:4222\"\nnats_password = \"x\"\n", "cluster.postgres"},
		{"cluster fetching more than it may hold", "[cluster]\nenabled = true\nnats = \"nats://n1:4222\"\nnats_password = \"x\"\npostgres = \"postgres://h/db\"\nfetch = 9000\n", "cluster.fetch"},
		{"cluster with 2 replicas", "[cluster]\nenabled = true\nnats = \"nats://n1:4222\"\nnats_password = \"x\"\npostgres = \"postgres://h/db\"\nreplicas = 2\n", "cluster.replicas"},
		{"cluster filled in but not enabled", "[cluster]\nnats = \"nats://n1:4222\"\nnats_password = \"x\"\npostgres = \"postgres://h/db\"\n", "cluster.enabled"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := writeConfig(t, tc.body)
			cfg, err := LoadConfig(p)
			if err == nil {
				err = cfg.Validate(p)
			}
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("err = %v, want a ConfigError", err)
			}
			if tc.field != "" && ce.Field != tc.field {
				t.Fatalf("field %q, want %q (%v)", ce.Field, tc.field, err)
			}
		})
	}
}

func TestTokenSources(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("from-file-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.dir = dir
	cfg.HTTP.TokenFile = "token"
	if tok, err := cfg.token(); err != nil || tok != "from-file-0123456789" {
		t.Fatalf("token file: %q %v", tok, err)
	}
	t.Setenv(tokenEnv, "from-env-0123456789")
	if tok, err := cfg.token(); err != nil || tok != "from-env-0123456789" {
		t.Fatalf("token env: %q %v", tok, err)
	}
	t.Setenv(tokenEnv, "short")
	if _, err := cfg.token(); err == nil {
		t.Fatal("short token accepted")
	}
}

func TestPasswd(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"passwd", "home"}, strings.NewReader("a-long-password\n"), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if strings.Contains(out.String()+errb.String(), "a-long-password") {
		t.Fatal("passwd echoed the password")
	}
	p := writeConfig(t, "[gateways]\n"+out.String())
	cfg, err := LoadConfig(p)
	if err != nil || cfg.Validate(p) != nil {
		t.Fatalf("passwd output is not a valid [gateways] line: %q (%v)", out.String(), err)
	}
	out.Reset()
	if code := run(context.Background(), []string{"passwd", "-generate", "home"}, nil, &out, &errb); code != 0 || !strings.Contains(out.String(), "# password for gateway home") {
		t.Fatalf("generate: exit %d %q", code, out.String())
	}
	for _, args := range [][]string{{"passwd"}, {"passwd", "a/b"}, {"frobnicate"}} {
		if code := run(context.Background(), args, strings.NewReader("x\n"), &out, &errb); code != cli.ExitUsage {
			t.Errorf("%v: exit %d, want %d", args, code, cli.ExitUsage)
		}
	}
	if code := run(context.Background(), []string{"passwd", "home"}, strings.NewReader("short\n"), &out, &errb); code != 1 {
		t.Errorf("short password: exit %d, want 1", code)
	}
}

func TestVersion(t *testing.T) {
	var out bytes.Buffer
	if code := run(context.Background(), []string{"version"}, nil, &out, &out); code != 0 || !strings.Contains(out.String(), Version) {
		t.Fatalf("version: %d %q", code, out.String())
	}
}

// TestRun starts the whole hub from a config file with flags, drives it
// with a gateway over MQTT and the API over HTTP, then stops it.
// runningHub is "hub run" in this process, on ports of its own.
type runningHub struct {
	http, broker string
	cancel       func()
	done         chan int
	logs         *testkit.SyncBuffer
}

// startHub runs the hub with config p until the test ends.
func startHub(t *testing.T, p string) *runningHub {
	t.Helper()
	type addrs struct{ http, broker string }
	ready := make(chan addrs, 1)
	onListening = func(h, b string) { ready <- addrs{h, b} }
	t.Cleanup(func() { onListening = nil })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	h := &runningHub{cancel: cancel, done: make(chan int, 1), logs: &testkit.SyncBuffer{}}
	go func() {
		h.done <- run(ctx, []string{"run", "-config", p, "-http", "127.0.0.1:0", "-broker-listen", "127.0.0.1:0", "-log-format", "json"}, nil, h.logs, h.logs)
	}()
	select {
	case a := <-ready:
		h.http, h.broker = a.http, a.broker
	case code := <-h.done:
		t.Fatalf("hub exited %d: %s", code, h.logs.String())
	case <-time.After(10 * time.Second):
		t.Fatal("hub did not start")
	}
	return h
}

func TestRun(t *testing.T) {
	h, err := hub.HashPassword("gateway-password")
	if err != nil {
		t.Fatal(err)
	}
	p := writeConfig(t, "data_dir = \"data\"\n[http]\ntoken = \"0123456789abcdef\"\n[log]\nlevel = \"warn\"\n[gateways]\nhome = \""+h+"\"\n")
	rh := startHub(t, p)
	a, cancel, done, logs := rh, rh.cancel, rh.done, rh.logs

	acks := make(chan uplink.Ack, 4)
	tp := uplink.Topics{}
	opts := paho.NewClientOptions().AddBroker("tcp://" + a.broker).SetClientID("gw-home").SetUsername("home").SetPassword("gateway-password").SetOrderMatters(false)
	c := paho.NewClient(opts)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("gateway connect: %v", tok.Error())
	}
	defer c.Disconnect(0)
	if tok := c.Subscribe(tp.Ack("home"), 1, func(_ paho.Client, m paho.Message) {
		if ack, err := uplink.DecodeAck(m.Payload()); err == nil {
			acks <- ack
		}
	}); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	now := time.Now()
	b, _ := json.Marshal(uplink.Batch{Gateway: "home", Entries: []uplink.Entry{{
		Seq: 7, Event: driver.Event{MissionID: "m1", Seq: 1, To: driver.StatePending, Time: now},
		Mission: driver.Summary{Scene: "go_home", State: driver.StatePending, Created: now},
	}}})
	if tok := c.Publish(tp.Events("home"), 1, false, b); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}
	select {
	case ack := <-acks:
		if ack.Upto != 7 {
			t.Fatalf("ack %+v, want upto 7", ack)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no ack")
	}
	req, _ := http.NewRequest("GET", "http://"+a.http+"/api/missions?gateway=home", nil)
	req.Header.Set("Authorization", "Bearer 0123456789abcdef")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var page struct{ Missions []hub.Mission }
	err = json.NewDecoder(res.Body).Decode(&page)
	_ = res.Body.Close() // read-only: the decode error is the one that matters
	if err != nil || len(page.Missions) != 1 || page.Missions[0].ID != "m1" {
		t.Fatalf("missions %+v (%v)", page, err)
	}

	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d: %s", code, logs.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("hub did not stop")
	}
	if strings.Contains(logs.String(), "gateway-password") || strings.Contains(logs.String(), "0123456789abcdef") {
		t.Fatal("a secret reached the logs")
	}
}

// TestStartingHubAnswersWhy: while the store is awaited, /healthz is a
// 503 saying what the hub waits for (the error itself to a request with
// the token only), and the API a JSON error, never a refused connection
// or a plain-text page.
func TestStartingHubAnswersWhy(t *testing.T) {
	front := &starting{token: "0123456789abcdef0123"}
	front.wait("waiting for PostgreSQL: connection refused")
	for _, tc := range []struct{ path, want string }{
		{"/healthz", `"status":"starting"`},
		{"/readyz", `"status":"store_unavailable"`},
		{"/api/gateways", `"code":"starting"`},
	} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", tc.path, nil)
		req.Header.Set("Authorization", "Bearer 0123456789abcdef0123")
		front.ServeHTTP(rec, req)
		if body := rec.Body.String(); rec.Code != http.StatusServiceUnavailable || !strings.Contains(body, tc.want) || !strings.Contains(body, "waiting for PostgreSQL") {
			t.Errorf("%s while starting: %d %s", tc.path, rec.Code, body)
		}
	}
	rec := httptest.NewRecorder()
	front.ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	if strings.Contains(rec.Body.String(), "PostgreSQL") {
		t.Errorf("without the token the error is shown: %s", rec.Body.String())
	}
}

// TestHubListensWhileWaitingForPostgreSQL: a replica whose database is
// not up yet answers /healthz with a 503 saying so, rather than refusing
// connections, and a stop while it waits is a clean exit.
func TestHubListensWhileWaitingForPostgreSQL(t *testing.T) {
	addr := testkit.FreeAddr(t) // serve binds it; a race with another process fails below
	cfg := DefaultConfig()
	cfg.HTTP.Listen, cfg.HTTP.Token = addr, "0123456789abcdef0123"
	cfg.Cluster.Enabled, cfg.Cluster.NATS, cfg.Cluster.NATSPassword = true, "nats://127.0.0.1:1", "x"
	cfg.Cluster.Postgres = "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, slog.New(slog.DiscardHandler)) }()
	var body string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) { // polled: the listener has no event a test can await
		req, _ := http.NewRequest("GET", "http://"+addr+"/healthz", nil)
		req.Header.Set("Authorization", "Bearer "+cfg.HTTP.Token)
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			b, _ := io.ReadAll(res.Body)
			_ = res.Body.Close()
			body = string(b)
			if res.StatusCode == http.StatusServiceUnavailable && strings.Contains(body, "waiting for PostgreSQL") {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no 503 saying it waits for PostgreSQL: %v %s", err, body)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("stopped while waiting: %v, want a clean exit", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the hub did not stop")
	}
}
