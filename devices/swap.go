package devices

import (
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"
)

// A registry swapped while the client runs (SetRegistry) keeps every
// command in flight: the client's view of each device (availability,
// state, acks remembered and awaited) is keyed by device ID and stays;
// only what the registry decides changes for what is sent after the
// swap: which ecosystem and address a device has, its limits, what a
// command to it should lead to.
//
// The adapters of an ecosystem are built anew from the new registry and
// subscribed before the swap: their subscriptions replay what is
// retained, so a device the swap adds is known (online, its state) when
// the first command goes to it, and a subscription the broker refuses
// fails the swap with nothing changed. The set swapped out stops
// speaking for its devices, except for a command sent through it and
// still awaited: that one is confirmed as it was sent (by what its
// adapter reads, on the topics it was sent to), and the old set's
// subscriptions end once none is left.

// The states of an ecoSet.
const (
	setStaged  int32 = iota // subscribing, not yet swapped in
	setLive                 // the one commands go through
	setRetired              // swapped out; reads only for commands still in flight
)

// ecoSet is a registry and the adapters of the ecosystems its devices
// speak.
type ecoSet struct {
	reg  *Registry
	ecos []*ecosystem
	of   map[string]*ecosystem // by device ID
	// state is read on the receive path without the client's mu.
	state atomic.Int32
	// Under the client's mu: subs are the subscriptions' cancels; pending
	// counts the commands in flight sent through the set; idle is closed
	// once it is retired with none pending.
	subs    []func()
	pending int
	idle    chan struct{}
	// moved are, while staged, the devices the live set has at another
	// address (or with other settings); fresh those of them whose new
	// address said something in the replay (under the client's mu).
	moved map[string]bool
	fresh map[string]bool
}

func newEcoSet(reg *Registry) (*ecoSet, error) {
	if reg == nil {
		reg = &Registry{}
	}
	s := &ecoSet{reg: reg, of: make(map[string]*ecosystem), idle: make(chan struct{})}
	ecos, err := reg.adapters()
	if err != nil {
		return nil, err
	}
	s.ecos = ecos
	for _, e := range ecos {
		for _, d := range e.devices {
			s.of[d] = e
		}
	}
	return s, nil
}

// speaksFor says whether adapter e of set speaks for device in a
// message it decoded: always for the live set's own devices; for a
// staged set, only for a device the live one does not have (a device
// the swap adds, whose retained state its subscription replays); for a
// retired set, only while the device's command sent through it is in
// flight.
func (c *Client) speaksFor(set *ecoSet, e *ecosystem, device string) bool {
	if set.of[device] != e {
		return false // an adapter speaks only for its own devices
	}
	switch set.state.Load() {
	case setLive:
		return true
	case setStaged:
		if _, has := c.eco.Load().of[device]; has && !set.moved[device] {
			return false // the live set still speaks for it
		}
		c.mu.Lock()
		set.fresh[device] = true
		c.mu.Unlock()
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	x := c.expect[device]
	return x != nil && x.set == set
}

// unexpectLocked forgets device's command in flight x, and ends the
// wait of a retired set for its last one. Caller holds mu.
func (c *Client) unexpectLocked(device string, x *expectation) {
	delete(c.expect, device)
	stopTimer(x)
	s := x.set
	s.pending--
	if s.pending == 0 && s.state.Load() == setRetired {
		close(s.idle)
	}
}

// ErrSwap wraps why SetRegistry could not swap the registry in; the
// client then runs on the registry it had.
var ErrSwap = errors.New("registry not swapped")

// Registry returns the registry the client runs on: Options.Registry,
// or the last one SetRegistry swapped in.
func (c *Client) Registry() *Registry { return c.eco.Load().reg }

// SetRegistry swaps reg in for what is sent from now on, without a
// reconnection and without losing a command in flight (see the comment
// at the top of swap.go). It returns once the adapters of reg read
// their topics, or an error wrapping ErrSwap with nothing changed. The
// step handlers swap theirs with Handlers.SetRegistry, which calls
// this first.
func (c *Client) SetRegistry(reg *Registry) error {
	c.swapMu.Lock()
	defer c.swapMu.Unlock()
	if err := c.swap(reg); err != nil {
		return fmt.Errorf("%w: %w", ErrSwap, err)
	}
	return nil
}

// swap is SetRegistry's, under swapMu.
func (c *Client) swap(reg *Registry) error {
	if reg == nil {
		return errors.New("no registry")
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return ErrClosed
	}
	next, err := newEcoSet(reg)
	if err != nil {
		return err
	}
	next.moved, next.fresh = moved(c.eco.Load().reg, reg), make(map[string]bool)
	if err := c.subscribeEcosystems(next); err != nil {
		return err
	}
	c.mu.Lock()
	if c.closed {
		subs := next.subs
		c.mu.Unlock()
		for _, cancel := range subs {
			cancel()
		}
		return ErrClosed
	}
	old := c.eco.Load()
	var forgot []string
	for d := range next.moved {
		// What the old address said is not this one's: unknown (and so
		// not heard from) until the device speaks there.
		if e := c.devices[d]; e != nil && !next.fresh[d] {
			e.state, e.availKnown = nil, false
			e.changedLocked()
			forgot = append(forgot, d)
		}
	}
	next.state.Store(setLive)
	c.eco.Store(next)
	old.state.Store(setRetired)
	var subs []func()
	inFlight := old.pending > 0
	if !inFlight {
		subs, old.subs = old.subs, nil
	} else {
		c.retired = append(c.retired, old)
		c.bg.Add(1) // under mu, with closed false: before shutdown's Wait
	}
	connected := c.connected
	c.mu.Unlock()
	for _, d := range forgot {
		c.notify(d)
	}
	for _, cancel := range subs {
		cancel()
	}
	if inFlight {
		c.retire(old)
	}
	if err := c.rewatchAnnouncements(reg); err != nil {
		// The devices are driven all the same; only what is announced
		// is compared with the old registry until the next swap.
		c.log.Warn("announcements not compared with the new registry", "err", err)
	}
	c.log.Info("device registry swapped in", "devices", len(reg.Devices))
	if connected && len(next.ecos) > 0 {
		c.probeOnConnect()
	}
	return nil
}

// retire ends old's subscriptions once its last command in flight
// settles: not on the receive path that settles it, where an
// unsubscription waiting for the broker's answer would stall the
// messages behind it.
func (c *Client) retire(old *ecoSet) {
	go func() {
		defer c.bg.Done()
		select {
		case <-old.idle:
		case <-c.done:
		}
		c.mu.Lock()
		subs := old.subs
		old.subs = nil
		for i, s := range c.retired {
			if s == old {
				c.retired = append(c.retired[:i:i], c.retired[i+1:]...)
				break
			}
		}
		c.mu.Unlock()
		for _, cancel := range subs {
			cancel()
		}
	}()
}

// moved lists the ecosystem devices of next that prev has at another
// address, with another config, protocol or protocol settings.
func moved(prev, next *Registry) map[string]bool {
	out := make(map[string]bool)
	for _, d := range next.Devices {
		o, ok := prev.Device(d.ID)
		if !ok || d.Protocol == "" || d.Protocol == ProtocolSortie {
			continue
		}
		if o.Protocol != d.Protocol || o.Address != d.Address || !reflect.DeepEqual(o.Config, d.Config) ||
			!reflect.DeepEqual(prev.Protocols[d.Protocol], next.Protocols[d.Protocol]) {
			out[d.ID] = true
		}
	}
	return out
}
