package wire_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/sortie-edge/sortie/devices/wire"
)

func ExampleTopics() {
	t := wire.Topics{Prefix: "home"}
	fmt.Println(t.Command("porch-light"))
	fmt.Println(t.Wildcard("ack"))
	fmt.Println(t.DeviceOf("home/devices/porch-light/state"))
	// Output:
	// home/devices/porch-light/cmd
	// home/devices/+/ack
	// porch-light state true
}

func TestValidateDeviceID(t *testing.T) {
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{"living-light", true}, {"caf\u00e9_2", true}, {strings.Repeat("a", wire.MaxDeviceIDLen), true},
		{"", false}, {strings.Repeat("a", wire.MaxDeviceIDLen+1), false},
		{"a/b", false}, {"a+", false}, {"#", false}, {"a b", false}, {"a\x00", false}, {"bad \xff", false},
	} {
		err := wire.ValidateDeviceID(tc.id)
		if (err == nil) != tc.ok || err != nil && !errors.Is(err, wire.ErrInvalidID) {
			t.Errorf("ValidateDeviceID(%q) = %v, want ok %v", tc.id, err, tc.ok)
		}
	}
}

// FuzzDeviceOf: a device topic names its device and kind back, and no
// other topic is taken for one.
func FuzzDeviceOf(f *testing.F) {
	f.Add("sortie", "living-light", "ack")
	f.Add("", "x", "state")
	f.Add("home", "a/b", "availability")
	f.Add("p", "", "cmd")
	f.Fuzz(func(t *testing.T, prefix, id, kind string) {
		tp := wire.Topics{Prefix: prefix}
		topic := strings.TrimSuffix(tp.Wildcard(kind), "+/"+kind) + id + "/" + kind
		gotID, gotKind, ok := tp.DeviceOf(topic)
		want := id != "" && !strings.Contains(id, "/") && !strings.Contains(kind, "/")
		if ok != want || ok && (gotID != id || gotKind != kind) {
			t.Fatalf("DeviceOf(%q) = %q, %q, %v; want %q, %q, %v", topic, gotID, gotKind, ok, id, kind, want)
		}
	})
}

func TestRetryableCode(t *testing.T) {
	for code, want := range map[string]bool{
		wire.CodeBusy: true, wire.CodeExpired: true, wire.CodeInternal: true,
		wire.CodeInvalidParam: false, wire.CodeUnknownAction: false, wire.CodeJammed: false,
		wire.CodeUnsupported: false, "never-heard-of-it": false,
	} {
		if got := wire.RetryableCode(code); got != want {
			t.Errorf("RetryableCode(%q) = %v, want %v", code, got, want)
		}
	}
}
