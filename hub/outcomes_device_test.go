package hub

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/uplink"
)

// TestDeviceOutcomesCountTheDeviceAMissionFailedOn feeds finished
// missions whose step tables name two devices of gateway "a" and reads
// each device's roll-up: a mission counts once for every device a step
// of it began on, as failed (or undone) only for the device whose step
// failed, and a step that gave way counts for its device. A mission from
// a gateway without step tables counts for no device.
func TestDeviceOutcomesCountTheDeviceAMissionFailedOn(t *testing.T) {
	st := testStore(t)
	now := time.Date(2026, 12, 6, 21, 30, 0, 0, time.UTC)
	at := now.Add(-20 * time.Minute)
	table := func(e uplink.Entry, status ...driver.StepStatus) uplink.Entry {
		e.Mission.StepIDs = []string{"lamp-on", "lock-door"}
		e.Mission.StepNames = []string{"turn_on lamp brightness=40", "lock lock"}
		e.Mission.StepTargets = []string{"lamp", "lock"}
		e.Mission.StepStatus = status
		return e
	}
	fin := func(oseq uint64, id string, state driver.State, undone int) uplink.Entry {
		e := entry(oseq, id, 2, state)
		e.Mission.Created, e.Mission.Updated, e.Mission.Finished, e.Mission.Undone = at.Add(-time.Second), at, at, undone
		e.Event.Time = at
		return e
	}
	started := func(oseq uint64, id string) uplink.Entry {
		e := entry(oseq, id, 1, driver.StateRunning)
		e.Mission.Created, e.Event.Time = at.Add(-time.Second), at.Add(-time.Second)
		return e
	}
	noTable := func(e uplink.Entry) uplink.Entry { e.Mission.StepIDs = nil; return e }
	ok, failed, undone, pending := driver.StepSucceeded, driver.StepFailed, driver.StepCompensated, driver.StepPending
	gaveWay := table(entry(11, "m7", 1, driver.StateRunning))
	gaveWay.Event.Input, gaveWay.Event.Code, gaveWay.Event.Step, gaveWay.Event.Time = driver.InStepError, driver.CodeSuperseded, 1, at
	b := batch("a",
		table(fin(1, "m1", driver.StateSucceeded, 0), ok, ok),
		table(fin(2, "m2", driver.StateFailed, 1), undone, failed),
		table(fin(3, "m3", driver.StateFailed, 0), failed, pending),
		table(fin(4, "m4", driver.StateCancelled, 0), ok, pending),
		fin(5, "m5", driver.StateFailed, 0), // a gateway before step tables
		// m6 sends its table first, its end without one: the hub keeps
		// the table, but has no step statuses to count by.
		table(started(6, "m6")),
		noTable(fin(7, "m6", driver.StateFailed, 0)),
		gaveWay,
	)
	if _, err := ingest(st, now, "a", b); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	type counts struct{ succeeded, failed, undone, cancelled, superseded, durations int64 }
	read := func(dev string) counts {
		t.Helper()
		rows, err := st.OutcomeHours(ctx, scopeDevice("a", dev), 0, now.Unix()/3600+1)
		if err != nil {
			t.Fatal(err)
		}
		var c counts
		for _, r := range rows {
			c.succeeded += r[oSucceeded]
			c.failed += r[oFailed]
			c.undone += r[oUndone]
			c.cancelled += r[oCancelled]
			c.superseded += r[oSuperseded]
			for k := range histBuckets {
				c.durations += r[oHist+k]
			}
		}
		return c
	}
	for dev, want := range map[string]counts{
		"lamp": {succeeded: 2, failed: 1, cancelled: 1, durations: 4},
		"lock": {succeeded: 1, undone: 1, superseded: 1, durations: 2},
	} {
		if got := read(dev); got != want {
			t.Errorf("device %s: %+v, want %+v", dev, got, want)
		}
	}
	d, err := st.Mission(ctx, "a", "m6")
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Summary.StepTargets; len(got) != 2 || got[1] != "lock" || len(d.Summary.StepNames) != 2 {
		t.Errorf("m6's step table after an entry without one: targets %q names %q, want kept", got, d.Summary.StepNames)
	}
}

// TestDeviceRollupOfAMissionIsCapped: a mission whose step table names
// a thousand distinct devices (a gateway's bug, or malice) adds rows for
// maxMissionDevices of them, the one its failed step commanded among
// them; retried to success, it takes back what it added from the same
// rows and counts for the same number of devices.
func TestDeviceRollupOfAMissionIsCapped(t *testing.T) {
	st := testStore(t)
	now := time.Date(2026, 12, 6, 21, 30, 0, 0, time.UTC)
	at := now.Add(-20 * time.Minute)
	const n = 1000
	table := func(e uplink.Entry, failedAt int) uplink.Entry {
		s := &e.Mission
		s.StepIDs, s.StepNames, s.StepTargets, s.StepStatus = make([]string, n), make([]string, n), make([]string, n), make([]driver.StepStatus, n)
		for i := range n {
			s.StepIDs[i], s.StepNames[i], s.StepTargets[i], s.StepStatus[i] = fmt.Sprintf("s%d", i), "turn_on", fmt.Sprintf("dev-%04d", i), driver.StepSucceeded
		}
		if failedAt >= 0 {
			s.StepStatus[failedAt] = driver.StepFailed
		}
		s.Created, s.Updated, s.Finished = at.Add(-time.Second), at, at
		e.Event.Time = at
		return e
	}
	if _, err := ingest(st, now, "a", batch("a", table(entry(1, "m1", 1, driver.StateFailed), 900))); err != nil {
		t.Fatal(err)
	}
	totals := func() map[string]OutcomeTotal {
		t.Helper()
		got, err := st.(totalsReader).OutcomeTotals(t.Context(), "d/a/", 0, now.Unix()/3600+1)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	got := totals()
	if len(got) != maxMissionDevices || got["dev-0900"][oFailed] != 1 || got["dev-0000"][oSucceeded] != 1 {
		t.Fatalf("%d device rows (dev-0900 %v, dev-0000 %v), want %d with dev-0900 failed", len(got), got["dev-0900"], got["dev-0000"], maxMissionDevices)
	}
	if _, ok := got[fmt.Sprintf("dev-%04d", maxMissionDevices-1)]; ok {
		t.Errorf("the %dth device counted: the failed one should have taken its place", maxMissionDevices)
	}
	// An operator's retry succeeds: the failure is taken back.
	retry := table(entry(2, "m1", 2, driver.StateRunning), -1)
	retry.Mission.Finished = time.Time{}
	if _, err := ingest(st, now, "a", batch("a", retry, table(entry(3, "m1", 3, driver.StateSucceeded), -1))); err != nil {
		t.Fatal(err)
	}
	counted := 0
	for dev, tot := range totals() {
		if tot[oFailed] != 0 || tot[oSucceeded] > 1 {
			t.Errorf("%s after the retry: %v", dev, tot)
		}
		counted += int(tot[oSucceeded])
	}
	if counted != maxMissionDevices {
		t.Errorf("%d devices count the retried mission, want %d", counted, maxMissionDevices)
	}
}
