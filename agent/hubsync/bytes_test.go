package hubsync

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/driver/drivertest"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/scenes"
	"github.com/sortie-edge/sortie/store"
	"github.com/sortie-edge/sortie/uplink"
)

// stepsScene is a scene of n device steps, each with a parameter, as
// scenes compile them.
func stepsScene(n int) string {
	var b strings.Builder
	b.WriteString("[[scene]]\nname = \"evening\"\n")
	lights := []string{"living-light", "kitchen-light", "bedroom-light"}
	for i := range n {
		fmt.Fprintf(&b, "[[scene.step]]\nid = \"step-%02d-%s\"\ndevice = %q\naction = \"turn_on\"\nparams = { brightness = %d }\n",
			i, lights[i%3], lights[i%3], 10+i%90)
	}
	return b.String()
}

// uplinkEntries runs an n-step scene to its end and returns its outbox
// entries and what they weigh on the uplink (their JSON, as a batch
// carries them), summaries included and apart.
func uplinkEntries(t *testing.T, n int) (es []store.OutboxEntry, total, sums int) {
	t.Helper()
	reg, err := devices.LoadRegistry(testkit.RepoPath("configs/devices.toml"))
	if err != nil {
		t.Fatal(err)
	}
	cat, err := scenes.Parse([]byte(stepsScene(n)), "test.toml", reg)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := cat.Build("evening", nil)
	if err != nil {
		t.Fatal(err)
	}
	db := openStore(t, filepath.Join(t.TempDir(), "sortie.db"))
	noop := driver.HandlerFunc(func(context.Context, driver.StepRequest) (map[string]any, error) { return nil, nil })
	handlers := map[string]driver.Handler{}
	for _, s := range spec.Steps {
		handlers[s.Kind] = noop
	}
	w := drivertest.NewWatcher()
	d, err := driver.New(driver.Options{Store: db, Handlers: handlers, Observers: []driver.Observer{w}, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	m, _, err := d.Submit(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	w.Wait(t, m.ID, driver.StateSucceeded)
	for after := uint64(0); ; {
		page, err := db.Outbox(context.Background(), after, 4096)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		es, after = append(es, page...), page[len(page)-1].Seq
	}
	for _, e := range es {
		p, err := json.Marshal(uplink.Entry(e))
		if err != nil {
			t.Fatal(err)
		}
		s, _ := json.Marshal(e.Mission)
		total += len(p)
		sums += len(s)
	}
	return es, total, sums
}

// TestUplinkBytesOfATwentyStepMission measures what a 20-step mission
// weighs on the uplink, for docs/protocol.md's figure, and that its
// step table goes with its first and last writes only.
func TestUplinkBytesOfATwentyStepMission(t *testing.T) {
	es, total, sums := uplinkEntries(t, 20)
	t.Logf("a 20-step mission: %d outbox entries, %d bytes on the uplink (%d of them summaries)", len(es), total, sums)
	// Before step tables went with the first and last entries only, the
	// same run took 62,939 bytes, 44,472 of them summaries.
	if total > 48<<10 {
		t.Errorf("a 20-step mission takes %d bytes on the uplink, want under 48 KiB", total)
	}
	// The table goes with the first write's entries (the mission
	// created and started at once) and the last write's, none between.
	between := false
	for i, e := range es {
		s := e.Mission
		has := len(s.StepIDs) == 20 && len(s.StepNames) == 20 && len(s.StepTargets) == 20
		between = between || !has && !s.State.Terminal()
		if want := !between || s.State.Terminal(); has != want || !has && (s.StepIDs != nil || s.StepNames != nil || s.StepTargets != nil) {
			t.Errorf("entry %d of %d (%s, %s): step table %d IDs %d names %d targets, want it with the first and last writes only",
				i+1, len(es), e.Event.Input, s.State, len(s.StepIDs), len(s.StepNames), len(s.StepTargets))
		}
	}
	first, last := es[0].Mission, es[len(es)-1].Mission
	if first.StepTargets[4] != "kitchen-light" || first.StepNames[4] != "turn_on kitchen-light brightness=14" || first.StepStatus != nil {
		t.Errorf("step 5 in the first entry: %q on %q, statuses %q; want turn_on kitchen-light brightness=14, no statuses yet", first.StepNames[4], first.StepTargets[4], first.StepStatus)
	}
	if len(last.StepStatus) != 20 || last.StepStatus[19] != driver.StepSucceeded {
		t.Errorf("the last entry's step statuses: %q, want 20, succeeded", last.StepStatus)
	}
}

// TestUplinkBytesOfTheLongestScene measures a mission of the longest
// scene (scenes.MaxSteps) on the uplink: its summaries no longer grow
// with its steps.
func TestUplinkBytesOfTheLongestScene(t *testing.T) {
	es, total, sums := uplinkEntries(t, scenes.MaxSteps)
	t.Logf("a %d-step mission: %d outbox entries, %d bytes on the uplink (%d of them summaries)", scenes.MaxSteps, len(es), total, sums)
	if total > 256<<10 {
		t.Errorf("a %d-step mission takes %d bytes on the uplink, want under 256 KiB", scenes.MaxSteps, total)
	}
}
