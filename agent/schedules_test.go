package agent_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/agent"
	"github.com/sortie-edge/sortie/agent/agenttest"
	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/testkit"
)

// submitted collects the request keys of submitted missions.
type submitted struct {
	mu   sync.Mutex
	keys map[string]int
	ch   chan string
}

func (s *submitted) Observe(ev driver.Event, m *driver.Mission) {
	if ev.Input != driver.InSubmit {
		return
	}
	s.mu.Lock()
	s.keys[m.Meta.RequestKey]++
	s.mu.Unlock()
	s.ch <- m.Meta.RequestKey
}

// await waits for the missions of keys.
func (s *submitted) await(t *testing.T, keys ...string) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		s.mu.Lock()
		missing := 0
		for _, k := range keys {
			if s.keys[k] == 0 {
				missing++
			}
		}
		s.mu.Unlock()
		if missing == 0 {
			return
		}
		select {
		case <-s.ch:
		case <-deadline:
			t.Fatalf("%d of the missions %v were not submitted", missing, keys)
		}
	}
}

const scheduleScenes = `
[[scene]]
name = "tick_all"
mode = "parallel"
[[scene.step]]
delay = "1ms"
[[scene.schedule]]
cron = "* * * * *"
timezone = "UTC"
catch_up = "all"

[[scene]]
name = "tick_once"
mode = "parallel"
[[scene.step]]
delay = "1ms"
[[scene.schedule]]
name = "every-minute"
cron = "* * * * *"
timezone = "UTC"

[[scene]]
name = "tick_skip"
mode = "parallel"
[[scene.step]]
delay = "1ms"
[[scene.schedule]]
cron = "* * * * *"
timezone = "UTC"
catch_up = "skip"

[[scene]]
name = "tick_five"
mode = "parallel"
[[scene.step]]
delay = "1ms"
[[scene.schedule]]
cron = "*/5 * * * *"
timezone = "UTC"

[[scene]]
name = "tick_window"
mode = "parallel"
[[scene.step]]
delay = "1ms"
[[scene.schedule]]
cron = "* * * * *"
timezone = "UTC"
catch_up = "all"
catch_up_window = "3m"
`

// TestSchedulesCatchUpByTheirPolicyAfterDowntime: a schedule fires on
// time while the agent runs; after ten minutes away, catch_up = "all"
// runs every missed firing, "once" the latest of them, "skip" none; each
// firing not run is recorded as skipped; none runs twice.
func TestSchedulesCatchUpByTheirPolicyAfterDowntime(t *testing.T) {
	reg, cat := agenttest.Scenes(t, "configs/devices.toml", scheduleScenes)
	dir := t.TempDir()
	t0 := time.Date(2026, 3, 1, 10, 0, 30, 0, time.UTC)
	clock := testkit.NewClock(t0)
	seen := &submitted{keys: map[string]int{}, ch: make(chan string, 1000)}
	tune := func(o *agent.Options) {
		o.Clock = clock
		o.Observers = []driver.Observer{seen}
	}
	id := func(scene, name string, hh, mm int) string {
		return "sched-" + scene + "-" + name + "-" + time.Date(2026, 3, 1, hh, mm, 0, 0, time.UTC).Format("20060102T150405Z")
	}
	a := startAgent(t, dir, cat, reg, tune)
	clock.Set(t0.Add(30 * time.Second))
	seen.await(t, id("tick_all", "1", 10, 1), id("tick_once", "every-minute", 10, 1), id("tick_skip", "1", 10, 1), id("tick_window", "1", 10, 1))
	a.Stop()

	// Ten minutes later: 10:02 to 10:10 were missed, 10:11 is on time.
	clock.Set(time.Date(2026, 3, 1, 10, 11, 30, 0, time.UTC))
	a = startAgent(t, dir, cat, reg, tune)
	seen.await(t, id("tick_all", "1", 10, 11), id("tick_once", "every-minute", 10, 11), id("tick_skip", "1", 10, 11), id("tick_window", "1", 10, 11), id("tick_five", "1", 10, 10))
	ctx := context.Background()
	for _, c := range []struct {
		scene, name string
		run         map[int]string // minute -> outcome/reason
	}{
		{"tick_all", "1", map[int]string{2: "accepted/caught_up", 3: "accepted/caught_up", 10: "accepted/caught_up", 11: "accepted/"}},
		// A firing due on time stands for those missed: none is caught up.
		{"tick_once", "every-minute", map[int]string{11: "accepted/"}},
		// Every five minutes: 10:05 and 10:10 missed, the latest run.
		{"tick_five", "1", map[int]string{1: "none", 2: "none", 3: "none", 4: "none", 5: "skipped/schedule_missed", 6: "none", 7: "none", 8: "none", 9: "none", 10: "accepted/caught_up", 11: "none"}},
		{"tick_skip", "1", map[int]string{11: "accepted/"}},
		// Beyond the 3m window (before 10:08:30): the latest, 10:08, is
		// recorded for itself and those before it, which have none.
		{"tick_window", "1", map[int]string{2: "none", 3: "none", 4: "none", 5: "none", 6: "none", 7: "none", 8: "skipped/schedule_missed", 9: "accepted/caught_up", 10: "accepted/caught_up", 11: "accepted/"}},
	} {
		for mm := 1; mm <= 11; mm++ {
			w, err := a.Why(ctx, id(c.scene, c.name, 10, mm))
			if c.run[mm] == "none" {
				if !errors.Is(err, driver.ErrNotFound) {
					t.Errorf("%s 10:%02d: %+v, %v; want no record", c.scene, mm, w, err)
				}
				continue
			}
			if err != nil {
				t.Errorf("%s 10:%02d: %v", c.scene, mm, err)
				continue
			}
			got := w.Outcome + "/" + w.Reason
			want, ok := c.run[mm]
			switch {
			case mm == 1 && c.scene != "tick_five":
				want = "accepted/"
			case !ok && c.scene == "tick_all":
				want = "accepted/caught_up"
			case !ok:
				want = "skipped/schedule_missed"
			}
			if got != want {
				t.Errorf("%s 10:%02d: %s, want %s (%s)", c.scene, mm, got, want, w.Explanation)
			}
		}
	}
	seen.mu.Lock()
	for k, n := range seen.keys {
		if n != 1 {
			t.Errorf("%s: %d missions", k, n)
		}
	}
	counts := map[string]int{}
	for k := range seen.keys {
		counts[k[:len("sched-tick_xxx")]]++
	}
	seen.mu.Unlock()
	if counts["sched-tick_all"] != 11 || counts["sched-tick_onc"] != 2 || counts["sched-tick_ski"] != 2 || counts["sched-tick_win"] != 4 || counts["sched-tick_fiv"] != 1 {
		t.Errorf("missions per scene = %v, want all 11, once 2, skip 2, window 4, five 1", counts)
	}
	if w, _ := a.Why(ctx, id("tick_window", "1", 10, 8)); !strings.Contains(w.Explanation, "the 6 before it") {
		t.Errorf("the record of the firings beyond the window: %q", w.Explanation)
	}

	var list api.ScheduleList
	if _, err := a.API.Call(ctx, http.MethodGet, "/api/schedules?next=2", nil, &list); err != nil {
		t.Fatal(err)
	}
	sort.Slice(list.Schedules, func(i, j int) bool { return list.Schedules[i].ID < list.Schedules[j].ID })
	if len(list.Schedules) != 5 || list.Schedules[2].ID != "tick_once/every-minute" || len(list.Schedules[2].Next) != 2 ||
		!list.Schedules[2].Next[0].At.Equal(time.Date(2026, 3, 1, 10, 12, 0, 0, time.UTC)) || list.Schedules[2].CatchUp != "once" {
		t.Errorf("schedules = %+v", list.Schedules)
	}
}

// TestFiringsMissedBehindTheLatestHundredAreRecordedByTheLatestOfThem:
// after three hours away, an every-minute schedule records each of the
// latest 100 missed firings (catch_up decides on those), and the older
// ones, passed over, by the latest of them: every firing up to the
// cursor has a mission or a record that accounts for it.
func TestFiringsMissedBehindTheLatestHundredAreRecordedByTheLatestOfThem(t *testing.T) {
	reg, cat := agenttest.Scenes(t, "configs/devices.toml", `
[[scene]]
name = "tick"
mode = "parallel"
[[scene.step]]
delay = "1ms"
[[scene.schedule]]
cron = "* * * * *"
timezone = "UTC"
catch_up = "skip"
catch_up_window = "24h"
`)
	dir := t.TempDir()
	t0 := time.Date(2026, 3, 1, 10, 0, 30, 0, time.UTC)
	clock := testkit.NewClock(t0)
	seen := &submitted{keys: map[string]int{}, ch: make(chan string, 100)}
	tune := func(o *agent.Options) {
		o.Clock = clock
		o.Observers = []driver.Observer{seen}
	}
	id := func(at time.Time) string { return "sched-tick-1-" + at.Format("20060102T150405Z") }
	a := startAgent(t, dir, cat, reg, tune)
	clock.Set(t0.Add(30 * time.Second))
	seen.await(t, id(time.Date(2026, 3, 1, 10, 1, 0, 0, time.UTC)))
	a.Stop()

	// 10:02 to 12:59 missed (178), 13:00 on time; handled oldest first,
	// so its mission comes after every missed firing was decided.
	clock.Set(time.Date(2026, 3, 1, 13, 0, 30, 0, time.UTC))
	a = startAgent(t, dir, cat, reg, tune)
	onTime := time.Date(2026, 3, 1, 13, 0, 0, 0, time.UTC)
	seen.await(t, id(onTime))
	ctx := context.Background()
	summary := onTime.Add(-101 * time.Minute) // 11:19, behind the latest 100
	for at := time.Date(2026, 3, 1, 10, 2, 0, 0, time.UTC); at.Before(onTime); at = at.Add(time.Minute) {
		w, err := a.Why(ctx, id(at))
		if at.Before(summary) {
			if !errors.Is(err, driver.ErrNotFound) {
				t.Errorf("%s: %+v, %v; want no record of its own", at.Format(time.TimeOnly), w, err)
			}
			continue
		}
		if err != nil || w.Outcome != "skipped" || w.Reason != "schedule_missed" {
			t.Errorf("%s: %+v, %v; want skipped/schedule_missed", at.Format(time.TimeOnly), w, err)
			continue
		}
		if at.Equal(summary) && !strings.Contains(w.Explanation, "so were the 77 before it, from 2026-03-01 10:02:00 UTC") {
			t.Errorf("the record of the firings passed over: %q", w.Explanation)
		}
	}
}

const overloadScenes = `
[[scene]]
name = "hold"
deadline = "1h"
[[scene.step]]
delay = "30m"

[[scene]]
name = "tick"
mode = "parallel"
[[scene.step]]
delay = "1ms"
[[scene.schedule]]
cron = "* * * * *"
timezone = "UTC"
catch_up = "skip"
`

// TestAFiringTurnedAwayRunsOnceTaken: a firing the agent cannot take
// (max_live reached) is tried again, as the same firing, and runs once
// there is room, however late; a schedule with catch_up = "skip" does
// not take it for one missed while the agent was away.
func TestAFiringTurnedAwayRunsOnceTaken(t *testing.T) {
	reg, cat := agenttest.Scenes(t, "configs/devices.toml", overloadScenes)
	t0 := time.Date(2026, 3, 1, 10, 0, 30, 0, time.UTC)
	clock := testkit.NewClock(t0)
	seen := &submitted{keys: map[string]int{}, ch: make(chan string, 100)}
	a := startAgent(t, t.TempDir(), cat, reg, func(o *agent.Options) {
		o.Clock = clock
		o.Observers = []driver.Observer{seen}
		o.Driver.MaxLive = 1
	})
	ctx := context.Background()
	var rep struct {
		MissionID string `json:"mission_id"`
	}
	if _, err := a.API.Call(ctx, http.MethodPost, "/api/missions", map[string]any{"scene": "hold", "request_id": "h-1"}, &rep); err != nil {
		t.Fatal(err)
	}
	firing := "sched-tick-1-20260301T100100Z"
	clock.Set(t0.Add(30 * time.Second))
	// Turned away: the record says overloaded, and that it will be tried again.
	// Polled: the scheduler's first try has no event.
	var w api.Why
	testkit.Until(t, 20*time.Second, func() (err error) {
		if w, err = a.Why(ctx, firing); err == nil && w.Reason != "overloaded" {
			err = fmt.Errorf("the firing was not turned away: %+v", w)
		}
		return err
	})
	if !strings.Contains(w.Explanation, "tries the firing again") {
		t.Errorf("explanation %q does not say the schedule tries again", w.Explanation)
	}
	if _, err := a.API.Call(ctx, http.MethodPost, "/api/missions/"+rep.MissionID+"/cancel", nil, nil); err != nil {
		t.Fatal(err)
	}
	// Three minutes on: late, but tried before, so it runs.
	for i := range 3 {
		clock.Set(t0.Add(time.Duration(90+60*i) * time.Second))
	}
	seen.await(t, firing)
	// The mission is there (its record of acceptance follows the reply).
	w, err := a.Why(ctx, firing)
	if err != nil || w.Mission == nil || w.Mission.Mission.Meta.RequestKey != firing {
		t.Fatalf("why %s: %+v, %v", firing, w, err)
	}
}

// TestACursorAheadOfTheClockIsMovedBack: a gateway whose clock was once
// ahead (and wrote its cursors then) fires again from the true time
// rather than waiting for the clock to reach the cursor.
func TestACursorAheadOfTheClockIsMovedBack(t *testing.T) {
	reg, cat := agenttest.Scenes(t, "configs/devices.toml", scheduleScenes)
	dir := t.TempDir()
	clock := testkit.NewClock(time.Date(2030, 1, 1, 0, 0, 30, 0, time.UTC))
	seen := &submitted{keys: map[string]int{}, ch: make(chan string, 1000)}
	tune := func(o *agent.Options) {
		o.Clock = clock
		o.Observers = []driver.Observer{seen}
	}
	a := startAgent(t, dir, cat, reg, tune)
	a.Stop()
	t1 := time.Date(2026, 3, 1, 10, 0, 30, 0, time.UTC)
	clock.Set(t1)
	startAgent(t, dir, cat, reg, tune)
	clock.Set(t1.Add(30 * time.Second))
	seen.await(t, "sched-tick_skip-1-20260301T100100Z", "sched-tick_all-1-20260301T100100Z")
}
