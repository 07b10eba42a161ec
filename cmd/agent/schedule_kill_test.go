package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/agent/agentconf"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/scenes/schedule"
	"github.com/sortie-edge/sortie/store"
)

// TestSIGKILLAroundScheduledFiringsLosesAndDoublesNone runs ten
// every-minute schedules on a clock 600 times faster than real time
// (SORTIE_TEST_CLOCK; a minute is 100 ms) for about a thousand firings,
// and SIGKILLs the agent at random moments in between. Every firing from
// the first start to the last cursor is then accounted for exactly
// once: catch_up = "all" schedules have a mission for each; "once" and
// "skip" ones a mission or a record of the firing skipped, never both;
// no firing has two missions. A start that finds more than the latest
// 100 firings of a schedule missed (the machine was slow, the agent
// behind or down for long) passes the older ones over, and a record
// of the latest of them stands for the rest: what it covers counts as
// skipped, whatever the policy.
func TestSIGKILLAroundScheduledFiringsLosesAndDoublesNone(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the agent for ~20 s")
	}
	// Its own broker, home and agent: it runs beside the other long loops.
	t.Parallel()
	e := newBareEnv(t, "sched")
	e.scenes = filepath.Join(e.dir, "scenes")
	if err := os.MkdirAll(e.scenes, 0o700); err != nil {
		t.Fatal(err)
	}
	policies := map[string]string{"a": "all", "b": "all", "c": "all", "d": "all", "e": "once", "f": "once", "g": "once", "h": "once", "i": "skip", "j": "skip"}
	var sc strings.Builder
	sc.WriteString("[[scene]]\nname = \"tick\"\nmode = \"parallel\"\n[[scene.step]]\ndelay = \"1ms\"\n")
	for _, name := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"} {
		fmt.Fprintf(&sc, "[[scene.schedule]]\nname = %q\ncron = \"* * * * *\"\ntimezone = \"UTC\"\ncatch_up = %q\ncatch_up_window = \"24h\"\n", name, policies[name])
	}
	writeFile(t, filepath.Join(e.scenes, "tick.toml"), sc.String())
	e.writeConfig("embedded = true\nlisten = \"127.0.0.1:0\"\n", "")

	const speed = 600
	simStart := time.Date(2026, 3, 29, 0, 0, 0, 0, time.UTC)
	e.env = []string{fmt.Sprintf("%s=%s,%d,%d", agentconf.TestClockEnv, simStart.Format(time.RFC3339), time.Now().UnixMilli(), speed)}
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))

	kills := 0
	for kills < 12 {
		p := e.start()
		time.Sleep(time.Duration(200+rng.IntN(1300)) * time.Millisecond) // the moment of the kill is the test's input
		p.stop(t, syscall.SIGKILL)
		kills++
	}
	p := e.start()
	time.Sleep(time.Second)
	if code := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d on SIGTERM", code)
	}

	db, err := store.Open(filepath.Join(e.dir, "data", "missions.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }() // read only
	ctx := context.Background()
	cursors, err := db.Cursors(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cron, err := schedule.ParseCron("* * * * *")
	if err != nil {
		t.Fatal(err)
	}
	var firings, ran, skipped, passedOver, caughtUp, lost, doubled int
	for name, policy := range policies {
		var last time.Time
		ok := false
		for k, at := range cursors {
			if strings.HasPrefix(k, "tick/"+name+"#") {
				last, ok = at, true
			}
		}
		if !ok {
			t.Fatalf("schedule %s has no cursor", name)
		}
		// The first start's cursor is the clock then, a little after
		// simStart: its firings count from the first one handled.
		begun := false
		var uncovered []time.Time // firings with neither, oldest first, until a record stands for them
		for at := cron.Next(simStart, time.UTC); !at.After(last); at = cron.Next(at, time.UTC) {
			id := firing(name, at)
			m, merr := db.Lookup(ctx, id)
			tr, terr := db.Trace(ctx, id)
			hasMission := merr == nil
			if merr != nil && !errors.Is(merr, driver.ErrNotFound) {
				t.Fatal(merr)
			}
			if !begun && !hasMission && terr != nil {
				continue
			}
			begun = true
			firings++
			skip, covers := false, -1
			if terr == nil {
				for _, ev := range tr.Evaluations {
					skip = skip || ev.Outcome == "skipped"
					caughtUp += boolInt(ev.Reason == "caught_up")
					if n, ok := standsFor(ev); ok {
						covers = n
					}
				}
			}
			if covers >= 0 {
				// It stands for the firings just before it (a minute apart).
				from := at.Add(-time.Duration(covers) * time.Minute)
				for _, u := range uncovered {
					if u.Before(from) {
						lost++
						t.Errorf("%s (catch_up %s): neither run nor recorded", firing(name, u), policy)
						continue
					}
					passedOver++
				}
				uncovered = uncovered[:0]
			}
			switch {
			case hasMission && skip:
				doubled++
				t.Errorf("%s: both a mission (%s) and a record of being skipped", id, m.ID)
			case hasMission:
				ran++
			case skip && (policy != "all" || covers >= 0):
				skipped++
			case skip:
				lost++
				t.Errorf("%s: skipped, though catch_up = all", id)
			default:
				uncovered = append(uncovered, at)
			}
		}
		for _, u := range uncovered {
			lost++
			t.Errorf("%s (catch_up %s): neither run nor recorded", firing(name, u), policy)
		}
	}
	// A firing has one request ID, which makes one mission: the store's
	// request index and the firings above say so; the missions say it
	// once more, by their keys.
	keys := map[string]int{}
	for f := (driver.Filter{Limit: 1000}); ; {
		ms, next, err := db.List(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			if keys[m.Meta.RequestKey]++; keys[m.Meta.RequestKey] > 1 {
				doubled++
				t.Errorf("two missions for %s", m.Meta.RequestKey)
			}
		}
		if next == "" {
			break
		}
		f.After = next
	}
	if len(keys) < ran {
		t.Errorf("%d missions listed for %d firings run", len(keys), ran)
	}
	t.Logf("%d SIGKILLs; %d firings: %d run (%d caught up after a kill), %d skipped by policy, %d passed over behind the latest 100; lost %d, doubled %d",
		kills, firings, ran, caughtUp, skipped, passedOver, lost, doubled)
	if firings < 500 {
		t.Errorf("only %d firings: the run was too short to say much", firings)
	}
}

// firing is the request ID of schedule name's firing at at.
func firing(name string, at time.Time) string {
	return "sched-tick-" + name + "-" + at.Format("20060102T150405Z")
}

// standsFor reports whether ev is the record of a firing passed over
// with the catch-up policy's bound, and how many firings before it the
// record stands for too.
func standsFor(ev store.Evaluation) (int, bool) {
	if ev.Outcome != "skipped" || !strings.Contains(ev.Message, "behind the latest") && !strings.Contains(ev.Message, "beyond catch_up_window") {
		return 0, false
	}
	m := standsForRE.FindStringSubmatch(ev.Message)
	if m == nil {
		return 0, true
	}
	n, err := strconv.Atoi(m[1])
	return n, err == nil
}

var standsForRE = regexp.MustCompile(`so were the (\d+) before it`)

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
