package simulator

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/devices/wire"
)

func demoDevices() []DeviceConfig {
	return []DeviceConfig{
		{ID: "light", Type: TypeLight},
		{ID: "ac", Type: TypeAC},
		{ID: "speaker", Type: TypeSpeaker},
		{ID: "lock", Type: TypeLock},
		{ID: "curtain", Type: TypeCurtain},
	}
}

// TestDeviceTypes drives every type over a real broker: valid commands
// change state (in the ack and in the retained report), invalid ones are
// rejected naming the field, and rejected commands change nothing.
func TestDeviceTypes(t *testing.T) {
	h, a := rig(t, demoDevices()...)
	type step struct {
		device, action, params string
		want                   map[string]any // state after, for ok steps
		code, inMsg            string         // error code and a message fragment
	}
	steps := []step{
		{device: "light", action: "turn_on", params: `{"brightness":40}`, want: map[string]any{"power": "on", "brightness": 40, "color_temp": 4000}},
		{device: "light", action: "set", params: `{"color_temp":2700,"brightness":0}`, want: map[string]any{"power": "on", "brightness": 0, "color_temp": 2700}},
		{device: "light", action: "turn_off", want: map[string]any{"power": "off"}},
		{device: "light", action: "turn_on", params: `{"brightness":25.0}`, want: map[string]any{"power": "on", "brightness": 25}},
		{device: "light", action: "turn_on", params: `{"brightness":0}`, code: "invalid_param", inMsg: "brightness"},
		{device: "light", action: "turn_on", params: `{"brightness":25.5}`, code: "invalid_param", inMsg: "brightness"},
		{device: "light", action: "turn_on", params: `{"brightness":"25"}`, code: "invalid_param", inMsg: "brightness"},
		{device: "light", action: "set", params: `{"color_temp":6501}`, code: "invalid_param", inMsg: "color_temp"},
		{device: "light", action: "set", params: `{"power":"dim"}`, code: "invalid_param", inMsg: "power"},
		{device: "light", action: "set", params: `{"hue":3}`, code: "invalid_param", inMsg: "hue"},
		{device: "light", action: "blink", code: "unknown_action", inMsg: "blink"},

		{device: "ac", action: "set", params: `{"power":"on","mode":"heat","target":21,"fan":"low"}`, want: map[string]any{"power": "on", "mode": "heat", "target": 21, "fan": "low"}},
		{device: "ac", action: "turn_off", want: map[string]any{"power": "off", "mode": "heat", "target": 21}},
		{device: "ac", action: "set", params: `{"target":31}`, code: "invalid_param", inMsg: "target"},
		{device: "ac", action: "set", params: `{"mode":"turbo"}`, code: "invalid_param", inMsg: "mode"},
		{device: "ac", action: "set", params: `{"fan":1}`, code: "invalid_param", inMsg: "fan"},
		{device: "ac", action: "turn_on", code: "unknown_action", inMsg: "turn_on"},

		{device: "speaker", action: "play", params: `{"playlist":"jazz","volume":12}`, want: map[string]any{"status": "playing", "volume": 12, "playlist": "jazz"}},
		{device: "speaker", action: "pause", want: map[string]any{"status": "paused", "playlist": "jazz"}},
		{device: "speaker", action: "set", params: `{"status":"playing","volume":100}`, want: map[string]any{"status": "playing", "volume": 100}},
		{device: "speaker", action: "play", params: fmt.Sprintf(`{"playlist":%q}`, strings.Repeat("x", 65)), code: "invalid_param", inMsg: "playlist"},
		{device: "speaker", action: "set", params: `{"volume":-1}`, code: "invalid_param", inMsg: "volume"},
		{device: "speaker", action: "set", params: `{"status":"stopped"}`, code: "invalid_param", inMsg: "status"},
		{device: "speaker", action: "stop", code: "unknown_action", inMsg: "stop"},

		{device: "lock", action: "unlock", want: map[string]any{"locked": false}},
		{device: "lock", action: "lock", want: map[string]any{"locked": true}},
		{device: "lock", action: "set", params: `{"locked":false}`, want: map[string]any{"locked": false}},
		{device: "lock", action: "set", params: `{"locked":"yes"}`, code: "invalid_param", inMsg: "locked"},
		{device: "lock", action: "open", code: "unknown_action", inMsg: "open"},

		{device: "curtain", action: "open", want: map[string]any{"position": 100, "moving": false}},
		{device: "curtain", action: "set_position", params: `{"position":30}`, want: map[string]any{"position": 30}},
		{device: "curtain", action: "set", params: `{"position":70}`, want: map[string]any{"position": 70}},
		{device: "curtain", action: "close", want: map[string]any{"position": 0}},
		{device: "curtain", action: "set_position", code: "invalid_param", inMsg: "position"},
		{device: "curtain", action: "set_position", params: `{"position":101}`, code: "invalid_param", inMsg: "position"},
		{device: "curtain", action: "set", params: `{"position":null}`, code: "invalid_param", inMsg: "position"},
	}
	for i, s := range steps {
		t.Run(fmt.Sprintf("%02d_%s_%s", i, s.device, s.action), func(t *testing.T) {
			d := h.Device(s.device)
			before := d.State()
			id := fmt.Sprintf("c%d", i)
			ack := a.call(s.device, id, s.action, s.params)
			if s.code != "" {
				wantCode(t, ack, s.code, s.inMsg)
				if got := d.State(); !reflect.DeepEqual(got, before) {
					t.Fatalf("rejected command changed state: %v -> %v", before, got)
				}
				if n := d.Applied(id); n != 0 {
					t.Fatalf("rejected command applied %d times", n)
				}
				return
			}
			wantOK(t, ack)
			wantState(t, ack.State, s.want)
			a.awaitState(s.device, func(st map[string]any) bool { return sameState(st, s.want) })
			if n := d.Applied(id); n != 1 {
				t.Fatalf("applied %d times, want 1", n)
			}
		})
	}
}

func TestUndecodableCommand(t *testing.T) {
	h, a := rig(t, DeviceConfig{ID: "light", Type: TypeLight})
	// No id: nobody to answer, the device drops it.
	a.sendRaw("light", `{"action":"turn_on"}`)
	// An id but no action: the device says what is wrong.
	a.sendRaw("light", `{"id":"x1"}`)
	wantCode(t, a.nextAck("light"), "invalid_param", "no action")
	if c := h.Device("light").Counters(); c.Received != 2 || c.Rejected != 2 || c.Applied != 0 {
		t.Fatalf("counters %+v", c)
	}
}

func TestRepeatedCommandAppliedOnce(t *testing.T) {
	h, a := rig(t, DeviceConfig{ID: "light", Type: TypeLight})
	first := a.call("light", "same", "turn_on", `{"brightness":10}`)
	wantOK(t, first)
	// A retry carries the same ID; even with other params (which a
	// correct agent never sends) the first result stands.
	again := a.call("light", "same", "turn_on", `{"brightness":90}`)
	if !reflect.DeepEqual(first, again) {
		t.Fatalf("re-ack %+v, want first ack %+v", again, first)
	}
	d := h.Device("light")
	if n := d.Applied("same"); n != 1 {
		t.Fatalf("applied %d times, want 1", n)
	}
	if got := d.State()["brightness"]; got != 10 {
		t.Fatalf("brightness %v, want 10", got)
	}
	// A rejected command is remembered too: its retry gets the same
	// answer without being checked again.
	bad := a.call("light", "bad", "turn_on", `{"brightness":200}`)
	wantCode(t, bad, "invalid_param", "brightness")
	if again := a.call("light", "bad", "turn_on", `{"brightness":20}`); !reflect.DeepEqual(bad, again) {
		t.Fatalf("re-ack %+v, want %+v", again, bad)
	}
	c := d.Counters()
	want := Counters{Received: 4, Applied: 1, Replayed: 2, Rejected: 1, AcksSent: 4}
	if c != want {
		t.Fatalf("counters %+v, want %+v", c, want)
	}
}

// ackOf is the payload of the ack among a command's outputs, which comes
// before the state report.
func ackOf(t *testing.T, outs []output) []byte {
	t.Helper()
	for i, o := range outs {
		if o.ack {
			if i != 0 {
				t.Errorf("ack is output %d of %d, want it first", i, len(outs))
			}
			return o.payload
		}
	}
	t.Fatalf("no ack among %d outputs", len(outs))
	return nil
}

// TestAckPrior checks that an ack carries the state before the command,
// and that a re-ack carries the first one, not the state at the retry.
func TestAckPrior(t *testing.T) {
	d := offlineDevice(t, TypeLight, Faults{})
	now := time.Now()
	lastAck := func(outs []output) wireAck {
		t.Helper()
		var a wireAck
		if err := json.Unmarshal(ackOf(t, outs), &a); err != nil {
			t.Fatal(err)
		}
		return a
	}
	first := lastAck(d.handle([]byte(rawCmd("a", "turn_on", `{"brightness":30}`)), now))
	d.handle([]byte(rawCmd("b", "set", `{"brightness":70}`)), now)
	again := lastAck(d.handle([]byte(rawCmd("a", "turn_on", `{"brightness":30}`)), now))
	want := map[string]any{"power": "off", "brightness": 100, "color_temp": 4000}
	for _, a := range []wireAck{first, again} {
		wantState(t, a.Prior, want)
		wantState(t, a.State, map[string]any{"power": "on", "brightness": 30})
	}
	if bad := lastAck(d.handle([]byte(rawCmd("c", "set", `{"brightness":700}`)), now)); bad.Prior != nil {
		t.Fatalf("rejected command has a prior state %v", bad.Prior)
	}
}

func TestDedupWindowIsBounded(t *testing.T) {
	d := offlineDevice(t, TypeLight, Faults{})
	now := time.Now()
	d.handle([]byte(rawCmd("old", "turn_on", "")), now)
	for i := range DedupSize {
		d.handle([]byte(rawCmd(fmt.Sprint("fill", i), "turn_off", "")), now)
	}
	d.handle([]byte(rawCmd("old", "turn_on", "")), now)
	if n := d.Applied("old"); n != 2 {
		t.Fatalf("forgotten ID applied %d times, want 2 (window is %d)", n, DedupSize)
	}
	if d.acks.len() > DedupSize {
		t.Fatalf("dedup holds %d IDs, max %d", d.acks.len(), DedupSize)
	}
}

func TestExpiredCommand(t *testing.T) {
	h, a := rig(t, DeviceConfig{ID: "lock", Type: TypeLock})
	past := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano)
	a.sendRaw("lock", fmt.Sprintf(`{"id":"e1","action":"unlock","expires":%q}`, past))
	wantCode(t, a.nextAck("lock"), "expired", "after expiry")
	d := h.Device("lock")
	if d.State()["locked"] != true || d.Applied("e1") != 0 {
		t.Fatalf("expired command applied: state %v", d.State())
	}
	// Expiry is retryable, so it is not remembered: a fresh attempt of
	// the same ID is applied.
	future := time.Now().Add(time.Minute).UTC().Format(time.RFC3339Nano)
	a.sendRaw("lock", fmt.Sprintf(`{"id":"e1","action":"unlock","attempt":2,"expires":%q}`, future))
	ack := a.nextAck("lock")
	wantOK(t, ack)
	wantState(t, ack.State, map[string]any{"locked": false})
}

func TestCurtainTravel(t *testing.T) {
	h, a := rig(t, DeviceConfig{ID: "curtain", Type: TypeCurtain, Travel: 200 * time.Millisecond})
	start := time.Now()
	ack := a.call("curtain", "p1", "set_position", `{"position":60}`)
	wantOK(t, ack)
	// It acks at once, still where it was, moving.
	wantState(t, ack.State, map[string]any{"position": 0, "moving": true})
	final := a.awaitState("curtain", func(s map[string]any) bool { return s["moving"] == false })
	wantState(t, final, map[string]any{"position": 60})
	if el := time.Since(start); el < 120*time.Millisecond {
		t.Fatalf("travelled 60%% in %v, want about 120ms", el)
	}
	if got := h.Device("curtain").State(); got["position"] != 60 || got["moving"] != false {
		t.Fatalf("state %v", got)
	}
}

func TestCurtainInterrupted(t *testing.T) {
	d := offlineDevice(t, TypeCurtain, Faults{})
	d.travel = time.Second
	t0 := time.Unix(1000, 0)
	d.handle([]byte(rawCmd("a", "open", "")), t0)
	// Half way, it is told to close: it turns round from 50.
	outs := d.handle([]byte(rawCmd("b", "close", "")), t0.Add(500*time.Millisecond))
	ack, err := wire.DecodeAck(ackOf(t, outs))
	if err != nil {
		t.Fatal(err)
	}
	wantState(t, ack.State, map[string]any{"position": 50, "moving": true})
	due, ok := d.travelDue()
	if want := t0.Add(time.Second); !ok || !due.Equal(want) {
		t.Fatalf("due %v %v, want %v", due, ok, want)
	}
	if outs := d.finishTravel(due.Add(-time.Millisecond)); outs != nil {
		t.Fatal("finished early")
	}
	rep, err := wire.DecodeState(d.finishTravel(due)[0].payload)
	if err != nil {
		t.Fatal(err)
	}
	wantState(t, rep.State, map[string]any{"position": 0, "moving": false})
}

// offlineDevice is a device that is never connected, for driving its
// handler directly.
func offlineDevice(t testing.TB, typ string, f Faults) *Device {
	t.Helper()
	return offlineDeviceSeed(t, typ, f, 1)
}

func offlineDeviceSeed(t testing.TB, typ string, f Faults, seed uint64) *Device {
	t.Helper()
	cfg := DeviceConfig{ID: "dev", Type: typ, Faults: f}
	st, err := cfg.check()
	if err != nil {
		t.Fatal(err)
	}
	return newDevice(cfg, st, seed, wire.Topics{}, "tcp://127.0.0.1:1", "x", testLogger())
}

// wireAck decodes the acks the simulator sends with encoding/json alone,
// so these tests do not rest on wire.DecodeAck, the agent's reading of
// the same bytes.
type wireAck struct {
	ID    string         `json:"id"`
	OK    bool           `json:"ok"`
	Error *wire.AckError `json:"error,omitempty"`
	State map[string]any `json:"state,omitempty"`
	Prior map[string]any `json:"prior,omitempty"`
}
