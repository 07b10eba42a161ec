package agent

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/bundle"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/simulator"
	"github.com/sortie-edge/sortie/uplink"
)

// The registry tests' additions to the shipped registry: a Zigbee
// light paired with a Zigbee2MQTT bridge, and a Tasmota dimmer at a
// topic (%s).
const (
	porchDevice = `
[[devices]]
id = "porch-light"
type = "light"
name = "Porch light"
protocol = "zigbee2mqtt"
address = "Porch"
`
	deskDevice = `
[[devices]]
id = "desk-lamp"
type = "light"
protocol = "tasmota"
address = "%s"
`
)

// turnOn is a scene of one step that turns a light on at brightness.
func turnOn(scene, device string, brightness int) string {
	return fmt.Sprintf("[[scene]]\nname = %q\n[[scene.step]]\ndevice = %q\naction = \"turn_on\"\nparams = { brightness = %d }\n", scene, device, brightness)
}

// registryBundle is the shipped registry with extra appended, and the
// given scene files.
func registryBundle(t testing.TB, extra string, sceneFiles map[string]string) *bundle.Bundle {
	t.Helper()
	reg, err := os.ReadFile(testkit.RepoPath("configs/devices.toml"))
	if err != nil {
		t.Fatal(err)
	}
	return mustBundle(t, string(reg)+extra, sceneFiles)
}

func startBridge(t *testing.T, r *bundleRig) *simulator.Zigbee2MQTT {
	t.Helper()
	z, err := simulator.StartZigbee2MQTT(t.Context(), simulator.Z2MConfig{Broker: r.a.broker.URL(), Timeout: 300 * time.Millisecond,
		Devices: []simulator.Z2MDevice{{Name: "Porch", Kind: "light", Delay: 10 * time.Millisecond}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(z.Close)
	return z
}

func (r *bundleRig) deviceIDs() []string {
	var ids []string
	for _, d := range r.a.dev.Registry().Devices {
		ids = append(ids, d.ID)
	}
	return ids
}

// A bundle that adds a Zigbee2MQTT device and a scene using it is
// applied while a mission on another device runs: that mission
// finishes on what it started with, the new scene commands the new
// device, and the revert of a failed trial takes the device and the
// scene away again while the old scenes work on.
func TestBundleAddingAZigbeeDeviceSwapsTheRegistryWhileAMissionRunsAndARevertTakesItAway(t *testing.T) {
	v1 := makeBundle(t, map[string]string{"slow.toml": slowV1})
	r := startBundleRig(t, t.TempDir(), v1, func(o *Options) { o.Bundles.Soak = 2 * time.Second })
	bridge := startBridge(t, r)
	old := r.trigger("slow", "before")
	r.wait(old, driver.StateRunning)

	v2 := registryBundle(t, porchDevice, map[string]string{"slow.toml": slowV1, "porch.toml": turnOn("porch", "porch-light", 60), "bedroom.toml": silent})
	if out := r.apply(v2); out.Status != uplink.BundleApplied {
		t.Fatalf("apply: %+v", out)
	}
	if !slices.Contains(r.deviceIDs(), "porch-light") || !r.a.dev.Speaks("porch-light") {
		t.Fatalf("the device layer runs %v after the apply, without the porch light", r.deviceIDs())
	}
	r.wait(old, driver.StateSucceeded)
	porch := r.trigger("porch", "porch-1")
	r.wait(porch, driver.StateSucceeded)
	if st := bridge.State("Porch"); st["state"] != "ON" {
		t.Fatalf("the porch light has %v after the new scene, want ON", st)
	}
	if c := r.config(); c.Trial == nil || !slices.Contains(c.Trial.Devices, "porch-light") {
		t.Fatalf("trial %+v, want it watching the porch light", c.Trial)
	}

	// The trial fails (the bedroom light never answers): the agent
	// reverts by itself.
	c := r.waitLast(uplink.BundleReverted)
	if c.Last.Reason != uplink.ReasonDevicesSilent || !strings.Contains(c.Last.Message, "bedroom-light") || c.Current.Hash != v1.Hash() {
		t.Fatalf("after the failure: %+v", c)
	}
	if slices.Contains(r.deviceIDs(), "porch-light") || r.a.dev.Speaks("porch-light") {
		t.Fatalf("the device layer still has the porch light after the revert: %v", r.deviceIDs())
	}
	if _, ok := r.a.catalog().Scene("porch"); ok {
		t.Fatal("the reverted bundle's scene is still in use")
	}
	back := r.trigger("slow", "after-revert")
	r.wait(back, driver.StateSucceeded)
	if got := r.steps(back); got != 2 {
		t.Errorf("slow after the revert has %d steps, want v1's 2", got)
	}
}

// A bundle that moves a Tasmota device to another topic (flashed anew)
// takes effect for the commands sent after it.
func TestBundleChangingATasmotaTopicTakesEffectForNewCommands(t *testing.T) {
	v1 := registryBundle(t, strings.Replace(deskDevice, "%s", "tasmota_OLD", 1), map[string]string{"desk.toml": turnOn("desk", "desk-lamp", 30)})
	r := startBundleRig(t, t.TempDir(), v1, nil)
	lamp := func(topic string) *simulator.Tasmota {
		l, err := simulator.StartTasmota(t.Context(), simulator.TasmotaConfig{Conn: simulator.Conn{Broker: r.a.broker.URL()},
			Topic: topic, Kind: "dimmer", WiFiFaults: simulator.WiFiFaults{Delay: 10 * time.Millisecond}, Dimmer: 20})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		return l
	}
	before, after := lamp("tasmota_OLD"), lamp("tasmota_NEW")
	r.wait(r.trigger("desk", "on-old"), driver.StateSucceeded)
	if before.Dimmer() != 30 {
		t.Fatalf("the lamp at the old topic is at %d", before.Dimmer())
	}
	v2 := registryBundle(t, strings.Replace(deskDevice, "%s", "tasmota_NEW", 1), map[string]string{"desk.toml": turnOn("desk", "desk-lamp", 80)})
	if out := r.apply(v2); out.Status != uplink.BundleApplied {
		t.Fatalf("apply: %+v", out)
	}
	r.wait(r.trigger("desk", "on-new"), driver.StateSucceeded)
	if after.Dimmer() != 80 || !after.Power() {
		t.Errorf("the lamp at the new topic is power %v, dimmer %d, want on at 80", after.Power(), after.Dimmer())
	}
	if got := before.Applied(); len(got) != 2 {
		t.Errorf("the lamp at the old topic applied %q, want only the command before the swap", got)
	}
	r.waitLast(uplink.BundleHealthy)
}

// A restart on a kept bundle whose registry differs from the files'
// opens the device layer with the bundle's registry.
func TestRestartOnABundleWithAnotherRegistryRunsItsRegistry(t *testing.T) {
	dir := t.TempDir()
	v1 := makeBundle(t, map[string]string{"slow.toml": slowV1})
	r := startBundleRig(t, dir, v1, nil)
	startBridge(t, r)
	v2 := registryBundle(t, porchDevice, map[string]string{"slow.toml": slowV1, "porch.toml": turnOn("porch", "porch-light", 60)})
	r.apply(v2)
	r.wait(r.trigger("porch", "porch-1"), driver.StateSucceeded) // heard from within the soak
	r.waitLast(uplink.BundleHealthy)
	r.stop()

	r2 := startBundleRig(t, dir, v1, nil)
	bridge := startBridge(t, r2)
	if c := r2.config(); c.Current.Hash != v2.Hash() {
		t.Fatalf("after the restart runs %s, want v2", bundle.Short(c.Current.Hash))
	}
	if hb := r2.a.cfg.heartbeat(); !hb.SwapsRegistry {
		t.Error("the heartbeat does not say the agent swaps registries (swaps_registry)")
	}
	if !r2.a.dev.Speaks("porch-light") {
		t.Fatalf("the device layer after the restart runs %v, not v2's registry", r2.deviceIDs())
	}
	r2.wait(r2.trigger("porch", "porch-2"), driver.StateSucceeded)
	if st := bridge.State("Porch"); st["state"] != "ON" {
		t.Fatalf("the porch light has %v", st)
	}
}

// With users on the embedded broker, what its access rules took from
// the registry at start (the devices its device users are, the Shelly
// adapter's src) changes only at a restart; the rest of the registry
// swaps in.
func TestRegistryChangeTheBrokersAccessRulesCannotFollowIsRejected(t *testing.T) {
	v1 := makeBundle(t, map[string]string{"slow.toml": slowV1})
	r := startBundleRig(t, t.TempDir(), v1, func(o *Options) {
		o.Broker.Users = []BrokerUser{{Name: "kitchen-light", Role: RoleDevice, PasswordHash: testHash(t, "light-password")}}
	})
	reg, err := os.ReadFile(testkit.RepoPath("configs/devices.toml"))
	if err != nil {
		t.Fatal(err)
	}
	withoutKitchen := strings.Replace(string(reg), "id = \"kitchen-light\"", "id = \"kitchen-lamp\"", 1)
	for name, b := range map[string]*bundle.Bundle{
		"device user gone": mustBundle(t, withoutKitchen, map[string]string{"slow.toml": slowV1}),
		"shelly src":       registryBundle(t, "\n[protocols.shelly]\nsrc = \"other\"\n", map[string]string{"slow.toml": slowV1}),
	} {
		out := r.apply(b)
		if out.Status != uplink.BundleRejected || out.Reason != uplink.ReasonRegistryChanged || !strings.Contains(out.Message, "restart") {
			t.Errorf("%s: %+v, want rejected as registry_changed", name, out)
		}
	}
	if c := r.config(); c.Current.Hash != v1.Hash() || slices.Contains(r.deviceIDs(), "kitchen-lamp") {
		t.Fatalf("after the rejections: %+v, devices %v", c.Current, r.deviceIDs())
	}
	if out := r.apply(registryBundle(t, porchDevice, map[string]string{"slow.toml": slowV1, "porch.toml": turnOn("porch", "porch-light", 60)})); out.Status != uplink.BundleApplied {
		t.Fatalf("a registry the broker's rules allow: %+v", out)
	}
}

// mustBundle is the bundle of a directory holding registry and the
// scene files, as "agent apply DIR" reads one.
func mustBundle(t testing.TB, registry string, sceneFiles map[string]string) *bundle.Bundle {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "scenes"), 0o755); err != nil {
		t.Fatal(err)
	}
	files := maps.Clone(sceneFiles)
	files[bundle.RegistryFile] = registry
	for name, src := range files {
		path := filepath.Join(dir, "scenes", name)
		if name == bundle.RegistryFile {
			path = filepath.Join(dir, name)
		}
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := bundle.FromDir(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A bundle that changes only the registry puts the scenes using the
// devices it changed on trial: a Tasmota topic nobody answers on is
// silent by the end of the soak, and the revert puts the old topic back.
func TestRegistryOnlyBundleWatchesTheScenesOfTheDevicesItChanged(t *testing.T) {
	scenes := map[string]string{"desk.toml": turnOn("desk", "desk-lamp", 30), "slow.toml": slowV1}
	v1 := registryBundle(t, strings.Replace(deskDevice, "%s", "tasmota_OLD", 1), scenes)
	r := startBundleRig(t, t.TempDir(), v1, nil)
	lamp, err := simulator.StartTasmota(t.Context(), simulator.TasmotaConfig{Conn: simulator.Conn{Broker: r.a.broker.URL()},
		Topic: "tasmota_OLD", Kind: "dimmer", WiFiFaults: simulator.WiFiFaults{Delay: 10 * time.Millisecond}, Dimmer: 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lamp.Close)
	r.wait(r.trigger("desk", "before"), driver.StateSucceeded)

	wrong := registryBundle(t, strings.Replace(deskDevice, "%s", "tasmota_TYPO", 1), scenes)
	if out := r.apply(wrong); out.Status != uplink.BundleApplied {
		t.Fatalf("apply: %+v", out)
	}
	if c := r.config(); c.Trial == nil || strings.Join(c.Trial.Scenes, ",") != "desk" || strings.Join(c.Trial.Devices, ",") != "desk-lamp" {
		t.Fatalf("trial %+v, want the desk scene and its lamp watched", c.Trial)
	}
	c := r.waitLast(uplink.BundleReverted)
	if c.Last.Reason != uplink.ReasonDevicesSilent || !strings.Contains(c.Last.Message, "desk-lamp") {
		t.Fatalf("reverted %+v, want for the silent desk lamp", c.Last)
	}
	// Confirmed only by what the lamp says on its own topic again.
	r.wait(r.trigger("desk", "after-revert"), driver.StateSucceeded)
}
