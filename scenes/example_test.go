package scenes_test

import (
	"fmt"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/scenes"
)

func Example() {
	reg, err := devices.LoadRegistry("../configs/devices.toml")
	if err != nil {
		panic(err)
	}
	cat, err := scenes.Parse([]byte(`
[[scene]]
name = "cool_down"
deadline = "1m"

[[scene.step]]
device = "living-ac"
action = "set"
params = { power = "on", mode = "cool", target = { from = "temperature", default = 24 } }
compensate = "restore"
`), "cool_down.toml", reg)
	if err != nil {
		panic(err)
	}

	tr, err := scenes.DecodeTrigger([]byte(`{"scene":"cool_down","request_id":"r-1","params":{"temperature":21}}`))
	if err != nil {
		panic(err)
	}
	spec, err := cat.Build(tr.Scene, tr.Params)
	if err != nil {
		panic(err)
	}
	st := spec.Steps[0]
	fmt.Println(spec.Type, spec.Timeout, st.ID, st.Kind)
	fmt.Println(string(st.Params))
	fmt.Println(st.Compensate.Kind, string(st.Compensate.Params))

	_, err = cat.Build("cool_down", map[string]any{"temperature": 40})
	fmt.Println(err)
	// Output:
	// cool_down 1m0s 1-living-ac device.command
	// {"device":"living-ac","action":"set","params":{"mode":"cool","power":"on","target":21}}
	// device.restore {"device":"living-ac"}
	// invalid_param: param "temperature": 40 is above max 30 (living-ac set.target)
}

func ExampleLoadError() {
	reg, _ := devices.LoadRegistry("../configs/devices.toml")
	_, err := scenes.Parse([]byte(`
[[scene]]
name = "go_home"
[[scene.step]]
device = "living-ac"
action = "set"
params = { target = 35 }
[[scene.step]]
device = "living-light"
action = "turn_on"
colour = "red"
`), "configs/scenes/go_home.toml", reg)
	fmt.Println(err)
	// Output:
	// configs/scenes/go_home.toml: scene "go_home": step 1 (living-ac): params.target: 35 is above max 30
	// configs/scenes/go_home.toml: scene "go_home": step 2 (living-light): colour: unknown key
}
