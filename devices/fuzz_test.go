package devices_test

import (
	"os"
	"testing"

	"github.com/sortie-edge/sortie/devices"
)

func FuzzParseRegistry(f *testing.F) {
	home, err := os.ReadFile(homeFile)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(home)
	f.Add([]byte(minimalType))
	f.Add([]byte(minimalType + "params.l = { type = \"int\", min = 1e300, max = -1 }\n"))
	f.Add([]byte(minimalType + "[types.lamp.actions.on]\nexpect = { power = [1] }\n[[devices]]\nid = \"x\"\ntype = \"lamp\"\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := devices.ParseRegistry(b, "fuzz.toml")
		if err != nil {
			return
		}
		// A registry that loads must answer checks without panicking.
		for _, d := range r.Devices {
			for name, a := range r.Types[d.Type].Actions {
				params := map[string]any{}
				for p := range a.Params {
					params[p] = 1
				}
				_ = r.Check(d.ID, name, params)
				_ = r.Expected(d.ID, name, params)
			}
		}
	})
}
