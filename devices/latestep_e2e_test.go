package devices_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/devices/wire"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/store"
)

// TestCommandAtItsDeadlineDoesNotWedgeTheDevice: with the real driver and
// handlers, A's ack timeout and B's attempt deadline fall in the same
// scheduling round (a loaded loop, or simply coincident deadlines). A
// gives up, its release grants B its turn, and B is resumed at its
// deadline: it must not send (it could not wait for the ack), and the
// device's turn must not stay taken, or every later command to it fails
// with no_turn. Found by review, with a light that loses every ack.
func TestCommandAtItsDeadlineDoesNotWedgeTheDevice(t *testing.T) {
	clk := testkit.NewClock(time.Now())
	var drvp atomic.Pointer[driver.Driver]
	var drv *driver.Driver
	wake := func(k string) {
		if d := drvp.Load(); d != nil {
			d.Wake(k)
		}
	}
	b := newRig(t, devices.HandlerOptions{Now: clk.Now}).broker
	c := dial(t, b, func(o *devices.Options) { o.OnChange = wake; o.ClientID = "agent2" })
	h := devices.NewHandlers(c, loadHome(t), devices.HandlerOptions{Now: clk.Now})
	startDevice(t, b, "living-light", lightOff, func(wire.Command, int) reply { return reply{Drop: true} })
	waitUntil(t, c, "living-light", "state", func() bool { _, ok := c.State("living-light"); return ok })

	db, err := store.Open(filepath.Join(t.TempDir(), "m.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	})
	hs := map[string]driver.Handler{}
	h.Register(func(k string, x driver.Handler) { hs[k] = x })
	drv, err = driver.New(driver.Options{Store: db, Handlers: hs, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	drvp.Store(drv)
	ctx := context.Background()
	mk := func(ack string, timeout time.Duration) driver.Spec {
		p, err := json.Marshal(map[string]any{"device": "living-light", "action": "turn_on", "ack_timeout": ack})
		if err != nil {
			t.Fatal(err)
		}
		return driver.Spec{Type: "t", Steps: []driver.Step{{ID: "s", Kind: devices.KindCommand, Params: p,
			Timeout: driver.Duration(timeout), Retry: driver.RetryPolicy{MaxAttempts: 3}}}}
	}
	a, _, err := drv.Submit(ctx, mk("100ms", 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	bm, _, err := drv.Submit(ctx, mk("100ms", time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := drv.Step(ctx); err != nil { // A posts and parks on its ack; B parks for its turn
		t.Fatal(err)
	}
	clk.Advance(time.Second) // A's Until and B's deadline are both due
	if _, err := drv.Step(ctx); err != nil {
		t.Fatal(err)
	}
	gotB, err := drv.Get(ctx, bm.ID)
	if err != nil {
		t.Fatal(err)
	}
	gotA, err := drv.Get(ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("A: %s %s; B: %s %s %q", gotA.State, gotA.Results[0].Code, gotB.State, gotB.Results[0].Code, gotB.Results[0].Error)
	t.Logf("links after B's attempt ended: %+v, client stats %+v", h.Links(), c.Stats())

	// Let every mission run out its retries.
	for range 40 {
		clk.Advance(500 * time.Millisecond)
		if _, err := drv.Step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	cm, _, err := drv.Submit(ctx, mk("100ms", time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		clk.Advance(500 * time.Millisecond)
		if _, err := drv.Step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{a.ID, bm.ID, cm.ID} {
		m, err := drv.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %s %s %q", id[len(id)-4:], m.State, m.Results[0].Code, m.Error)
	}
	t.Logf("links at the end: %+v, client stats %+v", h.Links(), c.Stats())
	if s := h.Links()[""]; s.InFlight != 0 {
		t.Errorf("no step is in flight, yet the device's slot is held: %+v", s)
	}
}
