package simulator

import (
	"encoding/json"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/devices/wire"
)

func TestExactInt(t *testing.T) {
	for _, c := range []struct {
		in     string
		want   int
		errHas string
	}{
		{"25", 25, ""},
		{"-0", 0, ""},
		{"25.0", 25, ""},
		{"2.5e1", 25, ""},
		{"2500E-2", 25, ""},
		{"0.0e5", 0, ""},
		{"100", 100, ""},
		{"25.5", 0, "not an integer"},
		{"1e-1", 0, "not an integer"},
		{"101", 0, "out of range"},
		{"-1", 0, "out of range"},
		{"1e400", 0, "out of range"},
		{"99999999999999999999", 0, "out of range"},
		{"1e99999", 0, "out of range"},
		{"1e", 0, "not a number"},
		{"", 0, "not a number"},
		{"0x10", 0, "not a number"},
	} {
		got, err := exactInt(c.in, 0, 100)
		switch {
		case c.errHas == "" && (err != nil || got != c.want):
			t.Errorf("exactInt(%q) = %d, %v; want %d", c.in, got, err, c.want)
		case c.errHas != "" && (err == nil || !strings.Contains(err.Error(), c.errHas)):
			t.Errorf("exactInt(%q) = %d, %v; want error %q", c.in, got, err, c.errHas)
		}
	}
}

// FuzzExactInt checks exactInt against big.Rat on every valid JSON
// number: same verdict, same value.
func FuzzExactInt(f *testing.F) {
	for _, s := range []string{"25", "25.0", "2.5e1", "-3", "1e-1", "0.00", "1E+2", "-0.5e1", "6500", "1e1000"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var n json.Number
		if json.Unmarshal([]byte(s), &n) != nil || len(s) > 64 {
			return
		}
		got, err := exactInt(string(n), -7000, 7000)
		r, ok := new(big.Rat).SetString(string(n))
		if !ok {
			// big.Rat refuses exponents beyond its own limit; such
			// numbers are zero (handled by Atoi-free paths) or huge.
			if err == nil && got != 0 {
				t.Fatalf("exactInt(%q) = %d, want an error", n, got)
			}
			return
		}
		inRange := r.IsInt() && r.Num().IsInt64() && r.Num().Int64() >= -7000 && r.Num().Int64() <= 7000
		if inRange != (err == nil) {
			t.Fatalf("exactInt(%q) = %d, %v; big.Rat says integer in range: %v", n, got, err, inRange)
		}
		if inRange && int64(got) != r.Num().Int64() {
			t.Fatalf("exactInt(%q) = %d, want %s", n, got, r.Num())
		}
	})
}

// FuzzHandle feeds arbitrary payloads to every device type's firmware,
// with every fault on: it must never panic, always answer a command it
// can identify with a well-formed ack, and keep its state in its domain.
func FuzzHandle(f *testing.F) {
	for _, s := range []string{
		rawCmd("a", "turn_on", `{"brightness":40}`),
		rawCmd("b", "set", `{"power":"on","mode":"heat","target":21.0,"fan":"low","status":"playing","volume":1e1,"locked":true,"position":5}`),
		rawCmd("c", "set_position", `{"position":"5"}`),
		rawCmd("d", "play", `{"playlist":"x","volume":-0}`),
		`{"id":"e","action":"open","expires":"2000-01-01T00:00:00Z"}`,
		`{"id":"f"}`,
		`{"id":7,"action":"lock"}`,
		`{"id":"g","action":"set","params":{"position":[1]}}`,
		`{"id":"h","action":"set","params":null} trailing`,
		`null`, ``, `[]`, `{"params":{"brightness":1e999999999}}`,
	} {
		f.Add([]byte(s))
	}
	faults := Faults{AckLoss: 0.3, DuplicateAck: 0.3, Busy: 0.2, WrongState: 0.3, AckJitter: time.Millisecond}
	var devs []*Device
	for _, typ := range Types() {
		ff := faults
		ff.Jammed = typ == TypeLock
		d := offlineDevice(f, typ, ff)
		d.travel = time.Second
		devs = append(devs, d)
	}
	now := time.Now()
	f.Fuzz(func(t *testing.T, payload []byte) {
		now = now.Add(10 * time.Millisecond)
		for _, d := range devs {
			for _, o := range d.handle(payload, now) {
				if o.ack {
					if _, err := wire.DecodeAck(o.payload); err != nil {
						t.Fatalf("%s sent a bad ack %s: %v", d.typ, o.payload, err)
					}
					continue
				}
				rep, err := wire.DecodeState(o.payload)
				if err != nil {
					t.Fatalf("%s sent a bad state %s: %v", d.typ, o.payload, err)
				}
				delete(rep.State, "moving")
				if _, err := d.m.checkState(rep.State); err != nil {
					t.Fatalf("%s reports a state out of its domain %v: %v", d.typ, rep.State, err)
				}
			}
			d.finishTravel(now.Add(time.Hour))
		}
	})
}

func FuzzParseHome(f *testing.F) {
	for _, s := range []string{
		"seed = 1\n[[device]]\nid = \"a\"\ntype = \"light\"\n[device.faults]\nack_loss = 0.5\n",
		"[[device]]\nid = \"c\"\ntype = \"curtain\"\ntravel = \"2s\"\nstate = { position = 3 }\n",
		"broker = \"tcp://h:1\"\nprefix = \"p\"\n[[device]]\nid = \"l\"\ntype = \"lock\"\n[device.faults]\njammed = true\nreject = \"jammed\"\n",
		"[[device]]\nid = \"a\"\ntype = \"speaker\"\n[device.state]\nplaylist = 3\n",
		"[[device]]\n[[device]]\n[device.faults]\noffline_every = \"1s\"\n",
		"x = [1, 2\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseHome("fuzz.toml", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.toml: ") {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		// Whatever parses must build a home.
		cfg.Broker = "tcp://127.0.0.1:1"
		if _, err := NewHome(cfg); err != nil {
			t.Fatalf("parsed config does not build: %v", err)
		}
	})
}
