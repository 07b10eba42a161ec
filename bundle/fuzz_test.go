package bundle_test

import (
	"bytes"
	"testing"

	"github.com/sortie-edge/sortie/bundle"
)

// FuzzDecode: any bytes give a bundle or an error, never a panic, and a
// bundle decoded re-encodes to exactly the bytes it came from.
func FuzzDecode(f *testing.F) {
	enc, err := sample(f).Encode()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(enc)
	f.Add([]byte(`{"format":1,"files":[]}`))
	f.Add([]byte(`{"format":1,"files":[{"path":"devices.toml","data":""},{"path":"scenes/a.toml","data":"eA=="}]}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := bundle.Decode(data)
		if err != nil {
			return
		}
		again, err := b.Encode()
		if err != nil || !bytes.Equal(again, data) {
			t.Fatalf("decoded %q but re-encodes to %q (%v)", data, again, err)
		}
		if b.Hash() != bundle.HashOf(data) {
			t.Fatal("hash differs from the hash of the bytes")
		}
	})
}

// FuzzParseSettings: settings.toml of any content is taken or refused,
// and what is taken renders back to the same values.
func FuzzParseSettings(f *testing.F) {
	f.Add([]byte("[location]\nlatitude = 1.5\nlongitude = 2.0\ntimezone = \"UTC\"\n"))
	f.Add([]byte("[location]\nlatitude = 1e300\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := bundle.ParseSettings(data)
		if err != nil {
			return
		}
		again, err := bundle.ParseSettings(s.Encode())
		if err != nil {
			t.Fatalf("rendered settings refused: %v\n%s", err, s.Encode())
		}
		if !bytes.Equal(again.Encode(), s.Encode()) {
			t.Fatalf("settings changed when rendered and read again")
		}
	})
}
