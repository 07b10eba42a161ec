package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/bundle"
)

// configStore keeps, under DataDir/config, the bundles a gateway runs
// and the pointer that says which:
//
//	bundles/<hash>   a bundle's canonical encoding (the running one, and
//	                 the one a revert goes back to)
//	state.json       the pointer (configState)
//
// Every file is written whole to a temporary name, fsynced, renamed over
// its name, and the directory fsynced: a power cut leaves the old file
// or the new one, never a mix. A bundle's file is durable before the
// pointer names it, so the pointer never names what is not there; the
// switch from one bundle to another is the one rename of state.json.
type configStore struct {
	dir string
}

// configState is state.json.
type configState struct {
	// Current is the bundle that runs; nil: the files agent.toml names.
	Current *api.ConfigRef `json:"current,omitempty"`
	// Previous is what a revert of Current goes back to; nil: the files.
	Previous *api.ConfigRef `json:"previous,omitempty"`
	// Trial says Current is applied and not yet confirmed healthy; a
	// start that finds it set reverts (commit-confirm: a bundle is kept
	// only once this process saw it healthy).
	Trial bool `json:"trial,omitempty"`
	// HubVersion is the newest version taken from the hub, whatever
	// became of it: an older or equal one is never applied.
	HubVersion uint64 `json:"hub_version,omitempty"`
	// Last is the latest outcome, reported to the hub on every
	// connection when it is about a hub's bundle.
	Last *api.BundleOutcome `json:"last,omitempty"`
}

func openConfigStore(dataDir string) (*configStore, error) {
	s := &configStore{dir: filepath.Join(dataDir, "config")}
	if err := os.MkdirAll(filepath.Join(s.dir, "bundles"), 0o700); err != nil {
		return nil, fmt.Errorf("config store: %w", err)
	}
	// What a crash left half written was never renamed: it is nobody's.
	for _, d := range []string{s.dir, filepath.Join(s.dir, "bundles")} {
		entries, err := os.ReadDir(d)
		if err != nil {
			return nil, fmt.Errorf("config store: %w", err)
		}
		for _, e := range entries {
			if strings.Contains(e.Name(), ".tmp") {
				_ = os.Remove(filepath.Join(d, e.Name())) // a leftover; the next write makes its own
			}
		}
	}
	return s, nil
}

// load reads state.json; none yet is the zero state (the files run).
func (s *configStore) load() (configState, error) {
	var st configState
	data, err := os.ReadFile(filepath.Join(s.dir, "state.json"))
	if errors.Is(err, os.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("config store: %w", err)
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return st, fmt.Errorf("config store: %s: %w", filepath.Join(s.dir, "state.json"), err)
	}
	return st, nil
}

// save makes st the state, durably.
func (s *configStore) save(st configState) error {
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("config store: %w", err)
	}
	if err := writeDurably(s.dir, "state.json", data); err != nil {
		return fmt.Errorf("config store: state: %w", err)
	}
	return nil
}

// put stores a bundle's encoding under its hash, durably.
func (s *configStore) put(hash string, encoded []byte) error {
	if err := writeDurably(filepath.Join(s.dir, "bundles"), hash, encoded); err != nil {
		return fmt.Errorf("config store: bundle %s: %w", bundle.Short(hash), err)
	}
	return nil
}

// get reads the bundle stored under hash and checks that it still is
// what its name says.
func (s *configStore) get(hash string) (*bundle.Bundle, error) {
	data, err := os.ReadFile(filepath.Join(s.dir, "bundles", hash))
	if err != nil {
		return nil, fmt.Errorf("config store: %w", err)
	}
	if got := bundle.HashOf(data); got != hash {
		return nil, fmt.Errorf("config store: bundle %s: its bytes hash to %s", bundle.Short(hash), bundle.Short(got))
	}
	return bundle.Decode(data)
}

// prune deletes the stored bundles st no longer names.
func (s *configStore) prune(st configState) {
	keep := map[string]bool{}
	for _, r := range []*api.ConfigRef{st.Current, st.Previous} {
		if r != nil {
			keep[r.Hash] = true
		}
	}
	entries, err := os.ReadDir(filepath.Join(s.dir, "bundles"))
	if err != nil {
		return // pruning is tidiness; the next one tries again
	}
	for _, e := range entries {
		if !keep[e.Name()] {
			_ = os.Remove(filepath.Join(s.dir, "bundles", e.Name())) // as above
		}
	}
}

// writeDurably writes data to dir/name so that a crash leaves the old
// content or the new, and the new survives a power cut once it returns:
// a temporary file, fsynced, renamed over name, then the directory
// fsynced so that the rename itself is on disk.
func writeDurably(dir, name string, data []byte) error {
	f, err := os.CreateTemp(dir, name+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	if err != nil {
		_ = os.Remove(tmp) // the write failed already; this only tidies
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
