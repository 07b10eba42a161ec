// Package check validates a configuration bundle with the rules "agent
// validate" and "agent run" apply to the same files: the registry is
// parsed by devices.ParseRegistry, the scenes by scenes.LoadFiles against
// it, the settings by bundle.ParseSettings, and a sun schedule needs a
// position (Location). There is no second set of rules here, only the
// one the agent uses, run over a bundle's bytes.
//
// It imports the device layer (for the registry's rules), unlike package
// bundle; a hub that validates bundles before it stores them links it.
package check

import (
	"errors"
	"fmt"

	"github.com/sortie-edge/sortie/bundle"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/scenes"
)

// Set is a validated bundle: what an agent runs. Read-only once built.
type Set struct {
	Bundle *bundle.Bundle
	// Hash is Bundle.Hash().
	Hash     string
	Registry *devices.Registry
	Catalog  *scenes.Catalog
	Settings bundle.Settings
}

// Bundle validates every file of b and returns what it configures. The
// error lists every problem it found, one per line, each naming its file.
func Bundle(b *bundle.Bundle) (*Set, error) {
	if err := b.Check(); err != nil {
		return nil, err
	}
	data, _ := b.File(bundle.RegistryFile) // Check made sure it is there
	reg, err := devices.ParseRegistry(data, bundle.RegistryFile)
	if err != nil {
		return nil, err
	}
	var settings bundle.Settings
	if data, ok := b.File(bundle.SettingsFile); ok {
		if settings, err = bundle.ParseSettings(data); err != nil {
			return nil, err
		}
	}
	var files []scenes.SourceFile
	for _, f := range b.Scenes() {
		files = append(files, scenes.SourceFile{Name: f.Path, Data: f.Data})
	}
	cat, err := scenes.LoadFiles(files, reg)
	if err != nil {
		return nil, err
	}
	if err := Location(cat, settings.Location.HasPosition()); err != nil {
		return nil, err
	}
	return &Set{Bundle: b, Hash: b.Hash(), Registry: reg, Catalog: cat, Settings: settings}, nil
}

// Location reports the sun schedules of cat that cannot be placed when
// the gateway has no position, so that a configuration is refused when
// it is checked rather than when its schedules would start.
func Location(cat *scenes.Catalog, hasPosition bool) error {
	if hasPosition {
		return nil
	}
	var errs []error
	for _, s := range cat.Schedules() {
		if s.Sun != nil {
			errs = append(errs, fmt.Errorf("schedule %s: a sun schedule needs the gateway's [location] latitude and longitude", s.ID()))
		}
	}
	return errors.Join(errs...)
}
