package devices_test

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/devices/wire"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/testkit"
)

// TestMalformedAndUnknownAcksAreCountedAndSparTheCommandInFlight: acks
// that answer no command (not JSON, no id, a negative ack without a code
// for the very ID in flight, a payload far over the log's clip, an ID
// never sent) are counted by reason and logged at debug level with the
// device and topic, and the command in flight still completes from its
// real ack. Issue 18 found malformed acks dropped without a trace
// outside the client.
func TestMalformedAndUnknownAcksAreCountedAndSparTheCommandInFlight(t *testing.T) {
	b := brokertest.Start(t)
	hold := make(chan struct{})
	dev := startDevice(t, b, "lamp", map[string]any{"power": "off"}, func(wire.Command, int) reply { return reply{Hold: hold} })
	var logs testkit.SyncBuffer
	stray := make(chan string, 8)
	c := dial(t, b, func(o *devices.Options) {
		o.AckTimeout = 10 * time.Second
		o.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		o.OnStrayAck = func(_ string, ack wire.Ack, _ bool) { stray <- ack.ID }
	})
	done := make(chan error, 1)
	go func() {
		ack, err := send(t.Context(), c, "lamp", wire.Command{ID: "in-flight", Action: "turn_on"})
		if err == nil && !ack.OK {
			err = errors.New("negative ack")
		}
		done <- err
	}()
	dev.next(t) // published, and held by the device

	ackTopic := c.Topics().Ack("lamp")
	big := strings.Repeat("x", 10<<10)
	malformed := []string{
		`not json`,
		`{"ok":true}`,
		`{"id":"in-flight","ok":false}`,
		big,
	}
	for _, p := range malformed {
		dev.publish(ackTopic, false, p)
	}
	// Acks from one publisher arrive in order: once this one is in, so
	// are the malformed ones before it.
	dev.publish(ackTopic, false, wire.Ack{ID: "never-sent", OK: true})
	id := testkit.Receive(t, stray, 5*time.Second, "the unknown ack never arrived")
	if id != "never-sent" {
		t.Fatalf("stray ack %q, want never-sent", id)
	}
	select {
	case err := <-done:
		t.Fatalf("the command in flight ended before its ack: %v", err)
	default:
	}
	close(hold)
	if err := <-done; err != nil {
		t.Fatalf("Send: %v", err)
	}
	if got := dev.effectCount("in-flight"); got != 1 {
		t.Errorf("effects = %d, want 1", got)
	}
	s := c.Stats()
	want := devices.Stats{Sent: 1, Acked: 1, Malformed: 4, MalformedAcks: 4, UnknownAcks: 1}
	if s != want {
		t.Errorf("stats = %+v\nwant    %+v", s, want)
	}

	out := logs.String()
	var bad []string
	for line := range strings.Lines(out) {
		if strings.Contains(line, "malformed ack ignored") {
			bad = append(bad, line)
		}
	}
	if len(bad) != len(malformed) {
		t.Fatalf("%d malformed-ack log lines, want %d:\n%s", len(bad), len(malformed), out)
	}
	for _, line := range bad {
		if !strings.Contains(line, "level=DEBUG") || !strings.Contains(line, "device=lamp") || !strings.Contains(line, "topic="+ackTopic) {
			t.Errorf("log line lacks its level, device or topic: %s", line)
		}
		if len(line) > 1024 {
			t.Errorf("log line of %d bytes; the payload should be clipped: %.300s…", len(line), line)
		}
	}
	if !strings.Contains(bad[3], "bytes=10240") {
		t.Errorf("the large payload's line does not give its size: %s", bad[3])
	}
	if !strings.Contains(out, "ack for an unknown command") || !strings.Contains(out, "id=never-sent") {
		t.Errorf("no debug line for the unknown ack:\n%s", out)
	}
}

// TestAckOfAForgottenCommandIsUnknownNotLate: an ack counts as late only
// for a command this client gave up on and still remembers giving up on
// (as many as AckCache); one it has forgotten counts as unknown. Both
// are kept for a retry of their ID.
func TestAckOfAForgottenCommandIsUnknownNotLate(t *testing.T) {
	b := brokertest.Start(t)
	hold := make(chan struct{})
	startDevice(t, b, "lamp", nil, func(wire.Command, int) reply { return reply{Hold: hold} })
	stray := make(chan string, 4)
	c := dial(t, b, func(o *devices.Options) {
		o.AckTimeout = 100 * time.Millisecond
		o.AckCache = 1
		o.OnStrayAck = func(_ string, ack wire.Ack, _ bool) { stray <- ack.ID }
	})
	for _, id := range []string{"first", "second"} {
		if _, err := send(t.Context(), c, "lamp", wire.Command{ID: id, Action: "turn_on"}); !errors.Is(err, driver.ErrAckTimeout) {
			t.Fatalf("Send %s: err = %v, want ack timeout", id, err)
		}
	}
	close(hold) // both are answered now, in order
	for _, want := range []string{"first", "second"} {
		select {
		case id := <-stray:
			if id != want {
				t.Fatalf("stray ack %q, want %q", id, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no ack for %s", want)
		}
	}
	if s := c.Stats(); s.LateAcks != 1 || s.UnknownAcks != 1 || s.Timeouts != 2 || s.MalformedAcks != 0 {
		t.Errorf("stats = %+v, want 1 late (second), 1 unknown (first, forgotten with a cache of 1), 2 timeouts", s)
	}
	// The retry of the late one completes from its ack, unpublished.
	if ack, err := send(t.Context(), c, "lamp", wire.Command{ID: "second", Action: "turn_on", Attempt: 2}); err != nil || !ack.OK {
		t.Fatalf("retry of second: %+v, %v", ack, err)
	}
	if s := c.Stats(); s.Sent != 2 || s.Cached != 1 {
		t.Errorf("stats = %+v, want the retry served from the late ack (2 sent, 1 cached)", s)
	}
}

// TestAckOfAPostGivenUpOnIsLate: Collect giving up on a posted command
// makes its ack late, not unknown, as Send's timeout does.
func TestAckOfAPostGivenUpOnIsLate(t *testing.T) {
	b := brokertest.Start(t)
	hold := make(chan struct{})
	dev := startDevice(t, b, "lamp", nil, func(wire.Command, int) reply { return reply{Hold: hold} })
	stray := make(chan bool, 4)
	c := dial(t, b, func(o *devices.Options) {
		o.OnStrayAck = func(_ string, _ wire.Ack, dup bool) { stray <- dup }
	})
	if _, done, err := c.Post("lamp", wire.Command{ID: "p1", Action: "turn_on"}, time.Now().Add(time.Minute), nil); done || err != nil {
		t.Fatalf("Post: done %v, %v", done, err)
	}
	dev.next(t)
	if _, ok, err := c.Collect("lamp", "p1", true); !ok || !errors.Is(err, driver.ErrAckTimeout) {
		t.Fatalf("Collect giving up: ok %v, err %v; want an ack timeout", ok, err)
	}
	close(hold)
	dup := testkit.Receive(t, stray, 5*time.Second, "no late ack")
	if dup {
		t.Fatal("the late ack counted as a duplicate")
	}
	if s := c.Stats(); s.LateAcks != 1 || s.UnknownAcks != 0 {
		t.Errorf("stats = %+v, want 1 late, 0 unknown", s)
	}
}
