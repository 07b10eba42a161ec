package devices

import (
	"fmt"
	"testing"
	"time"
)

func TestOwnersClaimGiveBackAndEnd(t *testing.T) {
	o := newOwners()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	if v, _ := o.claim("lamp", "m1", "a", at(1), "c1", false); v != claimed {
		t.Fatal("first claim refused")
	}
	o.settle("lamp", "m1", outApplied)
	if v, by := o.claim("lamp", "m3", "b", at(3), "c3", false); v != tookOver || by != "m1" {
		t.Fatalf("newer claim: %d %q, want took over from m1", v, by)
	}
	if v, by := o.claim("lamp", "m2", "c", at(2), "c2", false); v != newerHas || by != "m3" {
		t.Fatalf("older mission of another scene claimed after a newer one: %d %q", v, by)
	}
	if v, _ := o.claim("lamp", "m2b", "b", at(2), "c2b", false); v != claimed {
		t.Fatal("an older run of the owner's own scene was refused: its mode orders them")
	}
	if c, _ := o.get("lamp"); c.mission != "m3" {
		t.Fatalf("owner %s after a same-scene older send, want m3 kept", c.mission)
	}
	if v, by := o.claim("lamp", "m4", "d", at(4), "c4", true); v != heldBy || by != "m3" {
		t.Fatalf("a yielding claim on a live mission's device: %d %q, want held by m3", v, by)
	}
	// m3's command applied, then a second one of m3 refused: m3 keeps the
	// device, its first change is still on it.
	o.settle("lamp", "m3", outApplied)
	o.claim("lamp", "m3", "b", at(3), "c3b", false)
	if o.settle("lamp", "m3", outRefused) {
		t.Fatal("a refused second command gave the device back though m3's first change stands")
	}
	if o.settle("lamp", "m3", outUndone) != true {
		t.Fatal("undoing m3's only change did not give the device back")
	}
	if c, _ := o.get("lamp"); c.mission != "m1" {
		t.Fatalf("owner %s after m3's change was undone, want m1", c.mission)
	}
	if got := o.end("m1"); len(got) != 1 || got[0] != "lamp" {
		t.Errorf("end(m1) = %v, want [lamp]", got)
	}
	if c, _ := o.get("lamp"); !c.ended {
		t.Error("m1's claim not ended")
	}
}

// TestOwnersChainStaysBounded: a device changed by 10,000 missions one
// after another, each ending, keeps a claim chain no longer than the
// live missions.
func TestOwnersChainStaysBounded(t *testing.T) {
	o := newOwners()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 10000 {
		id := fmt.Sprintf("m%05d", i)
		o.claim("lamp", id, "s", t0.Add(time.Duration(i)*time.Millisecond), "c", false)
		o.settle("lamp", id, outApplied)
		o.end(id)
	}
	n := 0
	for c := o.by["lamp"]; c != nil; c = c.prev {
		n++
	}
	if n > 2 || len(o.byMission) != 0 || len(o.told) != 0 {
		t.Fatalf("chain %d, byMission %d, told %d after 10,000 ended missions: want all bounded", n, len(o.byMission), len(o.told))
	}
}

// TestOwnersRetriedMissionIsLiveAgain: a mission that ended (FAILED) and
// is retried by an operator claims its device as a live owner again.
func TestOwnersRetriedMissionIsLiveAgain(t *testing.T) {
	o := newOwners()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	o.claim("lamp", "m1", "a", now, "c1", false)
	o.settle("lamp", "m1", outApplied)
	o.end("m1")
	o.claim("lamp", "m1", "a", now, "c1-retry", false)
	if c, _ := o.get("lamp"); c.ended {
		t.Fatal("the retried mission's claim is still ended")
	}
	if got := o.end("m1"); len(got) != 1 {
		t.Fatalf("end after the retry freed %v, want [lamp]", got)
	}
}
