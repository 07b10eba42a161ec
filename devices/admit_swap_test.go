package devices

import (
	"strings"
	"testing"
)

// A registry swapped in gives the turns from then on by its limits; the
// commands in flight keep their slots until their acks.
func TestAdmissionSwapKeepsCommandsInFlightAndGrantsByTheNewLimits(t *testing.T) {
	a, w := newTestAdmission(t)
	for _, k := range []string{"k1", "k2"} {
		if !a.acquire(k, "lamp-"+k[1:], 0, t0) {
			t.Fatalf("%s had to wait on an idle link", k)
		}
	}
	if a.acquire("k3", "lamp-3", 0, t0) {
		t.Fatal("a third command went out on a link that takes two")
	}
	wider, err := ParseRegistry([]byte(strings.Replace(admitRegistry, "[links.radio]\nmax_in_flight = 2", "[links.radio]\nmax_in_flight = 3", 1)), "admit.toml")
	if err != nil {
		t.Fatal(err)
	}
	a.setRegistry(wider)
	if got := w.list(); len(got) != 1 || got[0] != "k3" {
		t.Fatalf("woken %v after the link was widened, want k3", got)
	}
	if !a.acquire("k3", "lamp-3", 0, t0) {
		t.Fatal("k3 woken without its turn")
	}
	if s := a.stats()["radio"]; s.InFlight != 3 || s.Queued != 0 {
		t.Fatalf("radio %+v, want 3 in flight", s)
	}
	for _, d := range []string{"lamp-1", "lamp-2", "lamp-3"} {
		a.release(d)
	}
	if s := a.stats()["radio"]; s.InFlight != 0 {
		t.Fatalf("radio %+v after every ack, want none in flight", s)
	}
	a.mu.Lock()
	used := a.links["radio"].used
	a.mu.Unlock()
	if used != 0 {
		t.Fatalf("the link counts %d in flight after every ack", used)
	}
}
