package devices

import (
	"fmt"
	"slices"
	"time"

	"github.com/sortie-edge/sortie/devices/adapter"
	"github.com/sortie-edge/sortie/devices/wire"
)

// A device of another ecosystem (docs/devices.md) has no command IDs
// and, but for Shelly, no reply: the Client turns what its adapter reads
// into the acks a native device would send, so that the handlers, the
// driver's parks and wakes and the admission of turns work unchanged.
//
// One command is in flight per such device (the registry allows no
// more); its expectation is the state it should lead to. The first
// message published after it, not replayed as retained, that shows every
// expected value, and the device not moving, is its positive ack; the
// ecosystem's failure signal is a negative one; silence is a timeout,
// retried. A retry (or the first attempt after a restart) reads the
// device first, and a device already in the wanted state counts as done
// without another command.

// probeSuffix tells a read's request ID from its command's, for the
// ecosystems whose requests carry one.
const probeSuffix = "~read"

// probeWindow bounds how long a retry waits for the answer to its read
// before it sends the command anyway.
const probeWindow = 2 * time.Second

// expectation is a command to an ecosystem device awaiting its outcome.
type expectation struct {
	key  ackKey
	want map[string]any
	// set is the registry's set the command was sent under: one swapped
	// out since keeps reading for it until it settles (swap.go).
	set *ecoSet
	// probing: the read before a retry is out and the command is not;
	// cmd is what to send when the read does not show want.
	probing bool
	cmd     []adapter.Message
	timer   *time.Timer
	// prior is the device's state before the command, for the ack: taken
	// at a first attempt only (a retry's device may have applied it).
	prior map[string]any
	first bool
}

// Speaks reports whether the device speaks another ecosystem's dialect
// (PostState, not Post, sends its commands).
func (c *Client) Speaks(deviceID string) bool {
	_, ok := c.eco.Load().of[deviceID]
	return ok
}

// subscribeEcosystems subscribes to what each adapter of set reads,
// keeping the cancels in set.subs. A topic two adapters read (a
// Zigbee2MQTT bridge's state, which a Home Assistant config's
// availability may name too) is one subscription whose messages go to
// both: the broker sends each message, and replays the retained ones,
// once. A subscription refused cancels those made before it.
func (c *Client) subscribeEcosystems(set *ecoSet) error {
	readers := make(map[string][]*ecosystem)
	var filters []string
	for _, e := range set.ecos {
		for _, f := range e.proto.Filters() {
			if readers[f] == nil {
				filters = append(filters, f)
			}
			if !slices.Contains(readers[f], e) {
				readers[f] = append(readers[f], e)
			}
		}
	}
	var subs []func()
	for _, f := range filters {
		ecos := readers[f]
		handle := func(topic string, payload []byte, retained bool) {
			for _, e := range ecos {
				c.onEcoMessage(set, e, adapter.Message{Topic: topic, Payload: payload, Retained: retained})
			}
		}
		var cancel func()
		var err error
		switch {
		case c.mc != nil:
			cancel, err = c.mc.SubscribeRetained(f, handle)
		case c.localRetained != nil:
			cancel, err = c.localRetained.SubscribeRetained(f, c.gated(handle))
		default:
			cancel, err = c.local.Subscribe(f, func(topic string, payload []byte) {
				c.gated(handle)(topic, payload, false)
			})
		}
		if err != nil {
			for _, cancel := range subs {
				cancel()
			}
			return fmt.Errorf("subscribe %s: %w", f, err)
		}
		subs = append(subs, cancel)
	}
	c.mu.Lock()
	set.subs = subs
	c.mu.Unlock()
	return nil
}

// gated keeps Close's promise for in-process handlers (see dialLocal).
func (c *Client) gated(h func(string, []byte, bool)) func(string, []byte, bool) {
	return func(topic string, payload []byte, retained bool) {
		c.gate.RLock()
		defer c.gate.RUnlock()
		if !c.stopped {
			h(topic, payload, retained)
		}
	}
}

// LocalRetained is a Local broker that tells a retained message replayed
// at subscription from one published since (see broker.Broker).
type LocalRetained interface {
	SubscribeRetained(filter string, handle func(topic string, payload []byte, retained bool)) (cancel func(), err error)
}

// onEcoMessage applies what one message says. It runs on the receive
// path and must not block: it decodes one bounded payload and publishes
// without waiting.
func (c *Client) onEcoMessage(set *ecoSet, e *ecosystem, m adapter.Message) {
	e.mu.Lock()
	reports, err := e.proto.Decode(m)
	e.mu.Unlock()
	if err != nil {
		// What else the message said still counts (a shared JSON state
		// whose one value is unreadable).
		c.malformed(e.name, m.Topic, "", m.Payload, err)
	}
	for _, r := range reports {
		if !c.speaksFor(set, e, r.Device) {
			continue
		}
		if !m.Retained {
			c.mu.Lock()
			c.heard[r.Device] = time.Now()
			c.mu.Unlock()
		}
		if r.Availability != adapter.Unknown {
			online := r.Availability == adapter.Online
			if c.update(r.Device, "availability", func(d *deviceEntry) bool {
				changed := !d.availKnown || d.online != online
				d.availKnown, d.online = true, online
				return changed
			}) {
				c.log.Info("device availability", "device", r.Device, "online", online, "protocol", e.name)
			}
		}
		if r.State != nil {
			c.ecoState(r.Device, r.State, m.Retained)
		}
		if r.Failure != nil && !m.Retained {
			c.ecoFailed(r.Device, "", r.Failure, nil)
		}
		if r.Reply != nil && !m.Retained {
			c.ecoFailed(r.Device, r.Reply.ID, r.Reply.Failure, r.Reply.Prior)
		}
	}
}

// ecoState merges a report into the device's state (a report may carry
// only some keys) and settles the command waiting on it.
func (c *Client) ecoState(device string, report map[string]any, retained bool) {
	var st map[string]any
	c.update(device, "state", func(d *deviceEntry) bool {
		// Replaced, never changed in place: sharedState's callers keep it.
		next := make(map[string]any, len(d.state)+len(report))
		for k, v := range d.state {
			next[k] = v
		}
		changed := d.state == nil
		if p, pos := report["position"]; pos {
			if _, mv := report["moving"]; !mv && next["moving"] == true && sameValue(d.state["position"], p) {
				// A position reported apart from the movement (ESPHome's
				// and Home Assistant's topics) says nothing of it, but
				// the same position twice is not a cover still moving
				// (one whose stop report was lost): a new position, one
				// step short of the target, is, and must not confirm.
				delete(next, "moving")
				changed = true
			}
		}
		for k, v := range report {
			if old, ok := d.state[k]; !ok || !sameValue(old, v) {
				changed = true
			}
			next[k] = v
		}
		d.state = next
		st = next
		return changed
	})
	if retained || st == nil {
		return // the past: it confirms no command sent since
	}
	c.mu.Lock()
	x := c.expect[device]
	if x == nil {
		c.mu.Unlock()
		return
	}
	var toLog map[string]any // logged once mu is released, before the command goes
	if x.first && x.prior == nil && x.probing {
		// The read of a device whose state was unknown: what it was
		// before the command, whether or not the command is needed.
		x.prior = cloneMap(st)
		toLog = x.prior
	}
	id := x.key.id
	if matchesWithin(st, x.want) {
		c.mu.Unlock()
		c.logPrior(id, toLog)
		c.ecoAck(device, x, wire.Ack{ID: id, OK: true, State: cloneMap(st), Prior: x.prior})
		return
	}
	if !x.probing || c.closed {
		c.mu.Unlock()
		c.logPrior(id, toLog)
		return
	}
	// The read shows the device elsewhere: the command goes now.
	cmd := x.cmd
	x.probing = false
	stopTimer(x)
	c.mu.Unlock()
	// Logged before the publish, as in postState: a process killed once
	// the command is out must leave the prior state behind.
	c.logPrior(id, toLog)
	_ = c.ecoPublish(device, cmd) // lost with the connection: shows as the ack's timeout, retried
}

// ecoFailed settles the waiting command with the ecosystem's refusal.
// id, when set, must be the command's (a reply to another request is
// not its answer); a reply without a failure is a positive ack.
func (c *Client) ecoFailed(device, id string, f *adapter.Failure, prior map[string]any) {
	c.mu.Lock()
	x := c.expect[device]
	if x == nil || (id != "" && id != x.key.id) || x.probing {
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	if prior == nil {
		prior = x.prior
	}
	if f == nil {
		c.ecoAck(device, x, wire.Ack{ID: x.key.id, OK: true, Prior: prior})
		return
	}
	c.ecoAck(device, x, wire.Ack{ID: x.key.id, Error: &wire.AckError{Code: f.Code, Message: f.Message}, Prior: prior})
}

// ecoAck hands the outcome over as the device's ack, once.
func (c *Client) ecoAck(device string, x *expectation, ack wire.Ack) {
	c.mu.Lock()
	if c.expect[device] != x {
		c.mu.Unlock()
		return // settled already, or given up on
	}
	c.unexpectLocked(device, x)
	c.mu.Unlock()
	c.applyAck("", device, ack)
}

func stopTimer(x *expectation) {
	if x.timer != nil {
		x.timer.Stop()
		x.timer = nil
	}
}

// PostState is Post for a device of another ecosystem: it sends what
// brings the device to want (keys of the common vocabulary, see package
// adapter) and returns at once; the outcome comes as an ack, through
// OnChange(AckKey(deviceID, id)) and Collect, as for Post. attempt above
// 1 reads the device first: a device already in the wanted state is done
// without a command.
func (c *Client) PostState(deviceID, id string, want map[string]any, attempt int, giveUp time.Time, onDone func()) (ack wire.Ack, done bool, err error) {
	for {
		ack, done, err, again := c.postState(deviceID, id, want, attempt, giveUp, onDone)
		if !again {
			return ack, done, err
		}
	}
}

// postState is one try of PostState. again says a registry swap came
// between reading the adapters and taking mu: the command, built by the
// retired set's adapter for the device's old address, is built again.
func (c *Client) postState(deviceID, id string, want map[string]any, attempt int, giveUp time.Time, onDone func()) (ack wire.Ack, done bool, err error, again bool) {
	set := c.eco.Load()
	e := set.of[deviceID]
	if e == nil {
		return wire.Ack{}, false, fmt.Errorf("send: %w: device %s speaks no other protocol", ErrInvalidCommand, deviceID), false
	}
	if err := validateCommandID(id); err != nil {
		return wire.Ack{}, false, fmt.Errorf("send: %w", err), false
	}
	if len(want) == 0 {
		return wire.Ack{}, false, fmt.Errorf("send: %w: nothing to set on %s", ErrInvalidCommand, deviceID), false
	}
	e.mu.Lock()
	cmd, err := e.proto.Command(deviceID, want, id)
	e.mu.Unlock()
	if err != nil {
		return wire.Ack{}, false, fmt.Errorf("send: %w: %w", ErrInvalidCommand, err), false
	}
	key := ackKey{deviceID, id}
	c.mu.Lock()
	var known map[string]any
	if d := c.devices[deviceID]; d != nil {
		known = d.state
	}
	c.mu.Unlock()
	// A retry reads the device first (its command may have been applied
	// with its confirmation lost), and so does a command to a device
	// whose state is not known yet, whose undo needs it.
	var probe []adapter.Message
	if attempt > 1 || known == nil {
		e.mu.Lock()
		probe = e.proto.Probe(deviceID, id+probeSuffix)
		e.mu.Unlock()
	}
	c.mu.Lock()
	if c.eco.Load() != set {
		c.mu.Unlock()
		return wire.Ack{}, false, nil, true
	}
	if ack, done, err := c.postableLocked(key); done || err != nil {
		return ack, done, err, false
	}
	if _, busy := c.posted[key]; busy {
		c.mu.Unlock()
		return wire.Ack{}, false, fmt.Errorf("send %s to %s: %w", id, deviceID, ErrInFlight), false
	}
	if old := c.expect[deviceID]; old != nil {
		if _, live := c.posted[old.key]; live {
			c.mu.Unlock()
			return wire.Ack{}, false, fmt.Errorf("send %s to %s: %w", id, deviceID, ErrInFlight), false
		}
		// Its command was settled or given up on another way: the device
		// is not waiting on it any more.
		c.unexpectLocked(deviceID, old)
	}
	x := &expectation{key: key, want: cloneMap(want), set: set, first: attempt <= 1}
	logged := false
	if c.opts.PriorLog != nil {
		// What the device was before the step's first attempt, perhaps
		// in a process since killed (a step recovered after a kill runs
		// its attempt again, with the same number).
		var st map[string]any
		if st, logged = c.opts.PriorLog.Get(id); logged {
			x.prior, x.first = cloneMap(st), false
		}
	}
	var toLog map[string]any // logged once mu is released, before the command goes
	if d := c.devices[deviceID]; !logged && x.first && d != nil && d.state != nil {
		x.prior = cloneMap(d.state)
		toLog = x.prior
	}
	// Already there, by a report since the last command (a retry), or
	// by the last report of a device that cannot be read: nothing to send.
	if d := c.devices[deviceID]; d != nil && d.state != nil && (attempt > 1 || e.blind) && matchesWithin(d.state, x.want) {
		st := cloneMap(d.state)
		c.mu.Unlock()
		c.logPrior(id, toLog)
		return wire.Ack{ID: id, OK: true, State: st}, true, nil, false
	}
	c.posted[key] = onDone
	c.recent.Delete(key)
	c.gaveUp.Delete(key)
	c.expect[deviceID] = x
	set.pending++
	send := cmd
	if len(probe) > 0 {
		x.probing, x.cmd, send = true, cmd, probe
		wait := min(max(time.Until(giveUp)/3, 0), probeWindow)
		x.timer = time.AfterFunc(wait, func() { c.probeUnanswered(deviceID, x) })
	}
	c.mu.Unlock()
	// Logged before the publish: a process killed once the command is
	// out must leave the prior state behind for the step's undo.
	c.logPrior(id, toLog)
	if err := c.ecoPublish(deviceID, send); err != nil {
		c.mu.Lock()
		if c.expect[deviceID] == x {
			c.unexpectLocked(deviceID, x)
		}
		delete(c.posted, key)
		c.mu.Unlock()
		return wire.Ack{}, false, fmt.Errorf("send %s to %s: publish: %w: %w", id, deviceID, ErrNotConnected, err), false
	}
	return wire.Ack{}, false, nil, false
}

// logPrior keeps a step's prior state in the PriorLog, if any. Called
// without mu: the append is one write(2) to the page cache, but the
// log's occasional rewrite is more.
func (c *Client) logPrior(id string, prior map[string]any) {
	if c.opts.PriorLog == nil || prior == nil {
		return
	}
	if err := c.opts.PriorLog.Put(id, prior); err != nil {
		c.log.Warn("prior state not logged: an undo after a restart would leave the device as it is", "command", id, "err", err)
	}
}

// probeUnanswered sends the command of a retry whose read went
// unanswered.
func (c *Client) probeUnanswered(device string, x *expectation) {
	c.mu.Lock()
	if c.closed || c.expect[device] != x || !x.probing {
		c.mu.Unlock()
		return
	}
	x.probing, x.timer = false, nil
	cmd := x.cmd
	c.mu.Unlock()
	_ = c.ecoPublish(device, cmd) // lost with the connection: shows as the ack's timeout, retried
}

// ecoPublish sends an adapter's messages: at QoS 1, never retained.
func (c *Client) ecoPublish(device string, msgs []adapter.Message) error {
	for _, m := range msgs {
		if err := c.publish(m.Topic, m.Payload); err != nil {
			return err
		}
		c.stats.sent.Add(1)
	}
	c.log.Debug("ecosystem command", "device", device, "messages", len(msgs))
	return nil
}

// dropExpectation forgets the command a step gave up on. Caller holds mu.
func (c *Client) dropExpectation(key ackKey) {
	if x := c.expect[key.device]; x != nil && x.key == key {
		c.unexpectLocked(key.device, x)
	}
}

// probeOnConnect asks every device of the ecosystems that want it
// (adapter.Prober) for its state when a connection is up, and takes
// those that said nothing by their deadline offline.
func (c *Client) probeOnConnect() {
	for _, e := range c.eco.Load().ecos {
		pr, ok := e.proto.(adapter.Prober)
		if !ok {
			continue
		}
		sent := time.Now()
		c.mu.Lock()
		c.probes++
		seq := c.probes
		c.mu.Unlock()
		for _, d := range e.devices {
			e.mu.Lock()
			msgs := e.proto.Probe(d, fmt.Sprintf("connect-%d-%s", seq, d))
			e.mu.Unlock()
			_ = c.ecoPublish(d, msgs) // a connection lost again probes again when it is back
		}
		devs := e.devices
		timer := time.AfterFunc(pr.ProbeOnConnect(), func() {
			for _, d := range devs {
				c.mu.Lock()
				silent := !c.closed && c.heard[d].Before(sent)
				c.mu.Unlock()
				if !silent {
					continue
				}
				if c.update(d, "availability", func(x *deviceEntry) bool {
					changed := !x.availKnown || x.online
					x.availKnown, x.online = true, false
					return changed
				}) {
					c.log.Info("device availability", "device", d, "online", false, "protocol", e.name, "why", "no answer to the probe at connect")
				}
			}
		})
		c.mu.Lock()
		if old := c.probeTimers[e.name]; old != nil {
			old.Stop() // a reconnection's probe supersedes the last one
		}
		c.probeTimers[e.name] = timer
		c.mu.Unlock()
	}
}
