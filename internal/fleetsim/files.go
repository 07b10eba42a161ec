package fleetsim

import (
	"github.com/sortie-edge/sortie/bundle"
)

// Registry is the devices.toml of DefaultFiles: three lights, one of
// which ("porch-light") no scene of DefaultFiles uses.
const Registry = `[types.light]
description = "Dimmable light"

[types.light.actions.turn_on]
expect = { power = "on" }
params.brightness = { type = "int", min = 1, max = 100 }

[types.light.actions.turn_off]
expect = { power = "off" }

[types.light.actions.set]
params.power = { type = "enum", values = ["on", "off"] }
params.brightness = { type = "int", min = 0, max = 100 }

[[devices]]
id = "hall-light"
type = "light"
name = "Hall light"
room = "hall"

[[devices]]
id = "kitchen-light"
type = "light"
name = "Kitchen light"
room = "kitchen"

[[devices]]
id = "porch-light"
type = "light"
name = "Porch light"
room = "porch"
`

// Scene is a scene file of DefaultFiles, scenes/arrive.toml.
const Scene = `[[scene]]
name = "arrive"
description = "Hall and kitchen lights on"

[[scene.step]]
device = "hall-light"
action = "turn_on"

[[scene.step]]
device = "kitchen-light"
action = "turn_on"
`

// DefaultFiles is the configuration light gateways start on unless
// Options.Files says otherwise: Registry and Scene.
func DefaultFiles() (*bundle.Bundle, error) {
	return With(map[string]string{"arrive.toml": Scene})
}

// With is a bundle of Registry and the scene files given (name: its
// TOML): the bundles a test offers the fleet.
func With(scenes map[string]string) (*bundle.Bundle, error) {
	return WithRegistry([]byte(Registry), scenes)
}

// WithRegistry is With for another devices.toml.
func WithRegistry(registry []byte, scenes map[string]string) (*bundle.Bundle, error) {
	files := []bundle.File{{Path: bundle.RegistryFile, Data: registry}}
	for name, src := range scenes {
		files = append(files, bundle.File{Path: bundle.SceneDir + name, Data: []byte(src)})
	}
	return bundle.New("", files)
}
