package agent

import (
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/uplink"
)

// TestFailedSwapBackIsRetriedAndShownUntilItPasses: a revert whose swap
// back of the device registry the device layer refuses (a broker away)
// leaves the agent not ready, saying why, and the swap is tried again
// until the device layer runs the registry of what runs.
func TestFailedSwapBackIsRetriedAndShownUntilItPasses(t *testing.T) {
	v1 := makeBundle(t, map[string]string{"slow.toml": slowV1})
	r := startBundleRig(t, t.TempDir(), v1, nil)
	var refuse atomic.Bool
	var refused atomic.Int32
	r.a.cfg.mu.Lock()
	swap := r.a.cfg.swap
	r.a.cfg.swap = func(reg *devices.Registry) error {
		if refuse.Load() {
			refused.Add(1)
			return errors.New("subscription refused by the broker")
		}
		return swap(reg)
	}
	r.a.cfg.mu.Unlock()

	v2 := registryBundle(t, porchDevice, map[string]string{"slow.toml": slowV1, "bedroom.toml": silent})
	if out := r.apply(v2); out.Status != uplink.BundleApplied {
		t.Fatalf("apply: %+v", out)
	}
	refuse.Store(true)
	c := r.waitLast(uplink.BundleReverted) // the bedroom light never answers
	if c.Current.Hash != v1.Hash() {
		t.Fatalf("after the revert: %+v", c)
	}
	if err := r.a.cfg.Problem(); err == nil || !strings.Contains(err.Error(), "swap back failed") {
		t.Fatalf("problem after a refused swap back: %v", err)
	}
	if !slices.Contains(r.deviceIDs(), "porch-light") {
		t.Fatal("the refused swap back changed the device layer")
	}
	testkit.Eventually(t, 10*time.Second, "a second try of the swap back", func() bool { return refused.Load() >= 2 })
	refuse.Store(false)
	testkit.Eventually(t, 15*time.Second, "the swap back to pass", func() bool { return r.a.cfg.Problem() == nil })
	if slices.Contains(r.deviceIDs(), "porch-light") {
		t.Fatalf("the device layer runs %v after the swap back, with the reverted bundle's porch light", r.deviceIDs())
	}
}
