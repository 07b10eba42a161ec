package simulator

import (
	"strings"
	"testing"
	"time"
)

// TestBridgeLosesCommandsBeyondItsCapacity: three lights behind a bridge
// that relays two commands at once (each held for the 200 ms ack delay):
// a third command at the same moment is lost (no ack, not applied), and
// one after the round trip goes through again. With overflow "busy" it
// is refused as busy instead.
func TestBridgeLosesCommandsBeyondItsCapacity(t *testing.T) {
	for _, overflow := range []string{OverflowDrop, OverflowBusy} {
		t.Run(overflow, func(t *testing.T) {
			br := &bridge{cfg: BridgeConfig{ID: "zigbee", Capacity: 2, Overflow: overflow}}
			var devs []*Device
			for range 3 {
				d := offlineDevice(t, TypeLight, Faults{AckDelay: 200 * time.Millisecond})
				d.bridge = br
				devs = append(devs, d)
			}
			now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			for i, d := range devs[:2] {
				if outs := d.handle([]byte(rawCmd("c"+string(rune('0'+i)), "turn_on", `{}`)), now); len(outs) != 2 {
					t.Fatalf("command %d within capacity: %d outputs, want ack and state", i, len(outs))
				}
			}
			outs := devs[2].handle([]byte(rawCmd("c2", "turn_on", `{}`)), now.Add(100*time.Millisecond))
			switch overflow {
			case OverflowDrop:
				if len(outs) != 0 {
					t.Fatalf("a command beyond capacity was answered: %d outputs", len(outs))
				}
			case OverflowBusy:
				if len(outs) != 1 || !strings.Contains(string(outs[0].payload), `"code":"busy"`) {
					t.Fatalf("a command beyond capacity: %d outputs, want one busy ack", len(outs))
				}
			}
			if c := devs[2].Counters(); c.Applied != 0 || c.Overflowed != 1 {
				t.Fatalf("counters %+v, want none applied, one overflowed", c)
			}
			if outs := devs[2].handle([]byte(rawCmd("c3", "turn_on", `{}`)), now.Add(200*time.Millisecond)); len(outs) != 2 {
				t.Fatalf("a command after the round trip: %d outputs, want ack and state", len(outs))
			}
		})
	}
}

func TestHomeRejectsBadBridges(t *testing.T) {
	for _, c := range []struct{ name, toml, want string }{
		{"unknown bridge", "[[device]]\nid = \"a\"\ntype = \"light\"\nbridge = \"nope\"\n", "no [[bridge]]"},
		{"no capacity", "[[bridge]]\nid = \"z\"\n[[device]]\nid = \"a\"\ntype = \"light\"\nbridge = \"z\"\n", "capacity"},
		{"bad overflow", "[[bridge]]\nid = \"z\"\ncapacity = 2\noverflow = \"explode\"\n[[device]]\nid = \"a\"\ntype = \"light\"\n", "overflow"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := ParseHome("home.toml", []byte(c.toml)); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("ParseHome: %v, want an error about %s", err, c.want)
			}
		})
	}
}
