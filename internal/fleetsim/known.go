package fleetsim

import (
	"slices"
	"strings"
	"sync"

	"github.com/sortie-edge/sortie/bundle"
	"github.com/sortie-edge/sortie/bundle/check"
	"github.com/sortie-edge/sortie/uplink"
)

// known is a configuration as the fleet has judged it, once per hash:
// validating a bundle is pure work over its bytes, so a thousand
// gateways offered the same bundle need one validation, not a thousand.
type known struct {
	hash string
	// decodeErr is set when the bytes are not a bundle; set and err
	// come from bundle/check otherwise.
	decodeErr error
	b         *bundle.Bundle
	set       *check.Set
	err       error
	// registry is the devices.toml the bundle carries (shared bytes).
	registry string
	// scenes and devices are the heartbeat's inventory for it.
	scenes  []uplink.SceneInfo
	devices []uplink.DeviceState
}

// cache holds what the fleet knows about configurations, by hash, and
// which devices a change from one to another puts on trial.
type cache struct {
	mu      sync.Mutex
	byHash  map[string]*known
	changed map[[2]string][]string
	edits   map[string]*known
}

func newCache() *cache {
	return &cache{byHash: map[string]*known{}, changed: map[[2]string][]string{}, edits: map[string]*known{}}
}

// judge returns what the bytes encoded (whose hash is hash) make.
func (c *cache) judge(hash string, encoded []byte) *known {
	c.mu.Lock()
	k := c.byHash[hash]
	c.mu.Unlock()
	if k != nil {
		return k
	}
	k = &known{hash: hash}
	b, err := bundle.Decode(encoded)
	if err != nil {
		k.decodeErr = err
	} else {
		k.fill(b)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.byHash[hash]; old != nil {
		return old
	}
	c.byHash[hash] = k
	return k
}

// of returns what a bundle built in this process makes.
func (c *cache) of(b *bundle.Bundle) (*known, error) {
	enc, err := b.Encode()
	if err != nil {
		return nil, err
	}
	k := c.judge(bundle.HashOf(enc), enc)
	if k.decodeErr != nil {
		return nil, k.decodeErr
	}
	return k, k.err
}

func (k *known) fill(b *bundle.Bundle) {
	k.b = b
	reg, _ := b.File(bundle.RegistryFile)
	k.registry = string(reg)
	k.set, k.err = check.Bundle(b)
	if k.err != nil {
		return
	}
	cat := k.set.Catalog
	for _, name := range cat.Names() {
		info, _ := cat.Scene(name)
		si := uplink.SceneInfo{Name: info.Name, Description: info.Description}
		for _, p := range info.Params {
			si.Params = append(si.Params, uplink.SceneParam{Name: p.Name, Required: p.Required, Default: p.Default})
		}
		k.scenes = append(k.scenes, si)
	}
	for _, d := range k.set.Registry.Devices {
		k.devices = append(k.devices, uplink.DeviceState{ID: d.ID, Type: d.Type, Name: d.Name, Room: d.Room, Online: true})
	}
}

// trialDevices are the devices of the scenes that next changes from
// old, the agent's rule (agent/bundles.go, startTrial): a scene is
// changed when it is new or its file's bytes differ.
func (c *cache) trialDevices(old, next *known) []string {
	key := [2]string{old.hash, next.hash}
	c.mu.Lock()
	devs, ok := c.changed[key]
	c.mu.Unlock()
	if ok {
		return devs
	}
	seen := map[string]bool{}
	cat := next.set.Catalog
	for _, name := range cat.Names() {
		info, _ := cat.Scene(name)
		data, _ := next.b.File(info.File)
		before, had := old.b.File(info.File)
		if had && string(before) == string(data) {
			if _, was := old.set.Catalog.Scene(name); was {
				continue
			}
		}
		for _, d := range cat.Devices(name) {
			if !seen[d] {
				seen[d] = true
				devs = append(devs, d)
			}
		}
	}
	slices.Sort(devs)
	c.mu.Lock()
	c.changed[key] = devs
	c.mu.Unlock()
	return devs
}

// edited is files with one scene file edited by hand: what a gateway's
// config files make after a hand edit, the same edit everywhere.
func (c *cache) edited(files *known) *known {
	c.mu.Lock()
	k := c.edits[files.hash]
	c.mu.Unlock()
	if k != nil {
		return k
	}
	fs := make([]bundle.File, len(files.b.Files))
	copy(fs, files.b.Files)
	for i, f := range fs {
		if strings.HasPrefix(f.Path, bundle.SceneDir) {
			fs[i].Data = append(append([]byte(nil), f.Data...), "\n# edited by hand on the gateway\n"...)
			break
		}
	}
	b, err := bundle.New(files.b.MinAgent, fs)
	if err != nil {
		return files // cannot happen: the same shape as files
	}
	k, err = c.of(b)
	if k == nil || err != nil {
		return files
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.edits[files.hash] = k
	return k
}
