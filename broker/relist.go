package broker

// A connection that ends its session and a new connection of the same
// client ID must not cross, or mochi unlists the new one.
//
// mochi v2.7.9 ends a clean session's connection (attachClient, after
// its read loop) with: OnDisconnect; "if not taken over: clear its
// in-flight table, unsubscribe it, delete the client ID from the list of
// clients". A new connection of the same ID that arrives between the
// check and the delete finds the old one still listed, takes it over
// (too late for the check), lists itself under the ID and subscribes;
// the old connection's delete then removes the new one from the list.
// Its subscriptions stay, but a message for them finds no client under
// the ID and is dropped: the connection is up and deaf until it
// reconnects. An agent's hub link restarted within milliseconds met it
// in the test runs (a control request never arrived), and so would any
// client that reconnects at once with the same ID.
//
// The handover hook makes the two wait for each other, by client ID,
// under its lock: a new connection that finds an old one ending waits
// (OnSessionEstablish, just before mochi looks for the old session)
// until mochi has unlisted the old one, and starts a fresh session; an
// old connection that finds a new one establishing waits (OnDisconnect,
// just before mochi's check) until the new one has taken it over, so
// that mochi's check leaves the new one listed. Each wait is bounded:
// a connection that fails half-way holds the other two seconds at most.

import (
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// crossWait bounds a wait for the other connection of a client ID.
const crossWait = 2 * time.Second

// OnSessionEstablish runs on a new connection just before mochi looks for
// the ID's session: it waits out an old connection of the ID ending.
func (h *handover) OnSessionEstablish(cl *mqtt.Client, _ packets.Packet) {
	h.mu.Lock()
	old := h.ending[cl.ID]
	h.establishing[cl.ID] = cl
	told := h.onWait
	h.mu.Unlock()
	if old == nil {
		return
	}
	if told != nil {
		told(cl.ID)
	}
	h.unlisted(old)
}

// unlisted waits until mochi no longer lists old under its client ID,
// and forgets its ending mark.
func (h *handover) unlisted(old *mqtt.Client) {
	waitFor(func() bool {
		listed, ok := h.srv.Clients.Get(old.ID)
		return !ok || listed != old
	})
	h.mu.Lock()
	if h.ending[old.ID] == old {
		delete(h.ending, old.ID)
	}
	h.mu.Unlock()
}

// ended is OnDisconnect's part for a connection whose session ends with
// it (not taken over): it waits for a new connection of the ID being
// established to take it over, or marks it ending until mochi unlists it.
func (h *handover) ended(cl *mqtt.Client) {
	h.mu.Lock()
	if nc := h.establishing[cl.ID]; nc != nil && nc != cl {
		h.mu.Unlock()
		waitFor(func() bool { return cl.IsTakenOver() || nc.Closed() })
		return
	}
	h.ending[cl.ID] = cl
	h.mu.Unlock()
	// Forgotten once mochi has unlisted it (right after this returns),
	// so that an ID that never comes back does not keep its client.
	go h.unlisted(cl)
}

// established forgets a connection's establishing mark.
func (h *handover) established(cl *mqtt.Client) {
	h.mu.Lock()
	if h.establishing[cl.ID] == cl {
		delete(h.establishing, cl.ID)
	}
	h.mu.Unlock()
}

// waitFor polls cond every millisecond until it holds or crossWait has
// passed: what it waits for is a few instructions of another connection's
// goroutine, and mochi has no event for it.
func waitFor(cond func() bool) {
	for deadline := time.Now().Add(crossWait); !cond() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
}
