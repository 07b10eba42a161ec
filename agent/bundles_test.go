package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/bundle"
	"github.com/sortie-edge/sortie/bundle/check"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/mqttc"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/uplink"
)

// The scenes of the bundle tests. "slow" waits, then turns a light on:
// long enough to be running when another bundle is applied.
const (
	slowV1 = `[[scene]]
name = "slow"
mode = "parallel"
[[scene.step]]
delay = "400ms"
[[scene.step]]
device = "living-light"
action = "turn_on"
`
	// slowV2 adds a step: a mission built from it has three.
	slowV2 = slowV1 + `[[scene.step]]
device = "kitchen-light"
action = "turn_on"
`
	// silent uses a device of the registry the simulated home does not
	// run: it never answers.
	silent = `[[scene]]
name = "bedroom"
[[scene.step]]
device = "bedroom-light"
action = "turn_on"
`
	// typo names a device the registry does not have.
	typo = `[[scene]]
name = "typo"
[[scene.step]]
device = "no_such_lamp"
action = "turn_on"
`
)

// makeBundle is the shipped registry and the given scene files.
func makeBundle(t testing.TB, sceneFiles map[string]string) *bundle.Bundle {
	t.Helper()
	reg, err := os.ReadFile(testkit.RepoPath("configs/devices.toml"))
	if err != nil {
		t.Fatal(err)
	}
	files := []bundle.File{{Path: bundle.RegistryFile, Data: reg}}
	for name, src := range sceneFiles {
		files = append(files, bundle.File{Path: bundle.SceneDir + name, Data: []byte(src)})
	}
	b, err := bundle.New("", files)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func encode(t testing.TB, b *bundle.Bundle) []byte {
	t.Helper()
	enc, err := b.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return enc
}

// bundleRig is the metrics tests' whole agent (embedded broker on
// 127.0.0.1, bbolt in a temporary directory, a simulated home of two
// lights and the AC, no bedroom light) started from the files bundle
// given.
type bundleRig struct {
	*metricsRig
	dir string
}

func startBundleRig(t *testing.T, dir string, files *bundle.Bundle, tune func(*Options)) *bundleRig {
	t.Helper()
	set, err := check.Bundle(files)
	if err != nil {
		t.Fatal(err)
	}
	m := startMetricsRig(t, dir, func(o *Options) {
		o.Registry, o.Catalog, o.Version = set.Registry, set.Catalog, "v1.0.0"
		o.Bundles = &BundleOptions{Files: files, Soak: 300 * time.Millisecond, Confirm: 2 * time.Second}
		if tune != nil {
			tune(o)
		}
	})
	return &bundleRig{metricsRig: m, dir: dir}
}

func (r *bundleRig) apply(b *bundle.Bundle) api.BundleOutcome {
	r.t.Helper()
	out, err := r.a.Apply(context.Background(), encode(r.t, b))
	if err != nil {
		r.t.Fatal(err)
	}
	return out
}

func (r *bundleRig) config() api.ConfigInfo {
	r.t.Helper()
	c, err := r.a.Config()
	if err != nil {
		r.t.Fatal(err)
	}
	return c
}

// waitLast waits, bounded, for the latest outcome to be status: the
// trial ends on the agent's own timer, which the test does not drive.
func (r *bundleRig) waitLast(status string) api.ConfigInfo {
	r.t.Helper()
	var c api.ConfigInfo
	testkit.Until(r.t, 15*time.Second, func() error {
		if c = r.config(); c.Last == nil || c.Last.Status != status {
			return fmt.Errorf("latest outcome %+v, want %s", c.Last, status)
		}
		return nil
	})
	return c
}

func (r *bundleRig) steps(id string) int {
	r.t.Helper()
	m, err := r.a.drv.Get(context.Background(), id)
	if err != nil {
		r.t.Fatal(err)
	}
	return len(m.Steps)
}

func TestAppliedBundleServesNewTriggersWhileARunningMissionFinishesOnTheOld(t *testing.T) {
	v1 := makeBundle(t, map[string]string{"slow.toml": slowV1})
	r := startBundleRig(t, t.TempDir(), v1, nil)
	if c := r.config(); c.Current.Hash != v1.Hash() || c.Current.Source != uplink.SourceFiles {
		t.Fatalf("at start: %+v, want the files, %s", c.Current, bundle.Short(v1.Hash()))
	}
	old := r.trigger("slow", "before")
	r.wait(old, driver.StateRunning)

	v2 := makeBundle(t, map[string]string{"slow.toml": slowV2})
	out := r.apply(v2)
	if out.Status != uplink.BundleApplied || out.Current != v2.Hash() {
		t.Fatalf("apply: %+v", out)
	}
	c := r.config()
	if c.Trial == nil || strings.Join(c.Trial.Scenes, ",") != "slow" || strings.Join(c.Trial.Devices, ",") != "kitchen-light,living-light" {
		t.Fatalf("trial %+v, want slow and its two lights", c.Trial)
	}
	fresh := r.trigger("slow", "after")
	r.wait(old, driver.StateSucceeded)
	r.wait(fresh, driver.StateSucceeded)
	if got := r.steps(old); got != 2 {
		t.Errorf("the mission running at the swap has %d steps, want v1's 2", got)
	}
	if got := r.steps(fresh); got != 3 {
		t.Errorf("the mission triggered after it has %d steps, want v2's 3", got)
	}
	c = r.waitLast(uplink.BundleHealthy)
	if c.Current.Hash != v2.Hash() || c.Current.Source != uplink.SourceLocal || c.Trial != nil {
		t.Fatalf("after the soak: %+v", c)
	}
}

func TestBundleThatDoesNotValidateIsRejectedAndNothingChanges(t *testing.T) {
	v1 := makeBundle(t, map[string]string{"slow.toml": slowV1})
	r := startBundleRig(t, t.TempDir(), v1, nil)
	bad := makeBundle(t, map[string]string{"slow.toml": slowV2, "typo.toml": typo})
	out := r.apply(bad)
	if out.Status != uplink.BundleRejected || out.Reason != uplink.ReasonInvalid ||
		!strings.Contains(out.Message, "scenes/typo.toml") || !strings.Contains(out.Message, "no_such_lamp") {
		t.Fatalf("outcome %+v, want rejected naming the file and the device", out)
	}
	if c := r.config(); c.Current.Hash != v1.Hash() || c.Trial != nil {
		t.Fatalf("after the rejection: %+v", c)
	}
	if id := r.trigger("slow", "still-v1"); r.steps(id) != 2 {
		t.Fatal("a trigger after the rejection did not use v1")
	}
	if _, err := os.Stat(r.dir + "/config/bundles/" + bad.Hash()); !os.IsNotExist(err) {
		t.Errorf("the rejected bundle was stored: %v", err)
	}
}

func TestValidatorThatHangsMeansRejected(t *testing.T) {
	v1 := makeBundle(t, map[string]string{"slow.toml": slowV1})
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	r := startBundleRig(t, t.TempDir(), v1, func(o *Options) {
		o.Bundles.ValidateTimeout = 100 * time.Millisecond
		o.Bundles.Validate = func(b *bundle.Bundle) (*check.Set, error) {
			if b.Hash() != v1.Hash() {
				<-release
			}
			return check.Bundle(b)
		}
	})
	out := r.apply(makeBundle(t, map[string]string{"slow.toml": slowV2}))
	if out.Status != uplink.BundleRejected || out.Reason != uplink.ReasonValidationTimeout {
		t.Fatalf("outcome %+v, want rejected for the timeout", out)
	}
	if c := r.config(); c.Current.Hash != v1.Hash() {
		t.Fatalf("running %s, want v1", bundle.Short(c.Current.Hash))
	}
}

func TestBundleWhoseDevicesNeverAnswerRevertsByItself(t *testing.T) {
	v1 := makeBundle(t, map[string]string{"slow.toml": slowV1})
	r := startBundleRig(t, t.TempDir(), v1, nil)
	broken := makeBundle(t, map[string]string{"slow.toml": slowV1, "bedroom.toml": silent})
	if out := r.apply(broken); out.Status != uplink.BundleApplied {
		t.Fatalf("apply: %+v", out)
	}
	if _, ok := r.a.catalog().Scene("bedroom"); !ok {
		t.Fatal("the bundle's new scene is not in use")
	}
	if v, ok := r.value("sortie_bundle_on_trial"); !ok || v != 1 {
		t.Errorf("sortie_bundle_on_trial = %v (%v) after the apply, want 1", v, ok)
	}
	start := time.Now()
	c := r.waitLast(uplink.BundleReverted)
	if c.Last.Reason != uplink.ReasonDevicesSilent || !strings.Contains(c.Last.Message, "bedroom-light") {
		t.Fatalf("reverted %+v, want for the silent bedroom-light", c.Last)
	}
	if c.Current.Hash != v1.Hash() || c.Current.Source != uplink.SourceFiles {
		t.Fatalf("after the revert: %+v, want v1 from the files", c.Current)
	}
	if _, ok := r.a.catalog().Scene("bedroom"); ok {
		t.Fatal("the reverted bundle's scene is still in use")
	}
	for series, want := range map[string]float64{
		`sortie_bundle_outcomes_total{reason="",status="applied"}`:                1,
		`sortie_bundle_outcomes_total{reason="devices_silent",status="reverted"}`: 1,
		`sortie_bundle_on_trial`: 0,
	} {
		if v, ok := r.value(series); !ok || v != want {
			t.Errorf("%s = %v (%v), want %v", series, v, ok, want)
		}
	}
	t.Logf("reverted %s after the apply (soak 300ms)", time.Since(start).Round(time.Millisecond))
}

func TestMissionOfAChangedSceneFailingRevertsTheBundle(t *testing.T) {
	v1 := makeBundle(t, map[string]string{"slow.toml": slowV1})
	r := startBundleRig(t, t.TempDir(), v1, func(o *Options) { o.Bundles.Soak = time.Minute })
	// A wait for a state the light never reports, bounded: it fails.
	failing := `[[scene]]
name = "never"
[[scene.step]]
wait_for = { device = "living-light", state = { brightness = 7 }, timeout = "200ms" }
`
	b := makeBundle(t, map[string]string{"slow.toml": slowV1, "never.toml": failing})
	if out := r.apply(b); out.Status != uplink.BundleApplied {
		t.Fatalf("apply: %+v", out)
	}
	id := r.trigger("never", "fails")
	r.wait(id, driver.StateFailed)
	c := r.waitLast(uplink.BundleReverted)
	if c.Last.Reason != uplink.ReasonMissionFailed || !strings.Contains(c.Last.Message, id) {
		t.Fatalf("reverted %+v, want for mission %s", c.Last, id)
	}
	if c.Current.Hash != v1.Hash() {
		t.Fatal("not back on v1")
	}
}

func TestStaleAndRepeatedHubOffersNeverMoveTheGatewayBack(t *testing.T) {
	v1 := makeBundle(t, map[string]string{"slow.toml": slowV1})
	r := startBundleRig(t, t.TempDir(), v1, func(o *Options) { o.Bundles.Confirm = time.Minute })
	a, b := makeBundle(t, map[string]string{"slow.toml": slowV2}), makeBundle(t, map[string]string{"slow.toml": slowV1, "x.toml": strings.ReplaceAll(slowV1, "slow", "x")})
	offer := func(id string, v uint64, bb *bundle.Bundle) uplink.ControlResult {
		t.Helper()
		enc := encode(t, bb)
		msg, err := json.Marshal(uplink.Control{ID: id, Action: uplink.ActionBundle, Bundle: &uplink.BundleOffer{Hash: bb.Hash(), Version: v, Bundle: enc}})
		if err != nil {
			t.Fatal(err)
		}
		c, err := uplink.DecodeControl(msg)
		if err != nil {
			t.Fatal(err)
		}
		return r.a.Control(context.Background(), c)
	}
	if res := offer("c2", 2, b); !res.OK {
		t.Fatalf("version 2: %+v", res)
	}
	since := r.config().Current.Since
	if res := offer("c1", 1, a); res.OK || res.Code != "stale" {
		t.Fatalf("version 1 after 2: %+v, want refused as stale", res)
	}
	if res := offer("c2-again", 2, b); !res.OK {
		t.Fatalf("version 2 again: %+v", res)
	}
	c := r.config()
	if c.Current.Hash != b.Hash() || c.Current.Version != 2 || !c.Current.Since.Equal(since) || c.HubVersion != 2 {
		t.Fatalf("after a stale and a repeated offer: %+v (since %v), want version 2 untouched", c.Current, since)
	}
	// A rollback is a newer version of older content.
	if res := offer("c3", 3, a); !res.OK {
		t.Fatalf("version 3: %+v", res)
	}
	if c := r.config(); c.Current.Hash != a.Hash() || c.Current.Version != 3 {
		t.Fatalf("after version 3: %+v", c.Current)
	}
}

func TestRestartDuringTheTrialRevertsAndSaysWhy(t *testing.T) {
	dir := t.TempDir()
	v1 := makeBundle(t, map[string]string{"slow.toml": slowV1})
	r := startBundleRig(t, dir, v1, func(o *Options) { o.Bundles.Soak = time.Hour })
	v2 := makeBundle(t, map[string]string{"slow.toml": slowV2})
	if out := r.apply(v2); out.Status != uplink.BundleApplied {
		t.Fatalf("apply: %+v", out)
	}
	r.stop()
	r2 := startBundleRig(t, dir, v1, nil)
	c := r2.config()
	if c.Current.Hash != v1.Hash() || c.Last == nil || c.Last.Status != uplink.BundleReverted || c.Last.Reason != uplink.ReasonRestarted || c.Last.Hash != v2.Hash() {
		t.Fatalf("after the restart: running %s, last %+v", bundle.Short(c.Current.Hash), c.Last)
	}
}

func TestKeptBundleRunsAgainAfterARestart(t *testing.T) {
	dir := t.TempDir()
	v1 := makeBundle(t, map[string]string{"slow.toml": slowV1})
	r := startBundleRig(t, dir, v1, nil)
	v2 := makeBundle(t, map[string]string{"slow.toml": slowV2})
	r.apply(v2)
	r.waitLast(uplink.BundleHealthy)
	r.stop()
	r2 := startBundleRig(t, dir, v1, nil)
	if c := r2.config(); c.Current.Hash != v2.Hash() || c.FilesHash != v1.Hash() {
		t.Fatalf("after the restart: %+v", c)
	}
	if id := r2.trigger("slow", "v2-after-restart"); r2.steps(id) != 3 {
		t.Fatal("the kept bundle is not what runs after the restart")
	}
}

// TestHubOfferOverTheUplinkIsReportedAndTheHeartbeatCarriesTheHash runs
// the hub's side as a plain MQTT client of a real broker on 127.0.0.1:
// it offers a bundle on the gateway's control topic and reads the
// statuses and the heartbeat.
func TestHubOfferOverTheUplinkIsReportedAndTheHeartbeatCarriesTheHash(t *testing.T) {
	hubBroker := brokertest.Start(t)
	v1 := makeBundle(t, map[string]string{"slow.toml": slowV1})
	r := startBundleRig(t, t.TempDir(), v1, func(o *Options) {
		o.Hub = &HubOptions{URL: hubBroker.URL(), Heartbeat: 100 * time.Millisecond}
	})
	topics := uplink.Topics{}
	hub, err := mqttc.New(mqttc.Options{Broker: hubBroker.URL(), ClientID: "test-hub", Ordered: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hub.Close)
	var mu sync.Mutex
	var statuses []uplink.BundleStatus
	var config *uplink.ConfigState
	if _, err := hub.SubscribeQoS(topics.BundleStatus("home"), 1, func(_ string, p []byte) {
		s, err := uplink.DecodeBundleStatus(p)
		if err != nil {
			t.Errorf("status: %v", err)
			return
		}
		mu.Lock()
		statuses = append(statuses, s)
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := hub.SubscribeQoS(topics.Heartbeat("home"), 0, func(_ string, p []byte) {
		h, err := uplink.DecodeHeartbeat(p)
		if err == nil {
			mu.Lock()
			config = h.Config
			mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := hub.Connect(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		testkit.Eventually(t, 15*time.Second, what, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return cond()
		})
	}
	waitFor("heartbeat with the files' hash", func() bool { return config != nil && config.Hash == v1.Hash() && config.Source == uplink.SourceFiles })

	v2 := makeBundle(t, map[string]string{"slow.toml": slowV2})
	msg, err := json.Marshal(uplink.Control{ID: "offer-7", Action: uplink.ActionBundle,
		Bundle: &uplink.BundleOffer{Hash: v2.Hash(), Version: 7, Rollout: "r1", Bundle: encode(t, v2)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := hub.Publish(topics.Control("home"), msg, false, 1); err != nil {
		t.Fatal(err)
	}
	waitFor("healthy status", func() bool { return len(statuses) > 0 && statuses[len(statuses)-1].Status == uplink.BundleHealthy })
	mu.Lock()
	var seq []string
	for _, s := range statuses {
		seq = append(seq, s.Status)
		if s.Version != 7 || s.Hash != v2.Hash() || s.Rollout != "r1" || s.Gateway != "home" {
			t.Errorf("status %+v, want version 7 of %s, rollout r1", s, bundle.Short(v2.Hash()))
		}
	}
	mu.Unlock()
	if got := strings.Join(seq, ","); got != "received,applied,healthy" {
		t.Errorf("statuses %s, want received,applied,healthy", got)
	}
	waitFor("heartbeat with the bundle's hash", func() bool {
		return config != nil && config.Hash == v2.Hash() && config.Version == 7 && config.Source == uplink.SourceHub && !config.Trial
	})
	if c := r.config(); c.Current.Hash != v2.Hash() {
		t.Fatalf("running %s", bundle.Short(c.Current.Hash))
	}
}

func TestApplyingWhatRunsOnlyRenamesItAndSurvivesARestart(t *testing.T) {
	dir := t.TempDir()
	v1 := makeBundle(t, map[string]string{"slow.toml": slowV1})
	r := startBundleRig(t, dir, v1, nil)
	out := r.apply(v1)
	if out.Status != uplink.BundleHealthy || out.Current != v1.Hash() {
		t.Fatalf("applying what runs: %+v, want healthy at once", out)
	}
	if c := r.config(); c.Current.Source != uplink.SourceLocal || c.Trial != nil {
		t.Fatalf("after: %+v", c.Current)
	}
	r.stop()
	r2 := startBundleRig(t, dir, v1, nil)
	if c := r2.config(); c.Current.Hash != v1.Hash() || c.Current.Source != uplink.SourceLocal || c.Last.Status != uplink.BundleHealthy {
		t.Fatalf("after the restart: %+v, last %+v", c.Current, c.Last)
	}
}

func TestHubBundleWithoutTheHubConnectionRevertsAfterTheConfirmWindow(t *testing.T) {
	v1 := makeBundle(t, map[string]string{"slow.toml": slowV1})
	// A hub address nothing listens on: the uplink never comes up.
	closed := testkit.FreeAddr(t)
	r := startBundleRig(t, t.TempDir(), v1, func(o *Options) {
		o.Hub = &HubOptions{URL: "tcp://" + closed}
		o.Bundles.Confirm = 500 * time.Millisecond
	})
	v2 := makeBundle(t, map[string]string{"slow.toml": slowV2})
	msg, err := json.Marshal(uplink.Control{ID: "c1", Action: uplink.ActionBundle, Bundle: &uplink.BundleOffer{Hash: v2.Hash(), Version: 1, Bundle: encode(t, v2)}})
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := uplink.DecodeControl(msg)
	if err != nil {
		t.Fatal(err)
	}
	if res := r.a.Control(context.Background(), ctl); !res.OK {
		t.Fatalf("offer: %+v", res)
	}
	c := r.waitLast(uplink.BundleReverted)
	if c.Last.Reason != uplink.ReasonUplinkDown || c.Current.Hash != v1.Hash() {
		t.Fatalf("after the window: %+v, running %s", c.Last, bundle.Short(c.Current.Hash))
	}
}

func TestHeartbeatNamesConfigFilesThatNoLongerMakeWhatRuns(t *testing.T) {
	v1 := makeBundle(t, map[string]string{"slow.toml": slowV1})
	edited := makeBundle(t, map[string]string{"slow.toml": slowV1 + "# a hand edit\n"})
	var mu sync.Mutex
	now := v1
	r := startBundleRig(t, t.TempDir(), v1, func(o *Options) {
		o.Bundles.Reread = func() (*bundle.Bundle, error) {
			mu.Lock()
			defer mu.Unlock()
			return now, nil
		}
	})
	if hb := r.a.Heartbeat(context.Background()).Config; hb == nil || hb.Hash != v1.Hash() || hb.Source != uplink.SourceFiles || hb.Files != "" {
		t.Fatalf("on its files: %+v", hb)
	}
	mu.Lock()
	now = edited
	mu.Unlock()
	if hb := r.a.Heartbeat(context.Background()).Config; hb.Hash != v1.Hash() || hb.Files != edited.Hash() {
		t.Fatalf("after a hand edit: %+v, want files %s", hb, bundle.Short(edited.Hash()))
	}
}

func TestHomeAssistantAnnouncesTheScenesOfABundleApplied(t *testing.T) {
	v1 := makeBundle(t, map[string]string{"slow.toml": slowV1})
	r := startBundleRig(t, t.TempDir(), v1, func(o *Options) { o.HomeAssistant = &HomeAssistantOptions{} })
	var mu sync.Mutex
	configs := map[string]string{}
	cancel, err := r.a.broker.Subscribe("homeassistant/button/#", func(topic string, p []byte) {
		mu.Lock()
		configs[topic] = string(p)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cancel)
	other := strings.ReplaceAll(slowV1, `name = "slow"`, `name = "other"`)
	if out := r.apply(makeBundle(t, map[string]string{"other.toml": other})); out.Status != uplink.BundleApplied {
		t.Fatalf("apply: %+v", out)
	}
	testkit.Until(t, 10*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		added, removed := configs["homeassistant/button/sortie_home/other/config"], configs["homeassistant/button/sortie_home/slow/config"]
		if _, seenRemoved := configs["homeassistant/button/sortie_home/slow/config"]; added == "" || !seenRemoved || removed != "" {
			return fmt.Errorf("Home Assistant's configs: %v; want other announced and slow's removed", configs)
		}
		return nil
	})
}

func TestBundleAppliedOnTrialIsSupersededAndJudgedAgainstTheLastKept(t *testing.T) {
	v1 := makeBundle(t, map[string]string{"slow.toml": slowV1})
	r := startBundleRig(t, t.TempDir(), v1, func(o *Options) { o.Bundles.Soak = time.Hour })
	first := makeBundle(t, map[string]string{"slow.toml": slowV2})
	second := makeBundle(t, map[string]string{"slow.toml": slowV2, "bedroom.toml": silent})
	r.apply(first)
	if out := r.apply(second); out.Status != uplink.BundleApplied {
		t.Fatalf("second apply: %+v", out)
	}
	c := r.config()
	if c.Previous == nil || c.Previous.Hash != v1.Hash() {
		t.Fatalf("a revert would go back to %+v, want v1", c.Previous)
	}
	if got := strings.Join(c.Trial.Scenes, ","); got != "bedroom,slow" {
		t.Fatalf("changed scenes %s, want bedroom,slow (against v1, not the bundle superseded)", got)
	}
}
