package devices

import (
	"fmt"
	"sync"
	"time"

	"github.com/sortie-edge/sortie/driver"
)

// What a command step does when another live mission owns its device
// (CommandParams.OnConflict).
const (
	// ConflictPreempt takes the device over (the default): the owner's
	// step on it, if still under way, ends superseded.
	ConflictPreempt = "preempt"
	// ConflictQueue waits until the owner has ended.
	ConflictQueue = "queue"
	// ConflictSkip skips the step (status skipped, not failed).
	ConflictSkip = "skip"
)

// Conflict kinds, as told to HandlerOptions.OnConflict.
const (
	ConflictTookOver  = "took_over"  // Mission took Device over from Other, live
	ConflictQueued    = "queued"     // Mission waits for Other to end
	ConflictSkipped   = "skipped"    // Mission's step skipped: Other holds Device
	ConflictGaveWay   = "superseded" // Mission's step gave way: Other, newer, commanded Device
	ConflictLeftAlone = "left_alone" // Mission's undo left Device to Other, newer
)

// Conflict is one arbitration between two missions over a device.
type Conflict struct {
	Kind    string
	Device  string
	Mission string // the mission whose step decided
	Step    int    // its step index
	Other   string // the other mission
}

// OwnerKey is what a step queued behind another mission's ownership of
// a device waits for: Wake(OwnerKey(device)) when the owner ends.
func OwnerKey(device string) string { return "owner/" + device }

// claim is the newest mission that changed a device (or is changing
// it), and the claim it displaced: when nothing of the mission's stays
// on the device (its commands refused, or undone), the device goes back
// to that one.
type claim struct {
	mission string
	scene   string // the mission's type
	created time.Time
	command string // the command ID it sent last
	ended   bool   // the mission has ended
	// changes counts the mission's commands to the device that took
	// effect and are not undone; pending says a command of its is on its
	// way, its outcome unknown.
	changes int
	pending bool
	prev    *claim
}

// inFlight says that the claim's mission has a command on its way to
// the device and no change on it yet: its outcome decides whether the
// device stays the mission's or is given back. (An ended mission sends
// nothing more: its claim stands as it is.)
func (c claim) inFlight() bool { return c.pending && c.changes == 0 && !c.ended }

// newerThan says whether mission a (created at ca) is newer than b.
// Mission IDs sort by creation too, which breaks ties.
func newerThan(a string, ca time.Time, b string, cb time.Time) bool {
	if !ca.Equal(cb) {
		return ca.After(cb)
	}
	return a > b
}

// owners tracks each device's owner.
type owners struct {
	mu sync.Mutex
	by map[string]*claim
	// byMission lists each live owner's devices, for Ended; told marks
	// the (mission, device) queues already noted.
	byMission map[string][]string
	told      map[string]bool
}

func newOwners() *owners {
	return &owners{by: make(map[string]*claim), byMission: make(map[string][]string), told: make(map[string]bool)}
}

func (o *owners) get(dev string) (claim, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	c, ok := o.by[dev]
	if !ok {
		return claim{}, false
	}
	return *c, true
}

// Outcomes of owners.claim.
const (
	claimed  = iota // the device is the mission's (or its scene's newer run's)
	tookOver        // claimed from a live mission of another scene (by)
	newerHas        // a newer mission of another scene has it (by): nothing claimed
	heldBy          // a live older mission of another scene has it (by) and the step yields
)

// claim makes mission the owner of dev as it sends command. yield says
// the step does not take a device from a live mission of another scene
// (on_conflict queue or skip). Runs of one scene are ordered by its
// mode: an older run's command goes out, and the newer run stays owner.
func (o *owners) claim(dev, mission, scene string, created time.Time, command string, yield bool) (int, string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	c := o.by[dev]
	switch {
	case c != nil && c.mission == mission:
		c.command, c.pending = command, true
		if c.ended { // run again (an operator's retry): live again
			c.ended = false
			o.byMission[mission] = append(o.byMission[mission], dev)
		}
		return claimed, ""
	case c != nil && c.scene != scene && newerThan(c.mission, c.created, mission, created):
		return newerHas, c.mission
	case c != nil && newerThan(c.mission, c.created, mission, created):
		return claimed, ""
	case c != nil && c.scene != scene && !c.ended && yield:
		return heldBy, c.mission
	}
	o.by[dev] = &claim{mission: mission, scene: scene, created: created, command: command, pending: true, prev: c}
	o.byMission[mission] = append(o.byMission[mission], dev)
	if c != nil && !c.ended && c.scene != scene {
		return tookOver, c.mission
	}
	return claimed, ""
}

// seed records a change known to be on the device (from the store).
func (o *owners) seed(dev, mission, scene string, created time.Time, ended bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	c := o.by[dev]
	if c != nil && c.mission == mission {
		c.changes++
		return
	}
	if c != nil && newerThan(c.mission, c.created, mission, created) {
		return
	}
	if c != nil && c.ended {
		c.prev = nil // nothing is given back past an ended mission
	}
	o.by[dev] = &claim{mission: mission, scene: scene, created: created, ended: ended, changes: 1, prev: c}
	if !ended {
		o.byMission[mission] = append(o.byMission[mission], dev)
	}
}

// Outcomes of a command, for owners.settle.
const (
	outApplied = iota // a forward command took effect
	outRefused        // a forward command was refused or never sent
	outUndone         // an undo took effect
	outUnknown        // no answer in time: the command may have taken effect
)

// settle records the outcome of mission's command to dev and says
// whether the device changed hands (given back: nothing of the
// mission's is on it any more).
func (o *owners) settle(dev, mission string, out int) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	c := o.by[dev]
	if c == nil || c.mission != mission {
		return false
	}
	c.pending = false
	switch out {
	case outApplied:
		c.changes++
		return false
	case outUndone:
		c.changes--
	case outUnknown:
		// It may have taken effect: still pending, so an older undo waits
		// (or leaves it alone once this mission ends), and the retry's
		// ack, same command ID, counts it once.
		c.pending = true
		return false
	}
	if c.changes > 0 {
		return false
	}
	if c.prev == nil {
		delete(o.by, dev)
	} else {
		o.by[dev] = c.prev
	}
	return true
}

// tell says whether mission's decision kind on dev is new (to be noted
// once, however often its step tries).
func (o *owners) tell(mission, dev, kind string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	k := mission + "/" + dev + "/" + kind
	if o.told[k] {
		return false
	}
	o.told[k] = true
	o.byMission[mission] = append(o.byMission[mission], dev)
	return true
}

// end marks mission's claims ended and returns the devices it owned.
func (o *owners) end(mission string) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	devs := o.byMission[mission]
	delete(o.byMission, mission)
	var out []string
	for _, dev := range devs {
		for _, kind := range []string{ConflictQueued, ConflictTookOver} {
			delete(o.told, mission+"/"+dev+"/"+kind)
		}
		for c := o.by[dev]; c != nil; c = c.prev {
			if c.mission == mission && !c.ended {
				c.ended = true
				// An ended mission undoes nothing more, so nothing is ever
				// given back past it: the chain stops here, and its length
				// stays the number of live missions that changed the device.
				c.prev = nil
				out = append(out, dev)
				break
			}
		}
	}
	return out
}

// Ended tells the handlers that a mission has ended: the devices it owns
// are free for the steps queued behind it, which are woken.
func (h *Handlers) Ended(missionID string) {
	for _, dev := range h.owners.end(missionID) {
		h.wake(OwnerKey(dev))
	}
}

// Seed records that mission (of scene, created at created) changed
// device, for an agent starting with missions in its store: ownership is
// otherwise learnt as commands go out. ended says the mission has ended.
func (h *Handlers) Seed(device, mission, scene string, created time.Time, ended bool) {
	h.owners.seed(device, mission, scene, created, ended)
}

// settle records what came of mission's command to dev; a step waiting
// to know (an older mission's undo) or for the device (queued) looks
// again.
func (h *Handlers) settle(dev, mission string, out int) {
	h.owners.settle(dev, mission, out)
	h.wake(OwnerKey(dev))
}

func (h *Handlers) wake(key string) {
	if f := h.client.opts.OnChange; f != nil {
		f(key)
	}
}

func (h *Handlers) conflict(kind, dev string, req driver.StepRequest, other string) {
	if f := h.opts.OnConflict; f != nil {
		f(Conflict{Kind: kind, Device: dev, Mission: req.MissionID, Step: req.StepIndex, Other: other})
	}
}

// supersededBy says whether a mission newer than req's commanded dev
// since, and which.
func (h *Handlers) supersededBy(req driver.StepRequest, dev string) (string, bool) {
	c, ok := h.owners.get(dev)
	if !ok || c.mission == req.MissionID || !newerThan(c.mission, c.created, req.MissionID, req.Created) {
		return "", false
	}
	return c.mission, true
}

// gaveWay ends req's step on dev, superseded by the newer mission by.
func (h *Handlers) gaveWay(req driver.StepRequest, dev, by string) error {
	h.admit.withdraw(req.IdempotencyKey)
	h.conflict(ConflictGaveWay, dev, req, by)
	return driver.SupersededError(fmt.Errorf("%s was commanded by newer mission %s", dev, by))
}

// CodeHeld is the code of a queued step waiting for the live mission
// holding its device (not ready: no attempt spent; the owner's end wakes
// it).
const CodeHeld = "device_held"

// CodeNewerInFlight is the code of an undo waiting for the outcome of a
// newer mission's command to its device (not ready; the ack or the
// refusal wakes it).
const CodeNewerInFlight = "newer_command_in_flight"

// arbitrate decides, before a command of req's forward step is sent to
// dev, what the step does about the device's owner; nil means send.
func (h *Handlers) arbitrate(req driver.StepRequest, dev, policy string) error {
	c, ok := h.owners.get(dev)
	if !ok || c.mission == req.MissionID || c.scene == req.MissionType {
		// Runs of one scene are ordered by its mode (single, restart,
		// queued, parallel), not arbitrated.
		return nil
	}
	if newerThan(c.mission, c.created, req.MissionID, req.Created) {
		if c.inFlight() {
			// Refused, its command gives the device back, and this step,
			// whose own command may be on it already (an ack lost), must
			// then stand: giving way now would leave its change under a
			// step ended superseded, with nothing newer on the device.
			h.admit.withdraw(req.IdempotencyKey)
			return driver.WaitError(OwnerKey(dev), CodeNewerInFlight, h.opts.OfflineRetry,
				fmt.Errorf("%s: a command of newer mission %s is in flight", dev, c.mission))
		}
		return h.gaveWay(req, dev, c.mission)
	}
	if c.ended {
		return nil
	}
	switch policy {
	case ConflictQueue:
		h.admit.withdraw(req.IdempotencyKey)
		if h.owners.tell(req.MissionID, dev, ConflictQueued) {
			h.conflict(ConflictQueued, dev, req, c.mission)
		}
		return driver.WaitError(OwnerKey(dev), CodeHeld, h.opts.OfflineRetry,
			fmt.Errorf("%s is held by live mission %s (on_conflict = queue)", dev, c.mission))
	case ConflictSkip:
		h.admit.withdraw(req.IdempotencyKey)
		h.conflict(ConflictSkipped, dev, req, c.mission)
		return driver.SkippedError(fmt.Errorf("%s is held by live mission %s (on_conflict = skip)", dev, c.mission))
	}
	// Preempt: the command goes out, and its claim (see send) takes the
	// device; the owner's steps not yet sent to it find it taken when
	// they try, and one verifying it finds the newer state superseding it.
	return nil
}

// tookOver notes, once per mission and device, that req's command took
// dev over from the live mission from, and wakes what of from's waits
// on the device.
func (h *Handlers) tookOver(req driver.StepRequest, dev, from string) {
	if h.owners.tell(req.MissionID, dev, ConflictTookOver) {
		h.conflict(ConflictTookOver, dev, req, from)
	}
	h.wake(dev)
}

// undoAllowed decides whether req's undo may command dev: never once a
// newer mission has changed it, live or not; the undo is then left
// alone. While the newer command's outcome is unknown, it waits for it. (Waiting for a live one to end could wait for a mission that
// waits, queued, for this one.) Should that newer mission undo its own
// change later, it puts back what it found.
func (h *Handlers) undoAllowed(req driver.StepRequest, dev string) error {
	c, ok := h.owners.get(dev)
	if !ok || c.mission == req.MissionID || !newerThan(c.mission, c.created, req.MissionID, req.Created) {
		return nil
	}
	if c.inFlight() {
		// Its command is on its way: whether it takes effect (its ack) or
		// is refused (the device is given back) decides.
		return driver.WaitError(OwnerKey(dev), CodeNewerInFlight, h.opts.OfflineRetry,
			fmt.Errorf("%s: a command of newer mission %s is in flight", dev, c.mission))
	}
	h.admit.withdraw(req.IdempotencyKey)
	h.conflict(ConflictLeftAlone, dev, req, c.mission)
	return driver.SupersededError(fmt.Errorf("%s was changed since by newer mission %s; left as it is", dev, c.mission))
}
