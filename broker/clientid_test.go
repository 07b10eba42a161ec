package broker

import (
	"sync"
	"testing"

	mqtt "github.com/mochi-mqtt/server/v2"
)

func TestNamedOwnerTakesTheLongestUserPrefix(t *testing.T) {
	users := map[string]bool{"lamp": true, "lamp.kitchen": true, "hub": true}
	r := namedOwner(func(n string) bool { return users[n] })
	for id, want := range map[string]string{
		"lamp": "lamp", "lamp.1": "lamp", "lamp.kitchen": "lamp.kitchen", "lamp.kitchen.2": "lamp.kitchen",
		"lamps": "", "lamp-1": "", ".lamp": "", "": "", "x.lamp": "", "hub.a.b": "hub",
	} {
		if got := r(id); got != want {
			t.Errorf("namedOwner(%q) = %q, want %q", id, got, want)
		}
	}
}

func TestClaimAndRelease(t *testing.T) {
	o := newOwners(namedOwner(func(n string) bool { return n == "lamp" }))
	if !o.claim("app", "free-1") {
		t.Fatal("a free ID refused")
	}
	if !o.claim("app", "free-1") {
		t.Fatal("an ID refused to the user who holds it")
	}
	if o.claim("lamp", "free-1") {
		t.Error("an ID held by app went to lamp")
	}
	if o.claim("app", "lamp.2") || !o.claim("lamp", "lamp.2") {
		t.Error("an ID reserved to lamp went to app, or not to lamp")
	}
	cl := &mqtt.Client{ID: "free-1"}
	cl.Properties.Username = []byte("lamp") // not the holder: no effect
	o.release(cl)
	if o.claim("lamp", "free-1") {
		t.Error("released by another user")
	}
	cl.Properties.Username = []byte("app")
	o.release(cl)
	if !o.claim("lamp", "free-1") {
		t.Error("not released by its holder")
	}
	// Racing for one ID: exactly one user wins.
	var wg sync.WaitGroup
	wins := make(chan string, 8)
	for _, u := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		wg.Go(func() {
			if o.claim(u, "contested") {
				wins <- u
			}
		})
	}
	wg.Wait()
	close(wins)
	if n := len(wins); n != 1 {
		t.Errorf("%d users won one client ID", n)
	}
}
