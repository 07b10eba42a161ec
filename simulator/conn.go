package simulator

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/sortie-edge/sortie/devices/wire"
	"github.com/sortie-edge/sortie/internal/mqttc"
)

// Timeouts of the device's MQTT connection. A token that does not
// complete in time is logged and abandoned, never waited for forever.
const (
	connectTimeout = 5 * time.Second
	tokenTimeout   = 5 * time.Second
	minBackoff     = 100 * time.Millisecond
	maxBackoff     = 5 * time.Second
)

// session is one MQTT connection of a device: a client that connects
// once (mqttc's Once). A device never reconnects a session: each
// connection gets a fresh one, with a client ID of its own, as a
// rebooted device would.
type session struct {
	client *mqttc.Client

	lost     chan struct{} // closed once the connection is lost
	lostOnce sync.Once
	lostErr  error

	// ended is set, under the device's mu, once the device is done with
	// the session; a late OnConnect must not revive it.
	ended bool
}

// abort closes the network connection under the client's feet. The
// broker sees the connection end without a DISCONNECT packet and
// publishes the device's last will, which is exactly what a power cut
// looks like.
func (s *session) abort() { s.client.Abort() }

func (s *session) markLost(err error) {
	s.lostOnce.Do(func() {
		s.lostErr = err
		close(s.lost)
	})
}

// waitToken waits for a publish, at most tokenTimeout.
func waitToken(t mqttc.Token, what string) error {
	if err := mqttc.Wait(context.Background(), t, tokenTimeout); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// connect opens a new session to the broker, with the device's last will
// set to a retained "offline", and returns once the device listens for
// commands and is announced. It does not stop half way when ctx ends: a
// device announced "online" must live to say "offline" (serve's
// goodbye), so connecting is bounded by its own timeouts instead.
func (d *Device) connect(ctx context.Context) (*session, error) {
	s := &session{lost: make(chan struct{})}
	c, err := mqttc.New(mqttc.Options{
		Broker: d.broker, ClientID: d.nextClientID(), Username: d.username, Password: d.password, TLS: d.tls,
		Will:      &mqttc.Will{Topic: d.topics.Availability(d.id), Payload: []byte(wire.Offline), QoS: 1, Retained: true},
		KeepAlive: 15 * time.Second, ConnectTimeout: connectTimeout, Timeout: tokenTimeout,
		// Commands in arrival order, on the client's receive path (see
		// command).
		Ordered:          true,
		Once:             true,
		Abortable:        true,
		OnConnect:        func() { d.onConnect(s) },
		OnConnectionLost: s.markLost,
		Logger:           d.log,
	})
	if err != nil {
		return nil, err
	}
	s.client = c
	if _, err := c.Subscribe(d.topics.Command(d.id), func(_ string, payload []byte) { d.command(payload) }); err != nil {
		c.Close()
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), connectTimeout+2*tokenTimeout)
	defer cancel()
	if err := c.Connect(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return s, nil
}

// nextClientID gives each session its own client ID. A broker may still
// be tearing down a cut connection when the device comes back; mochi, for
// one, then drops the subscriptions of whatever client holds the same ID,
// which would leave the new session deaf.
func (d *Device) nextClientID() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sessions++
	return fmt.Sprintf("%s.%d", d.clientID, d.sessions)
}

// onConnect announces the device once it listens for commands (the
// client has subscribed before it runs this): its current state, then
// "online".
func (d *Device) onConnect(s *session) {
	// The session takes outputs before "online" goes out: the agent may
	// send a command the moment it sees "online", and its ack must not
	// find the device without a connection to send it on (it would be
	// lost, and the command would wait out its ack timeout).
	d.mu.Lock()
	if s.ended {
		d.mu.Unlock()
		return
	}
	d.conn = s
	d.mu.Unlock()
	// State first, then "online" (docs/protocol.md): an agent that reads
	// "online" then finds the state it reports, not a stale one.
	d.mu.Lock()
	st := d.stateOutput(time.Now())
	d.mu.Unlock()
	if err := s.client.Publish(st.topic, st.payload, true, 1); err != nil {
		d.log.Warn("cannot report state", "err", err)
	}
	if err := s.client.Publish(d.topics.Availability(d.id), []byte(wire.Online), true, 1); err != nil {
		d.log.Warn("cannot announce; dropping connection", "err", err)
		d.detach(s)
		s.abort()
		return
	}
	d.mu.Lock()
	if s.ended || d.conn != s {
		d.mu.Unlock()
		return
	}
	d.announced = true
	close(d.onlineWait)
	d.mu.Unlock()
	d.log.Info("online")
}

// detach forgets s as the device's connection.
func (d *Device) detach(s *session) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s.ended = true
	if d.conn == s {
		if d.announced {
			d.onlineWait = make(chan struct{})
		}
		d.conn, d.announced = nil, false
	}
}

// Online reports whether the device is connected, listening for commands
// and announced online.
func (d *Device) Online() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.conn != nil && d.announced
}

// WaitOnline waits until the device is online or ctx ends.
func (d *Device) WaitOnline(ctx context.Context) error {
	d.mu.Lock()
	ch := d.onlineWait
	d.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		d.mu.Lock()
		last := d.connectErr
		d.mu.Unlock()
		if last != nil {
			return fmt.Errorf("device %s not online: %w (last attempt: %w)", d.id, context.Cause(ctx), last)
		}
		return fmt.Errorf("device %s not online: %w", d.id, context.Cause(ctx))
	}
}

// SetOnline takes the device offline (on false) until SetOnline(true). It
// drops the connection without a DISCONNECT so the broker fires the last
// will, and reconnects on true, announcing "online" again.
func (d *Device) SetOnline(on bool) {
	d.mu.Lock()
	d.forcedOff = !on
	if on {
		d.offlineUntil = time.Time{}
	}
	d.mu.Unlock()
	d.poke()
	d.log.Info("online set", "online", on)
}

// GoOffline takes the device offline for a period, as a power cut would.
func (d *Device) GoOffline(period time.Duration) {
	d.mu.Lock()
	d.offlineUntil = time.Now().Add(period)
	d.mu.Unlock()
	d.poke()
	d.log.Info("outage", "for", period)
}

// offline says whether the device should stay away now, and for how long
// at most (0 means until poked).
func (d *Device) offline(now time.Time) (bool, time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.forcedOff {
		return true, 0
	}
	if now.Before(d.offlineUntil) {
		return true, d.offlineUntil.Sub(now)
	}
	return false, 0
}

// run keeps the device connected as long as it should be, until ctx ends.
func (d *Device) run(ctx context.Context) {
	backoff := minBackoff
	for ctx.Err() == nil {
		if off, wait := d.offline(time.Now()); off {
			d.pause(ctx, wait)
			continue
		}
		s, err := d.connect(ctx)
		d.mu.Lock()
		d.connectErr = err
		d.mu.Unlock()
		if err != nil {
			d.log.Warn("connect failed", "err", err, "retry_in", backoff)
			d.pause(ctx, backoff)
			backoff = min(2*backoff, maxBackoff)
			continue
		}
		backoff = minBackoff
		if d.serve(ctx, s) {
			// The connection broke on its own: do not hammer the broker.
			d.pause(ctx, minBackoff)
			continue
		}
		// After a cut, give the broker time to publish the last will
		// before announcing "online" again, whatever pokes say: the
		// retained availability must end up "online", not "offline".
		t := time.NewTimer(minBackoff)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// pause waits for wait (forever if 0), a poke, or the end of ctx.
func (d *Device) pause(ctx context.Context, wait time.Duration) {
	var tc <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		tc = t.C
	}
	select {
	case <-ctx.Done():
	case <-d.wake:
	case <-tc:
	}
}

// serve watches a live session until it ends, and closes it. It reports
// whether the connection broke by itself, as opposed to being ended on
// purpose.
func (d *Device) serve(ctx context.Context, s *session) (broke bool) {
	defer s.client.Close()
	defer d.detach(s)
	var (
		every  time.Duration
		outage *time.Timer
		tc     <-chan time.Time
	)
	schedule := func() {
		d.mu.Lock()
		f := d.faults
		if f.OfflineEvery == every {
			d.mu.Unlock()
			return
		}
		every = f.OfflineEvery
		wait := every/2 + time.Duration(d.dice.offline.Float64()*float64(every))
		d.mu.Unlock()
		if outage != nil {
			outage.Stop()
			tc = nil
		}
		if every > 0 {
			outage = time.NewTimer(wait)
			tc = outage.C
		}
	}
	schedule()
	defer func() {
		if outage != nil {
			outage.Stop()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			d.goodbye(s)
			return false
		case <-s.lost:
			d.log.Warn("connection lost", "err", s.lostErr)
			return true
		case <-d.wake:
			if off, _ := d.offline(time.Now()); off {
				d.cut(s, "taken offline")
				return false
			}
			schedule()
		case <-tc:
			d.mu.Lock()
			d.offlineUntil = time.Now().Add(d.faults.OfflineFor)
			period := d.faults.OfflineFor
			d.mu.Unlock()
			d.cut(s, fmt.Sprintf("scheduled outage for %v", period))
			return false
		}
	}
}

// cut drops the connection abruptly and waits until the client has
// noticed, so the next session starts from a clean slate.
func (d *Device) cut(s *session, why string) {
	d.detach(s)
	s.abort()
	select {
	case <-s.lost:
	case <-time.After(tokenTimeout):
		d.log.Warn("connection did not report loss after abort")
	}
	d.log.Info("offline: connection dropped without DISCONNECT", "why", why)
}

// goodbye ends a session at shutdown. A clean DISCONNECT suppresses the
// last will, so the device first says "offline" itself: retained
// availability must not claim a device that is gone.
func (d *Device) goodbye(s *session) {
	d.detach(s)
	if err := s.client.Publish(d.topics.Availability(d.id), []byte(wire.Offline), true, 1); err != nil {
		d.log.Warn("shutdown: announce offline", "err", err)
	}
	s.client.Close()
	d.log.Info("offline: shut down")
}

// command is the device's firmware on one command. It runs on the
// client's ordered handler, in arrival order, so a command costs no
// hand-off to another goroutine before its ack goes out; the worker
// waits for the PUBACKs. paho's advice is not to publish from an ordered
// handler at all. Its concern is waiting: a handler that waits for a
// token stalls the routing that token may need. PublishAsync alone only
// hands the packet to paho's writer goroutine, which does not depend on
// the router (paho v1.5) and is held up only by a socket the broker stops
// reading, and then for at most the write timeout.
func (d *Device) command(payload []byte) {
	d.emitMu.Lock()
	e := d.emitNow(d.handle(payload, time.Now()))
	d.emitMu.Unlock()
	d.watch(e.pending, time.Now())
	// The worker is woken only when it has something to do: outputs to
	// send later, or a curtain's travel to time.
	if _, moving := d.travelDue(); len(e.delayed) == 0 && !moving {
		return
	}
	select {
	case d.settling <- emitted{delayed: e.delayed}:
	default:
		d.log.Warn("outputs not followed up: worker backlog full", "delayed_dropped", len(e.delayed))
	}
}

// maxUnsettled bounds Device.unsettled.
const maxUnsettled = 1024

// watch adds a command's publishes to those whose PUBACK is awaited, and
// logs the ones among them that failed, or had no PUBACK within the token
// timeout, by now. It runs at every command, and a second after it left
// some awaited: a goroutine waiting for each command's PUBACKs cost a
// core's wake-up per command, 1.7% of an agent's step end to end.
func (d *Device) watch(ps []sent, now time.Time) {
	d.unsettledMu.Lock()
	defer d.unsettledMu.Unlock()
	for _, p := range ps {
		p.at = now
		d.unsettled = append(d.unsettled, p)
	}
	keep := d.unsettled[:0]
	for _, p := range d.unsettled {
		err := errOffline
		if p.tok != nil {
			select {
			case <-p.tok.Done():
				err = p.tok.Error()
			default:
				if now.Sub(p.at) <= tokenTimeout {
					keep = append(keep, p)
					continue
				}
				err = fmt.Errorf("publish: no PUBACK after %v", tokenTimeout)
			}
		}
		d.settled(p.o, err)
	}
	if over := len(keep) - maxUnsettled; over > 0 {
		d.log.Warn("publishes not followed up: too many awaiting their PUBACK", "dropped", over)
		keep = keep[:copy(keep, keep[over:])]
	}
	clear(d.unsettled[len(keep):])
	d.unsettled = keep
	if len(keep) > 0 && !d.sweeping {
		d.sweeping = true
		time.AfterFunc(time.Second, func() {
			d.unsettledMu.Lock()
			d.sweeping = false
			d.unsettledMu.Unlock()
			d.watch(nil, time.Now())
		})
	}
}

// work is the device's worker: it starts what commands left for later
// and ends curtain travel on time.
func (d *Device) work(ctx context.Context, wg *sync.WaitGroup) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		if due, ok := d.travelDue(); ok {
			t.Reset(time.Until(due))
		} else {
			t.Stop()
		}
		select {
		case <-ctx.Done():
			return
		case e := <-d.settling:
			d.followUp(ctx, wg, e)
		case now := <-t.C:
			d.emitMu.Lock()
			e := d.emitNow(d.finishTravel(now))
			d.emitMu.Unlock()
			d.followUp(ctx, wg, e)
		}
	}
}

// sent is a published output, its token (nil: not published, the
// device was offline), and when it was published.
type sent struct {
	o   output
	tok mqttc.Token
	at  time.Time
}

// emitted is what one decision published at once, and what it left for
// later.
type emitted struct {
	pending []sent
	delayed []output
}

// emitNow publishes the immediate outputs in order (they are written in
// that order on the one connection) and sets the delayed ones aside.
// d.emitMu is held.
func (d *Device) emitNow(outs []output) emitted {
	var e emitted
	for _, o := range outs {
		if o.delay > 0 {
			e.delayed = append(e.delayed, o)
			continue
		}
		e.pending = append(e.pending, sent{o: o, tok: d.send(o)})
		if o.ack {
			// Let the client's writer send the ack from this core now, rather
			// than from another core woken for it while this goroutine goes
			// on to publish the state report: the ack is what the
			// command's sender waits for.
			runtime.Gosched()
		}
	}
	return e
}

// followUp starts the delayed outputs, each from its own goroutine so a
// slow ack does not hold up the next command, then waits for the
// immediate ones: all were sent before any is waited for, at the cost of
// one broker round trip instead of one per message.
func (d *Device) followUp(ctx context.Context, wg *sync.WaitGroup, e emitted) {
	for _, o := range e.delayed {
		wg.Go(func() {
			t := time.NewTimer(o.delay)
			defer t.Stop()
			select {
			case <-ctx.Done():
			case <-t.C:
				d.settle(o, d.send(o))
			}
		})
	}
	for _, p := range e.pending {
		d.settle(p.o, p.tok)
	}
}

var errOffline = errors.New("offline")

// send publishes o on the current connection; a nil token means offline.
func (d *Device) send(o output) mqttc.Token {
	d.mu.Lock()
	s := d.conn
	d.mu.Unlock()
	if s == nil {
		return nil
	}
	return s.client.PublishAsync(o.topic, o.payload, o.retained, 1)
}

// settle waits for a publish and logs a loss.
func (d *Device) settle(o output, tok mqttc.Token) {
	err := errOffline
	if tok != nil {
		err = waitToken(tok, "publish")
	}
	d.settled(o, err)
}

// settled logs a publish's outcome: a loss as a warning.
func (d *Device) settled(o output, err error) {
	if err != nil {
		d.log.Warn("message lost", "topic", o.topic, "err", err)
		return
	}
	if o.ack {
		d.log.Debug("ack sent", "payload", string(o.payload))
	}
}
