package simulator

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/broker"
	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/devices/wire"
)

func TestDemoHomeParses(t *testing.T) {
	cfg, err := LoadHome("../configs/home.toml")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"living-light": TypeLight, "kitchen-light": TypeLight, "bedroom-light": TypeLight,
		"living-ac": TypeAC, "living-speaker": TypeSpeaker, "front-door": TypeLock, "bedroom-curtain": TypeCurtain,
	}
	if len(cfg.Devices) != len(want) {
		t.Fatalf("%d devices, want %d", len(cfg.Devices), len(want))
	}
	for _, d := range cfg.Devices {
		if want[d.ID] != d.Type {
			t.Errorf("device %s is a %s, want %s", d.ID, d.Type, want[d.ID])
		}
		if d.Type == TypeCurtain && d.Travel != 2*time.Second {
			t.Errorf("curtain travel %v, want 2s", d.Travel)
		}
		if d.Faults.Jammed {
			t.Errorf("%s jammed by default", d.ID)
		}
	}
	if cfg.Seed != 42 || cfg.Prefix != wire.DefaultPrefix || cfg.Broker != "" {
		t.Fatalf("seed %d prefix %q broker %q", cfg.Seed, cfg.Prefix, cfg.Broker)
	}
}

func TestParseHomeFull(t *testing.T) {
	cfg, err := ParseHome("h.toml", []byte(`
broker = "tcp://127.0.0.1:1883"
prefix = "home/a"
seed = -9223372036854775808
[[device]]
id = "c"
type = "curtain"
travel = "1.5s"
state = { position = 40.0 }
[device.faults]
ack_loss = 0.5
ack_delay = "20ms"
ack_jitter = "5ms"
duplicate_ack = 0.1
busy = 0.2
wrong_state = 0.3
reject = "unsupported"
offline_every = "1m"
offline_for = "10s"
`))
	if err != nil {
		t.Fatal(err)
	}
	want := Faults{AckLoss: 0.5, AckDelay: 20 * time.Millisecond, AckJitter: 5 * time.Millisecond,
		DuplicateAck: 0.1, Busy: 0.2, WrongState: 0.3, Reject: "unsupported",
		OfflineEvery: time.Minute, OfflineFor: 10 * time.Second}
	d := cfg.Devices[0]
	if d.Faults != want || d.Travel != 1500*time.Millisecond || cfg.Seed != -1<<63 {
		t.Fatalf("config %+v", cfg)
	}
	cfg.Broker = "tcp://127.0.0.1:1"
	h, err := NewHome(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := h.Device("c").State()["position"]; got != 40 {
		t.Fatalf("initial position %v (%T), want 40", got, got)
	}
}

func TestParseHomeErrors(t *testing.T) {
	const dev = "[[device]]\nid = \"d\"\ntype = \"light\"\n"
	for _, c := range []struct {
		name, toml string
		device     string // device the error must name
		field      string // field the error must name
	}{
		{"syntax", "seed = ", "", "seed"},
		{"unknown top key", "colour = 1\n" + dev, "", "colour"},
		{"unknown device key", dev + "colour = 1\n", "d", "device.colour"},
		{"unknown fault key", dev + "[device.faults]\nack_los = 0.1\n", "d", "device.faults.ack_los"},
		{"no devices", "seed = 1\n", "", "device"},
		{"unknown type", "[[device]]\nid = \"d\"\ntype = \"toaster\"\n", "d", "type"},
		{"id with slash", "[[device]]\nid = \"a/b\"\ntype = \"light\"\n", "a/b", "id"},
		{"id with plus", "[[device]]\nid = \"a+\"\ntype = \"light\"\n", "a+", "id"},
		{"id with hash", "[[device]]\nid = \"#\"\ntype = \"light\"\n", "#", "id"},
		{"empty id", "[[device]]\ntype = \"light\"\n", "", "device[0].id"},
		{"duplicate id", dev + dev, "d", "id"},
		{"ack_loss > 1", dev + "[device.faults]\nack_loss = 1.5\n", "d", "faults.ack_loss"},
		{"ack_loss wrong type", dev + "[device.faults]\nack_loss = \"often\"\n", "", "ack_loss"},
		{"negative delay", dev + "[device.faults]\nack_delay = \"-1s\"\n", "d", "faults.ack_delay"},
		{"bad duration", dev + "[device.faults]\nack_delay = \"soon\"\n", "", "ack_delay"},
		{"retryable reject", dev + "[device.faults]\nreject = \"busy\"\n", "d", "faults.reject"},
		{"jammed light", dev + "[device.faults]\njammed = true\n", "d", "faults.jammed"},
		{"outage without length", dev + "[device.faults]\noffline_every = \"1m\"\n", "d", "faults.offline_for"},
		{"travel on a light", dev + "travel = \"1s\"\n", "d", "travel"},
		{"state key", dev + "[device.state]\nhue = 3\n", "d", "hue"},
		{"state range", dev + "[device.state]\nbrightness = 101\n", "d", "brightness"},
		{"state fraction", dev + "[device.state]\nbrightness = 50.5\n", "d", "brightness"},
		{"state string for int", dev + "[device.state]\nbrightness = \"50\"\n", "d", "brightness"},
		{"curtain moving", "[[device]]\nid = \"c\"\ntype = \"curtain\"\n[device.state]\nmoving = true\n", "c", "moving"},
		{"broker scheme", "broker = \"http://x:1\"\n" + dev, "", "broker"},
		{"broker no host", "broker = \"tcp://\"\n" + dev, "", "broker"},
		{"prefix wildcard", "prefix = \"a/#\"\n" + dev, "", "prefix"},
		{"prefix empty level", "prefix = \"a//b\"\n" + dev, "", "prefix"},
		{"seed too big", "seed = 18446744073709551615\n" + dev, "", "seed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseHome("home.toml", []byte(c.toml))
			if err == nil {
				t.Fatal("no error")
			}
			msg := err.Error()
			if !errors.Is(err, ErrConfig) {
				t.Errorf("%v: not ErrConfig", err)
			}
			if !strings.HasPrefix(msg, "home.toml: ") {
				t.Errorf("%q does not name the file", msg)
			}
			if c.device != "" && !strings.Contains(msg, `device "`+c.device+`"`) {
				t.Errorf("%q does not name device %q", msg, c.device)
			}
			if !strings.Contains(msg, c.field) {
				t.Errorf("%q does not name field %q", msg, c.field)
			}
		})
	}
}

func TestNewHomeNeedsBroker(t *testing.T) {
	_, err := NewHome(HomeConfig{Devices: []DeviceConfig{{ID: "d", Type: TypeLight}}})
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "broker" {
		t.Fatalf("error %v, want one on broker", err)
	}
}

func TestHomeLifecycle(t *testing.T) {
	b := brokertest.Start(t)
	a := newAgent(t, b)
	h := startHome(t, b, DeviceConfig{ID: "d", Type: TypeLight})
	if err := h.Start(t.Context()); err == nil {
		t.Fatal("second Start: want error")
	}
	if h.Device("nope") != nil || len(h.Devices()) != 1 || h.Prefix() != wire.DefaultPrefix {
		t.Fatal("lookup")
	}
	if err := h.SetFaults("nope", Faults{}); !errors.Is(err, ErrUnknownDevice) {
		t.Fatalf("SetFaults on unknown device: %v", err)
	}
	if err := h.SetFaults("d", Faults{Jammed: true}); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), `device "d"`) {
		t.Fatalf("jamming a light: %v", err)
	}
	a.awaitAvail("d", wire.Online)
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	// A clean shutdown suppresses the last will, so the device says it.
	a.awaitAvail("d", wire.Offline)
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if err := h.Start(t.Context()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Start after Close: %v", err)
	}
}

func TestHomeReconnectsAfterBrokerRestart(t *testing.T) {
	b := brokertest.Start(t)
	addr := b.Addr()
	h := startHome(t, b, DeviceConfig{ID: "d", Type: TypeLight})
	d := h.Device("d")
	_ = b.Close()
	b2, err := broker.Start(broker.Options{Addr: addr})
	if err != nil {
		t.Skipf("port %s not reusable at once: %v", addr, err)
	}
	t.Cleanup(func() { _ = b2.Close() })
	a := newAgent(t, b2)
	a.awaitAvail("d", wire.Online)
	if err := d.WaitOnline(t.Context()); err != nil {
		t.Fatal(err)
	}
	wantOK(t, a.call("d", "x", "turn_on", ""))
}
