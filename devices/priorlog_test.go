package devices_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/simulator"
)

func TestPriorLogSurvivesReopenAndATornLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "priors.log")
	l, err := devices.OpenPriorLog(path, 4)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Put("cmd-1", map[string]any{"power": "on", "brightness": int64(30)}); err != nil {
		t.Fatal(err)
	}
	// Killed in the middle of the next append.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`{"k":"cmd-2","s":{"po`); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	l2, err := devices.OpenPriorLog(path, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l2.Close() }()
	st, ok := l2.Get("cmd-1")
	if !ok || st["power"] != "on" || st["brightness"] != int64(30) {
		t.Fatalf("cmd-1 after reopening: %v, %v", st, ok)
	}
	if _, ok := l2.Get("cmd-2"); ok {
		t.Error("the torn entry was read")
	}
}

func TestPriorLogFileStaysBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "priors.log")
	l, err := devices.OpenPriorLog(path, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	for i := range 1000 {
		if err := l.Put(strings.Repeat("k", 1+i%7)+string(rune('a'+i%26))+time.Duration(i).String(), map[string]any{"power": "on"}); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(data), "\n"); n > 16 {
		t.Errorf("%d lines in the file, want at most twice the 8 kept", n)
	}
}

// TestPriorStateOfARecoveredStepComesFromTheLog: a step's first attempt
// to a Zigbee2MQTT bulb reads it (its state was not known) and logs
// what it was; the agent's process then ends with the command in flight.
// A new client on the same log, taking the step's next attempt, acks it
// with the bulb's state before the first command, not the one it left.
// The log has it before the command reaches the bridge: a kill at any
// moment after the publish finds it there.
func TestPriorStateOfARecoveredStepComesFromTheLog(t *testing.T) {
	b := brokertest.Start(t)
	reg, err := devices.ParseRegistry([]byte(z2mRegistry), "eco.toml")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "priors.log")
	set := make(chan string, 8) // the file as each command reached the bridge
	z, err := simulator.StartZigbee2MQTT(t.Context(), simulator.Z2MConfig{Broker: b.URL(), OnSet: func(string) {
		data, _ := os.ReadFile(path)
		set <- string(data)
	},
		Devices: []simulator.Z2MDevice{
			{Name: "Hall/Bulb", Kind: "light", Delay: 300 * time.Millisecond, State: map[string]any{"state": "ON", "brightness": 76}},
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(z.Close)
	log1, err := devices.OpenPriorLog(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	c1 := dial(t, b, func(o *devices.Options) { o.Registry = reg; o.PriorLog = log1 })
	want := map[string]any{"power": "on", "brightness": int64(80)}
	if _, _, err := c1.PostState("hall-bulb", "m1-s1", want, 1, time.Now().Add(5*time.Second), nil); err != nil {
		t.Fatal(err)
	}
	// The read is answered and the command sent; the process "dies"
	// before the bulb has applied it.
	if logged := testkit.Receive(t, set, 5*time.Second, "the command never reached the bridge"); !strings.Contains(logged, `"m1-s1"`) {
		t.Errorf("the log held %q as the command reached the bridge: a kill then would lose the prior state", logged)
	}
	_ = c1.Close()
	_ = log1.Close()

	log2, err := devices.OpenPriorLog(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = log2.Close() }()
	c2 := dial(t, b, func(o *devices.Options) { o.Registry = reg; o.PriorLog = log2 })
	wakersMu.Lock()
	w := wakers[c2]
	wakersMu.Unlock()
	acked := w.wait(devices.AckKey("hall-bulb", "m1-s1"))
	ack, done, err := c2.PostState("hall-bulb", "m1-s1", want, 2, time.Now().Add(5*time.Second), nil)
	if !done && err == nil {
		testkit.Receive(t, acked, 5*time.Second, "no ack for the recovered attempt")
		ack, _, err = c2.Collect("hall-bulb", "m1-s1", false)
	}
	if err != nil {
		t.Fatal(err)
	}
	if ack.Prior["brightness"] != int64(30) || ack.Prior["power"] != "on" {
		t.Fatalf("prior %v, want the bulb as it was before the first attempt (on, 30%%)", ack.Prior)
	}
}
