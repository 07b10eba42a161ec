package wire_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/sortie-edge/sortie/devices/wire"
)

// goldenPayloads adds the shared catalogue of wire examples in
// testdata/payloads as seeds: every one of them must decode.
func goldenPayloads(f *testing.F, prefix string) {
	paths, err := filepath.Glob(filepath.Join("testdata", "payloads", prefix+"*.json"))
	if err != nil || len(paths) == 0 {
		f.Fatalf("no golden %s payloads: %v", prefix, err)
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
}

func FuzzDecodeCommand(f *testing.F) {
	goldenPayloads(f, "command")
	f.Add([]byte(`{"id":"a","action":"b","params":{"x":1e400}}`))
	f.Add([]byte(`{"id":"a","action":"b"} {}`))
	f.Add([]byte(`{"id":"","action":"b"}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := wire.DecodeCommand(b)
		if err == nil && (c.ID == "" || c.Action == "") {
			t.Fatalf("accepted command without id or action: %+v", c)
		}
	})
}

func FuzzDecodeAck(f *testing.F) {
	goldenPayloads(f, "ack")
	f.Add([]byte(`{"id":"a","ok":false}`))
	f.Add([]byte(`{"id":"a","ok":false,"error":{"code":""}}`))
	f.Add([]byte(`{"id":"a","ok":true,"state":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := wire.DecodeAck(b)
		if err == nil && (a.ID == "" || !a.OK && (a.Error == nil || a.Error.Code == "")) {
			t.Fatalf("accepted invalid ack: %+v", a)
		}
	})
}

func FuzzDecodeState(f *testing.F) {
	goldenPayloads(f, "state")
	f.Add([]byte(`{"state":null}`))
	f.Add([]byte(`{"state":{"a":[1,{"b":2}]},"ts":"bad"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := wire.DecodeState(b)
		if err == nil && s.State == nil {
			t.Fatal("accepted state report without state")
		}
	})
}

func FuzzDecodeAvailability(f *testing.F) {
	for _, s := range []string{"online", "offline", `"online"`, " OFFLINE\n", "", "maybe", `""`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = wire.DecodeAvailability(b)
	})
}
