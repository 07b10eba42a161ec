package conf

import "testing"

func TestBytesReadsUnitsAndRefusesNonsense(t *testing.T) {
	for in, want := range map[string]Bytes{
		"0": 0, "4096": 4096, "32MiB": 32 << 20, "1.5 GiB": 3 << 29, "512KiB": 512 << 10,
		"10MB": 10e6, "2kB": 2000, "7 B": 7,
	} {
		var b Bytes
		if err := b.UnmarshalText([]byte(in)); err != nil || b != want {
			t.Errorf("%q = %d, %v; want %d", in, b, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "-1MiB", "12 parsecs", "1e400", "NaN"} {
		var b Bytes
		if err := b.UnmarshalText([]byte(in)); err == nil {
			t.Errorf("%q accepted as %d", in, b)
		}
	}
	if s := Bytes(32 << 20).String(); s != "32MiB" {
		t.Errorf("String = %q", s)
	}
}

func FuzzBytes(f *testing.F) {
	f.Add("32MiB")
	f.Add("1.5 GB")
	f.Fuzz(func(t *testing.T, s string) {
		var b Bytes
		if err := b.UnmarshalText([]byte(s)); err == nil && b < 0 {
			t.Fatalf("%q read as %d", s, b)
		}
	})
}
