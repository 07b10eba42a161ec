package devices_test

import (
	"fmt"

	"github.com/sortie-edge/sortie/devices"
)

func ExampleRegistry_Check() {
	r, err := devices.ParseRegistry([]byte(`
[types.ac.actions.set]
params.power = { type = "enum", values = ["on", "off"] }
params.target = { type = "int", min = 16, max = 30 }

[[devices]]
id = "living-ac"
type = "ac"
`), "home.toml")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(r.Check("living-ac", "set", map[string]any{"power": "on", "target": 22}))
	fmt.Println(r.Check("living-ac", "set", map[string]any{"target": 35}))
	fmt.Println(r.Check("living-ac", "fly", nil))
	// Output:
	// <nil>
	// device living-ac: action set: target: 35 is above max 30
	// device living-ac: action "fly": no such action for type ac (it has set)
}

func ExampleParseRegistry() {
	_, err := devices.ParseRegistry([]byte(`
[types.lamp.actions.set]
params.level = { type = "int", mn = 0 }
`), "home.toml")
	fmt.Println(err)
	// Output:
	// invalid device registry: home.toml: unknown key types.lamp.actions.set.params.level.mn
}
