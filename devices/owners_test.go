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
	if _, ok := o.claim("lamp", "m1", "a", at(1), "c1", false); !ok {
		t.Fatal("first claim refused")
	}
	if _, ok := o.claim("lamp", "m3", "b", at(3), "c3", false); !ok {
		t.Fatal("newer claim refused")
	}
	if by, ok := o.claim("lamp", "m2", "c", at(2), "c2", false); ok || by != "m3" {
		t.Fatalf("older mission of another scene claimed after a newer one: %q %v", by, ok)
	}
	if _, ok := o.claim("lamp", "m2b", "b", at(2), "c2b", false); !ok {
		t.Fatal("an older run of the owner's own scene was refused: its mode orders them")
	}
	if c, _ := o.get("lamp"); c.mission != "m3" {
		t.Fatalf("owner %s after a same-scene older send, want m3 kept", c.mission)
	}
	if !o.giveBack("lamp", "m3") {
		t.Fatal("giveBack by the owner did nothing")
	}
	if c, _ := o.get("lamp"); c.mission != "m1" {
		t.Fatalf("owner %s after m3 gave back, want m1", c.mission)
	}
	if o.giveBack("lamp", "m3") {
		t.Error("giveBack by a mission that no longer owns it changed the owner")
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
