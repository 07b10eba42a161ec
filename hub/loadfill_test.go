package hub

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"testing"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/uplink"
)

// loadFill is what fillLoad put in a store, for the pages to open.
type loadFill struct {
	Gateways int       `json:"gateways"`
	Missions int       `json:"missions"`
	Now      time.Time `json:"now"`
	// Big is the 500-step mission (its waterfall), on gateway BigGW.
	BigGW string `json:"big_gw"`
	Big   string `json:"big"`
	// Rollout is a rollout to every gateway, its canary offered.
	Rollout string `json:"rollout"`
	// Took is how long the fill took.
	Took time.Duration `json:"took"`
}

// loadScenes are the fleet's scenes: name and step count (3 to 20).
var loadScenes = []struct {
	name  string
	steps int
}{
	{"go_home", 6}, {"leave_home", 9}, {"good_night", 12}, {"wake_up", 5}, {"movie", 4}, {"dinner", 3},
	{"vacation", 20}, {"guests", 8}, {"cleaning", 14}, {"morning_blinds", 7}, {"all_off", 17}, {"reading", 3},
}

// loadDevices is each gateway's inventory, as its heartbeat lists it.
var loadDevices = func() []uplink.DeviceState {
	kinds := []struct{ typ, room string }{
		{"light", "living room"}, {"light", "kitchen"}, {"light", "bedroom"}, {"curtain", "bedroom"},
		{"lock", "hall"}, {"thermostat", "living room"}, {"plug", "office"}, {"sensor", "hall"},
	}
	out := make([]uplink.DeviceState, len(kinds))
	for i, k := range kinds {
		out[i] = uplink.DeviceState{ID: fmt.Sprintf("%s-%d", k.typ, i), Type: k.typ, Name: k.room + " " + k.typ, Room: k.room, Online: i != 7,
			State: map[string]any{"on": i%2 == 0}}
	}
	return out
}()

func loadSceneInfo() []uplink.SceneInfo {
	out := make([]uplink.SceneInfo, len(loadScenes))
	for i, s := range loadScenes {
		out[i] = uplink.SceneInfo{Name: s.name, Description: "runs " + s.name}
		if i%3 == 0 {
			out[i].Params = []uplink.SceneParam{{Name: "level", Default: 50}, {Name: "room", Required: true}}
		}
	}
	return out
}

// loadMix is the outcome of the i-th mission: of 100, 80 succeed (3 of
// them with a step that gave way to a newer mission), 8 fail, 5 fail
// and are undone, 4 are cancelled, 3 cancelled and undone.
func loadMix(i int) (st driver.State, undone int, superseded bool) {
	switch r := i % 100; {
	case r < 77:
		return driver.StateSucceeded, 0, false
	case r < 80:
		return driver.StateSucceeded, 0, true
	case r < 88:
		return driver.StateFailed, 0, false
	case r < 93:
		return driver.StateFailed, 1 + r%4, false
	case r < 97:
		return driver.StateCancelled, 0, false
	default:
		return driver.StateCancelled, 1 + r%3, false
	}
}

// fillLoad stores gws gateways (online, a heartbeat with 8 devices and
// 12 scenes each), n finished missions spread over the 30 days before
// now, a 500-step mission, and a rollout to every gateway, through the
// store's own ingest (Apply) and rollout engine (Fleet): what a hub that
// ran for a month holds. Missions go in by rounds, one per gateway, in
// time order, as gateways send them.
func fillLoad(tb testing.TB, st Backing, gws, n int, now time.Time) loadFill {
	tb.Helper()
	ctx := context.Background()
	start := time.Now()
	ids := make([]string, gws)
	for i := range ids {
		ids[i] = fmt.Sprintf("gw-%05d", i)
	}
	fs, ok := st.(FleetStore)
	if !ok {
		tb.Fatalf("%T keeps no rollouts", st)
	}
	f := NewFleet(fs, FleetOptions{Now: func() time.Time { return now }, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Send: func(string, uplink.Control) error { return nil }})
	if err := f.Load(ctx); err != nil {
		tb.Fatal(err)
	}
	base, _, err := f.PushBundle(ctx, "", mustEncode(tb, testBundle(tb, "", "")))
	if err != nil {
		tb.Fatal(err)
	}
	if _, _, err := f.PushBundle(ctx, "", mustEncode(tb, testBundle(tb, "v2", ""))); err != nil {
		tb.Fatal(err)
	}

	scenes := loadSceneInfo()
	in := make([]Inbound, 0, 2*gws)
	for i, gw := range ids {
		in = append(in,
			Inbound{Gateway: gw, Received: now, Status: &uplink.Status{Gateway: gw, State: "online", Protocol: uplink.Protocol, Version: "v1.4.2", Started: now.Add(-72 * time.Hour), Time: now}},
			Inbound{Gateway: gw, Received: now, Heartbeat: &uplink.Heartbeat{Gateway: gw, Version: "v1.4.2", Uptime: 72 * 3600, Backlog: i % 3, Active: i % 2,
				Devices: loadDevices, Scenes: scenes, Time: now, Config: &uplink.ConfigState{Hash: base.Hash, Source: uplink.SourceFiles, Since: now.Add(-72 * time.Hour)}}})
		if len(in) >= 2000 || i == len(ids)-1 {
			if _, err := st.Apply(ctx, in); err != nil {
				tb.Fatal(err)
			}
			in = in[:0]
		}
	}

	// Missions: round k gives each gateway its k-th mission, so times
	// rise with the gateways' outbox sequences.
	seq := make([]uint64, gws)
	per := (n + gws - 1) / gws
	span := 30*24*time.Hour - time.Hour
	step := span / time.Duration(max(n, 1))
	entries := make([]uplink.Entry, 0, 2)
	done := 0
	for k := 0; k < per && done < n; k++ {
		batch := make([]Inbound, 0, gws)
		for g := 0; g < gws && done < n; g++ {
			i := k*gws + g
			fin := now.Add(-span + time.Duration(i)*step)
			sc := loadScenes[(i/7+g)%len(loadScenes)]
			state, undone, superseded := loadMix(i*7 + g)
			dur := time.Duration(200+(i*7919)%60000) * time.Millisecond
			doneSteps := sc.steps
			sum := driver.Summary{Scene: sc.name, State: state, Steps: sc.steps, Step: sc.steps - 1, Created: fin.Add(-dur), Updated: fin, Finished: fin,
				Source: "voice", Undone: undone}
			if state != driver.StateSucceeded {
				doneSteps = (i % sc.steps)
				sum.Step = doneSteps
				sum.Error = fmt.Sprintf("step %d (lock-4): ack timeout after 5s", doneSteps)
				if state == driver.StateCancelled {
					sum.Error = "cancelled by the operator"
				}
			}
			sum.Done = &doneSteps
			mid := fmt.Sprintf("m-%07d", i)
			entries = entries[:0]
			if superseded {
				seq[g]++
				ev := driver.Event{MissionID: mid, Seq: 1, Type: "transition", Input: driver.InStepError, Step: 1, StepID: "curtain-3", Attempt: 1,
					Code: driver.CodeSuperseded, Error: "superseded by a newer mission", From: driver.StateStepRunning, To: driver.StateStepFailed, Time: fin.Add(-dur / 2)}
				s := sum
				s.State, s.Finished = driver.StateStepFailed, time.Time{}
				entries = append(entries, uplink.Entry{Seq: seq[g], Event: ev, Mission: s})
			}
			seq[g]++
			entries = append(entries, uplink.Entry{Seq: seq[g], Mission: sum, Event: driver.Event{MissionID: mid, Seq: uint64(len(entries) + 1), Type: "transition",
				Input: driver.InComplete, Step: -1, From: driver.StateRunning, To: state, Time: fin}})
			batch = append(batch, Inbound{Gateway: ids[g], Received: now, Batch: &uplink.Batch{Gateway: ids[g], Entries: append([]uplink.Entry(nil), entries...)}})
			done++
		}
		applyRound(tb, st, batch)
	}

	// The 500-step mission, an hour ago, on one gateway.
	bigGW := ids[42%gws]
	big := bigMission("m-500", 500, now.Add(-time.Hour))
	g := 42 % gws
	for i := range big {
		seq[g]++
		big[i].Seq = seq[g]
	}
	for lo := 0; lo < len(big); lo += 250 {
		b := big[lo:min(lo+250, len(big))]
		if _, err := st.Apply(ctx, []Inbound{{Gateway: bigGW, Received: now, Batch: &uplink.Batch{Gateway: bigGW, Entries: b}}}); err != nil {
			tb.Fatal(err)
		}
	}

	// A rollout to every gateway: its canary of 1% offered, a few of them
	// healthy, one failed.
	for _, gw := range ids {
		g, err := st.Gateway(ctx, gw)
		if err != nil {
			tb.Fatal(err)
		}
		f.NoteGateway(g)
	}
	if err := f.Step(ctx); err != nil {
		tb.Fatal(err)
	}
	v, err := f.StartRollout(ctx, RolloutSpec{CanaryPercent: 1, AbortPercent: 50, AbortMin: 20, Soak: driver.Duration(time.Hour)})
	if err != nil {
		tb.Fatal(err)
	}
	if err := f.Step(ctx); err != nil {
		tb.Fatal(err)
	}
	return loadFill{Gateways: gws, Missions: done, Now: now, BigGW: bigGW, Big: "m-500", Rollout: v.ID, Took: time.Since(start)}
}

// fillWorkers is how many transactions a round of the fill applies at
// once: PostgreSQL spends most of one waiting on the round trips, so a
// few at once fill it several times faster (bbolt takes them in turn).
const fillWorkers = 4

// applyRound applies a round of missions (one per gateway, so its
// transactions touch no gateway twice) in transactions of 500 (each a
// fraction of PostgreSQL's 30 s per call), fillWorkers at once, as
// replicas ingesting different gateways do; it returns once all are in,
// so that the next round's entries follow them.
func applyRound(tb testing.TB, st Backing, batch []Inbound) {
	tb.Helper()
	const per = 500
	work := make(chan []Inbound)
	errs := make(chan error, fillWorkers)
	var wg sync.WaitGroup
	for range fillWorkers {
		wg.Go(func() {
			for in := range work {
				if _, err := st.Apply(context.Background(), in); err != nil {
					errs <- err
					for range work { // drain: the round is lost anyway
					}
					return
				}
			}
		})
	}
	for lo := 0; lo < len(batch); lo += per {
		work <- batch[lo:min(lo+per, len(batch))]
	}
	close(work)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		tb.Fatal(err)
	}
}

func mustEncode(tb testing.TB, b interface{ Encode() ([]byte, error) }) []byte {
	tb.Helper()
	enc, err := b.Encode()
	if err != nil {
		tb.Fatal(err)
	}
	return enc
}

// loadCacheDir is where filled stores are kept between runs:
// $SORTIE_LOAD_CACHE, default sortie-load under the system's temporary
// directory (never the repository). A fill is reused while it is less
// than loadCacheAge old, so that its 30 days stay about the last 30.
func loadCacheDir(tb testing.TB) string {
	tb.Helper()
	dir := os.Getenv("SORTIE_LOAD_CACHE")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "sortie-load")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	return dir
}

const loadCacheAge = 6 * time.Hour

// fillVersion names the fill's shape in the cache's file names: change
// it when fillLoad changes.
const fillVersion = 1

// cachedFill reads the facts of a cached fill named name, if it is
// there and fresh.
func cachedFill(dir, name string) (loadFill, bool) {
	b, err := os.ReadFile(filepath.Join(dir, name+".json"))
	if err != nil {
		return loadFill{}, false
	}
	var f loadFill
	if json.Unmarshal(b, &f) != nil || time.Since(f.Now) > loadCacheAge {
		return loadFill{}, false
	}
	return f, true
}

// keepFill writes a fill's facts beside its data, last: a fill without
// them is not used.
func keepFill(tb testing.TB, dir, name string, f loadFill) {
	tb.Helper()
	b, err := json.Marshal(f)
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".json"), b, 0o644); err != nil {
		tb.Fatal(err)
	}
}
