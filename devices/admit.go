package devices

import (
	"slices"
	"sync"
	"time"
)

// admission decides when a command may go out: each device takes at most
// its max_in_flight commands at once (one by default), and each link its
// max_in_flight and rate. A command that must wait is queued, holding
// nothing: its step parks (driver.Pending) on AdmitKey and is woken when
// its turn comes. Turns go by priority, then age (the mission's
// creation), then arrival, across missions and devices of a link. Safe
// for concurrent use.
type admission struct {
	reg  *Registry
	now  func() time.Time
	wake func(key string) // the driver's Wake, through the client's OnChange

	mu      sync.Mutex
	devs    map[string]*gate
	links   map[string]*gate
	waiting map[string]*waiter // by step key
	seq     uint64
	// onGrant, when set, is told of each command that waited for its
	// turn: its link ("" for none) and how long it waited.
	onGrant func(link string, waited time.Duration)
}

// gate is the capacity of a device or a link.
type gate struct {
	max  int // 0: no cap (links only)
	used int
	// queue holds a device's waiters (device gates only).
	queue []*waiter
	// link is a device's link gate, if any; devs are a link's devices.
	link *gate
	devs []*gate
	// rate, burst and tokens are a link's token bucket (rate 0: none).
	rate   float64
	burst  float64
	tokens float64
	last   time.Time
	// timer pumps a link's devices when a token is due for a waiter.
	timer   *time.Timer
	timerAt time.Time
}

type waiter struct {
	key, device, link string
	priority          int
	created           time.Time
	seq               uint64
	since             time.Time
	granted           bool
}

// before orders waiters: higher priority, then older mission, then
// earlier arrival.
func (w *waiter) before(o *waiter) bool {
	if w.priority != o.priority {
		return w.priority > o.priority
	}
	if !w.created.Equal(o.created) {
		return w.created.Before(o.created)
	}
	return w.seq < o.seq
}

// AdmitKey is what a step waiting for its turn to command a device parks
// on (and what OnChange is called with when the turn comes).
func AdmitKey(stepKey string) string { return "admit/" + stepKey }

func newAdmission(reg *Registry, now func() time.Time, wake func(string), onGrant func(string, time.Duration)) *admission {
	return &admission{
		reg: reg, now: now, wake: wake, onGrant: onGrant,
		devs: map[string]*gate{}, links: map[string]*gate{}, waiting: map[string]*waiter{},
	}
}

// acquire asks for a turn for the step with key to command device. It
// returns true when the command may go now (the slots are then the
// caller's until release), and false when the step is queued: it is
// woken on AdmitKey(key) when its turn comes, and asks again. A step
// asks again with the same key, so asking twice never queues it twice.
func (a *admission) acquire(key, device string, priority int, created time.Time) bool {
	a.mu.Lock()
	if w := a.waiting[key]; w != nil {
		if w.granted {
			delete(a.waiting, key)
		}
		a.mu.Unlock()
		return w.granted
	}
	_, link := a.reg.Limits(device)
	a.seq++
	w := &waiter{key: key, device: device, link: link, priority: priority, created: created, seq: a.seq, since: a.now()}
	a.waiting[key] = w
	d := a.device(device)
	d.queue = append(d.queue, w)
	woken := a.pumpLocked(d)
	granted := w.granted
	if granted {
		delete(a.waiting, key)
	}
	a.mu.Unlock()
	a.wakeAll(woken, key)
	return granted
}

// release gives back a command's slots once it is no longer in flight
// (its ack came, or its sender gave up on it).
func (a *admission) release(device string) {
	a.mu.Lock()
	d := a.device(device)
	d.used--
	if d.link != nil {
		d.link.used--
	}
	woken := a.pumpLocked(d)
	a.mu.Unlock()
	a.wakeAll(woken, "")
}

// withdraw takes a step that gives up waiting out of the queue; a turn
// granted to it meanwhile is given back.
func (a *admission) withdraw(key string) {
	a.mu.Lock()
	w := a.waiting[key]
	if w == nil {
		a.mu.Unlock()
		return
	}
	delete(a.waiting, key)
	if w.granted {
		a.mu.Unlock()
		a.release(w.device)
		return
	}
	d := a.devs[w.device]
	d.queue = withoutWaiter(d.queue, w)
	a.mu.Unlock()
}

// device returns a device's gate, made on first use. a.mu is held.
func (a *admission) device(id string) *gate {
	g := a.devs[id]
	if g == nil {
		n, link := a.reg.Limits(id)
		g = &gate{max: n}
		a.devs[id] = g
		if link != "" {
			l := a.links[link]
			if l == nil {
				cfg := a.reg.Links[link]
				burst := float64(max(cfg.Burst, 1))
				l = &gate{max: cfg.MaxInFlight, rate: cfg.Rate, burst: burst, tokens: burst, last: a.now()}
				a.links[link] = l
			}
			g.link = l
			l.devs = append(l.devs, g)
		}
	}
	return g
}

// setRegistry makes the limits of reg those of the turns granted from
// now on. The gates are made anew from reg, each device's keeping its
// commands in flight and its queue, each link's counting those of its
// devices (its bucket starts full).
func (a *admission) setRegistry(reg *Registry) {
	a.mu.Lock()
	for _, l := range a.links {
		if l.timer != nil {
			l.timer.Stop()
		}
	}
	old := a.devs
	a.reg, a.devs, a.links = reg, map[string]*gate{}, map[string]*gate{}
	var woken []string
	for id, was := range old {
		g := a.device(id)
		g.used, g.queue = was.used, was.queue
		if g.link != nil {
			g.link.used += was.used
		}
	}
	for _, w := range a.waiting {
		w.link = a.linkOf(w.device)
	}
	for _, g := range a.devs {
		woken = append(woken, a.pumpLocked(g)...)
	}
	a.mu.Unlock()
	a.wakeAll(woken, "")
}

func (a *admission) linkOf(device string) string {
	_, link := a.reg.Limits(device)
	return link
}

// pumpLocked grants every turn the gates allow around device gate g
// (the device alone, or every device of its link), best waiter first,
// and returns the keys to wake. Turns elsewhere are not affected by g's
// change, so they are not looked at. a.mu is held.
func (a *admission) pumpLocked(g *gate) []string {
	now := a.now()
	scope := []*gate{g}
	if g.link != nil {
		g.link.refill(now)
		scope = g.link.devs
	}
	var woken []string
	var rateBound *gate
	for {
		// The best waiter of each device that has room.
		var heads []*waiter
		for _, d := range scope {
			if len(d.queue) == 0 || d.used >= d.max {
				continue
			}
			best := d.queue[0]
			for _, w := range d.queue[1:] {
				if w.before(best) {
					best = w
				}
			}
			heads = append(heads, best)
		}
		slices.SortFunc(heads, func(x, y *waiter) int {
			switch {
			case x.before(y):
				return -1
			case y.before(x):
				return 1
			}
			return 0
		})
		granted := false
		for _, w := range heads {
			d := a.devs[w.device]
			l := d.link
			if l != nil && l.max > 0 && l.used >= l.max {
				continue
			}
			if l != nil && l.rate > 0 && l.tokens < 1 {
				rateBound = l
				continue
			}
			d.used++
			d.queue = withoutWaiter(d.queue, w)
			if l != nil {
				l.used++
				if l.rate > 0 {
					l.tokens--
				}
			}
			w.granted = true
			woken = append(woken, w.key)
			if a.onGrant != nil {
				a.onGrant(w.link, now.Sub(w.since))
			}
			granted = true
			break // a device's next head may now be another
		}
		if !granted {
			break
		}
	}
	if rateBound != nil {
		a.armLocked(rateBound, now.Add(rateBound.untilToken()))
	}
	return woken
}

// refill adds the tokens earned since the last look.
func (g *gate) refill(now time.Time) {
	if g.rate <= 0 {
		return
	}
	g.tokens = min(g.burst, g.tokens+now.Sub(g.last).Seconds()*g.rate)
	g.last = now
}

// untilToken is how long until the bucket holds a whole token.
func (g *gate) untilToken() time.Duration {
	return time.Duration((1 - g.tokens) / g.rate * float64(time.Second))
}

// armLocked makes sure link l's devices are pumped at t, for waiters
// held by its rate. a.mu is held.
func (a *admission) armLocked(l *gate, t time.Time) {
	if l.timer != nil && !l.timerAt.After(t) {
		return
	}
	if l.timer != nil {
		l.timer.Stop()
	}
	l.timerAt = t
	l.timer = time.AfterFunc(max(time.Until(t), time.Millisecond), func() {
		a.mu.Lock()
		l.timer = nil
		woken := a.pumpLocked(l.devs[0])
		a.mu.Unlock()
		a.wakeAll(woken, "")
	})
}

// wakeAll wakes the granted steps, except self: the caller granted in
// acquire goes on without a wake.
func (a *admission) wakeAll(keys []string, self string) {
	for _, k := range keys {
		if k != self && a.wake != nil {
			a.wake(AdmitKey(k))
		}
	}
}

// LinkStats is the admission state of a link's devices, for metrics.
type LinkStats struct {
	InFlight int // commands to its devices not yet acked
	Queued   int // commands waiting for their turn on its devices
}

// stats reports the admission state of each link's devices, and under
// "" that of the devices on no link.
func (a *admission) stats() map[string]LinkStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]LinkStats, len(a.links)+1)
	for id, d := range a.devs {
		link := a.linkOf(id)
		s := out[link]
		s.InFlight += d.used
		s.Queued += len(d.queue)
		out[link] = s
	}
	return out
}

// withoutWaiter removes w from q in place (it is there once at most).
// Written out, not slices.DeleteFunc: each generic instantiation is half
// a kilobyte of the agent's binary, which has a budget.
func withoutWaiter(q []*waiter, w *waiter) []*waiter {
	for i, x := range q {
		if x == w {
			copy(q[i:], q[i+1:])
			q[len(q)-1] = nil
			return q[:len(q)-1]
		}
	}
	return q
}
