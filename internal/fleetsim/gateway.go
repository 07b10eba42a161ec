package fleetsim

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sortie-edge/sortie/internal/mqttc"
	"github.com/sortie-edge/sortie/uplink"
)

// Control result codes a light gateway sets itself, as the agent's
// uplink does (agent/hubsync).
const (
	codeInvalid     = "invalid"
	codeUnsupported = "unsupported"
	codeStale       = "stale"
)

// Bounds copied from the agent's uplink: the control queue, and the
// answers remembered for repeats.
const (
	controlQueue   = 64
	recentControls = 256
	maxReconnect   = 30 * time.Second
	publishTimeout = 10 * time.Second
)

// ref is a configuration that runs or ran, and where it came from.
type ref struct {
	k       *known
	version uint64
	source  string
	rollout string
	since   time.Time
}

// trial is the watch over a bundle applied and not yet kept.
type trial struct {
	soakEnd, confirmBy time.Time
	fromHub            bool
	devices            []string
	stops              []func() bool
}

// Gateway is one light gateway of a Fleet.
type Gateway struct {
	f       *Fleet
	id      string
	started time.Time

	// qmu guards the control queue, which paho's handler fills: it is
	// never held while anything waits for the network.
	beats   atomic.Uint64 // heartbeats sent
	isLossy atomic.Bool   // fault has FaultLossy, for paho's handler

	qmu     sync.Mutex
	queue   [][]byte
	serving bool

	mu         sync.Mutex
	fault      Fault
	slow       time.Duration
	boot       *known // what the config files made at the start
	files      *known // what they make now (a hand edit changes it)
	cur, prev  ref
	tr         *trial
	hubVersion uint64
	last       *outcome
	answers    answered
	client     *mqttc.Client
	up         bool
	cutNext    bool // the uplink drops once the result of this apply is out
	down       bool // the uplink is cut until the trial is decided
	closed     bool
	hbStop     func() bool
}

func newGateway(f *Fleet, id string, fault Fault, now time.Time) *Gateway {
	g := &Gateway{f: f, id: id, started: now}
	g.boot = f.files
	if fault&FaultRegistry != 0 {
		g.boot = f.other
	}
	g.files = g.boot
	g.cur = ref{k: g.boot, source: uplink.SourceFiles, since: now}
	g.setFaultLocked(fault)
	return g
}

// ID is the gateway's ID.
func (g *Gateway) ID() string { return g.id }

// Fault is what goes wrong on the gateway.
func (g *Gateway) Fault() Fault {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.fault
}

// SetFault gives the gateway the faults of f from now on; FaultOffline
// and FaultRegistry count from the next connection and the next start
// only (use SetOnline and a new Fleet), FaultDrift edits its files at
// once.
func (g *Gateway) SetFault(f Fault) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.setFaultLocked(f)
}

func (g *Gateway) setFaultLocked(f Fault) {
	g.fault = f
	g.isLossy.Store(f&FaultLossy != 0)
	if f&FaultSlow != 0 && g.slow == 0 {
		g.slow = g.f.slowDelay()
	}
	if f&FaultDrift != 0 {
		g.files = g.f.known.edited(g.boot)
	}
}

// Edit edits the gateway's config files by hand (FaultDrift).
func (g *Gateway) Edit() { g.SetFault(g.Fault() | FaultDrift) }

// Config is the configuration the gateway runs, as its heartbeat says.
func (g *Gateway) Config() uplink.ConfigState {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.configLocked()
}

func (g *Gateway) configLocked() uplink.ConfigState {
	c := uplink.ConfigState{Hash: g.cur.k.hash, Version: g.cur.version, Source: g.cur.source, Since: g.cur.since, Trial: g.tr != nil, SwapsRegistry: true}
	if g.files.hash != c.Hash {
		c.Files = g.files.hash
	}
	return c
}

// Last is the latest bundle status the gateway decided, if any.
func (g *Gateway) Last() (uplink.BundleStatus, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.last == nil {
		return uplink.BundleStatus{}, false
	}
	return g.last.BundleStatus, true
}

// Connected says whether the gateway's hub connection is up.
func (g *Gateway) Connected() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.up
}

// SetOnline brings an offline gateway to the hub (it connects in the
// background, and keeps trying), or takes one away as a power cut
// would: the broker publishes its last will.
func (g *Gateway) SetOnline(on bool) {
	g.mu.Lock()
	if on {
		g.fault &^= FaultOffline
		g.mu.Unlock()
		g.connect()
		return
	}
	g.fault |= FaultOffline
	c := g.client
	g.client = nil
	g.mu.Unlock()
	if c != nil {
		c.Abort()
		c.Close()
	}
}

// start connects the gateway and waits for the first connection.
func (g *Gateway) start(ctx context.Context) error {
	c := g.connect()
	if c == nil {
		return nil
	}
	return c.Connect(ctx)
}

// connect makes the gateway's client, if it has none, and starts it; it
// returns the client, nil when closed or offline.
func (g *Gateway) connect() *mqttc.Client {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed || g.fault&FaultOffline != 0 || g.down || g.f.ctx.Err() != nil {
		return nil
	}
	if g.client != nil {
		return g.client
	}
	o := &g.f.opts
	topics := uplink.Topics{Prefix: o.Prefix}
	will, err := json.Marshal(uplink.Status{Gateway: g.id, State: uplink.StateOffline, Protocol: uplink.Protocol, Version: o.Version, Started: g.started})
	if err != nil {
		return nil // a Status always encodes
	}
	var password string
	if o.Password != nil {
		password = o.Password(g.id)
	}
	var c *mqttc.Client
	c, err = mqttc.New(mqttc.Options{
		Broker: o.Broker, ClientID: uplink.DefaultClientID(g.id), Username: g.id, Password: password,
		Will:    &mqttc.Will{Topic: topics.Status(g.id), Payload: will, QoS: 1, Retained: !o.NoRetain},
		Ordered: true, Abortable: true, MaxReconnectInterval: maxReconnect, Timeout: publishTimeout,
		OnConnect:        func() { g.onConnect(c) },
		OnConnectionLost: func(error) { g.onLost(c) },
		Logger:           g.f.log.With("gateway", g.id),
	})
	if err != nil {
		g.f.log.Error("gateway client", "gateway", g.id, "err", err)
		return nil
	}
	// QoS 0, as the agent's: an ack lost is made up by a resend, a
	// control by the hub sending it again.
	if _, err := c.SubscribeQoS(topics.Ack(g.id), 0, func(string, []byte) {}); err != nil {
		return nil
	}
	if _, err := c.SubscribeQoS(topics.Control(g.id), 0, g.onControl); err != nil {
		return nil
	}
	g.client = c
	if g.hbStop == nil {
		g.armHeartbeat(true)
	}
	c.Start()
	return c
}

// onConnect announces the gateway on a new connection: its presence,
// a heartbeat, then the latest bundle status again (the agent's order).
func (g *Gateway) onConnect(c *mqttc.Client) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.client != c {
		return
	}
	if !g.up {
		g.up = true
		g.f.connected.Add(1)
	}
	o := &g.f.opts
	st := uplink.Status{Gateway: g.id, State: uplink.StateOnline, Protocol: uplink.Protocol, Version: o.Version,
		Started: g.started, Time: o.Clock.Now(), Broker: o.Broker}
	if err := g.publishLocked(g.topics().Status(g.id), !o.NoRetain, st); err != nil {
		return
	}
	g.heartbeatLocked()
	if g.last != nil {
		g.sendLocked(*g.last)
	}
	g.decideLocked()
}

func (g *Gateway) onLost(c *mqttc.Client) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.up && (g.client == c || g.client == nil) {
		g.up = false
		g.f.connected.Add(-1)
	}
}

func (g *Gateway) topics() uplink.Topics { return uplink.Topics{Prefix: g.f.opts.Prefix} }

// publishLocked sends v at QoS 1 on the connection that is up, waiting
// for the broker at most publishTimeout; an error at once when none is.
func (g *Gateway) publishLocked(topic string, retained bool, v any) error {
	if g.client == nil || !g.up {
		return mqttc.ErrNotConnected
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode for %s: %w", topic, err)
	}
	return mqttc.Wait(g.f.ctx, g.client.PublishAsync(topic, b, retained, 1), publishTimeout)
}

// armHeartbeat schedules the next heartbeat; the first of a fleet's
// falls at a random point of the interval, as gateways started at
// different times would.
func (g *Gateway) armHeartbeat(first bool) {
	d := g.f.opts.Heartbeat
	if first {
		d = time.Duration(g.f.chance() * float64(d))
	}
	g.hbStop = g.f.opts.Clock.AfterFunc(d, g.beat)
}

func (g *Gateway) beat() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed || g.f.ctx.Err() != nil {
		return
	}
	g.armHeartbeat(false)
	g.heartbeatLocked()
}

// beatNow sends a heartbeat at once; it says whether it went out.
func (g *Gateway) beatNow() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.heartbeatLocked()
}

func (g *Gateway) heartbeatLocked() bool {
	if !g.up {
		return false
	}
	o := &g.f.opts
	now := o.Clock.Now()
	cfg := g.configLocked()
	k := g.cur.k
	devs := k.devices
	if g.fault&FaultDevicesSilent != 0 || len(g.f.silent) > 0 {
		devs = make([]uplink.DeviceState, len(k.devices))
		for i, d := range k.devices {
			d.Online = !g.silentLocked(d.ID)
			devs[i] = d
		}
	}
	if devs == nil {
		devs = []uplink.DeviceState{}
	}
	hb := uplink.Heartbeat{Gateway: g.id, Version: o.Version, Uptime: now.Sub(g.started).Seconds(), Devices: devs,
		Scenes: k.scenes, Time: now, Broker: o.Broker, Config: &cfg}
	if err := g.publishLocked(g.topics().Heartbeat(g.id), false, hb); err != nil {
		return false
	}
	g.f.stats.heartbeats.Add(1)
	g.beats.Add(1)
	return true
}

// Heartbeats is how many heartbeats the gateway has sent.
func (g *Gateway) Heartbeats() uint64 { return g.beats.Load() }

func (g *Gateway) silentLocked(device string) bool {
	return g.fault&FaultDevicesSilent != 0 || g.f.silent[device]
}

// close says goodbye and disconnects.
func (g *Gateway) close() {
	g.mu.Lock()
	g.closed = true
	if g.hbStop != nil {
		g.hbStop()
	}
	if g.tr != nil {
		for _, stop := range g.tr.stops {
			stop()
		}
	}
	c := g.client
	if c != nil && g.up {
		o := &g.f.opts
		st := uplink.Status{Gateway: g.id, State: uplink.StateOffline, Protocol: uplink.Protocol, Version: o.Version, Started: g.started, Time: o.Clock.Now()}
		if b, err := json.Marshal(st); err == nil {
			// The goodbye is best effort: a broker that is gone publishes
			// the will instead.
			_ = mqttc.Wait(context.Background(), c.PublishAsync(g.topics().Status(g.id), b, !o.NoRetain, 1), time.Second)
		}
	}
	g.client = nil
	g.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// onControl queues a control request for the gateway's worker; it runs
// on paho's goroutine and never blocks.
func (g *Gateway) onControl(topic string, payload []byte) {
	if topic != g.topics().Control(g.id) {
		return
	}
	if g.lossy() {
		return
	}
	g.qmu.Lock()
	if len(g.queue) >= controlQueue || g.f.ctx.Err() != nil {
		g.qmu.Unlock()
		return
	}
	g.queue = append(g.queue, payload)
	start := !g.serving
	g.serving = true
	g.qmu.Unlock()
	if start {
		g.f.wg.Go(g.serve)
	}
}

// lossy draws whether a lossy gateway loses this message. It takes no
// lock of the gateway's: paho's handler calls it, and must not wait for
// a publish in flight under g.mu, whose PUBACK paho would hold behind it.
func (g *Gateway) lossy() bool {
	if g.isLossy.Load() && g.f.chance() < g.f.opts.Faults.LossRate {
		g.f.stats.lost.Add(1)
		return true
	}
	return false
}

// serve answers the queued requests one at a time, in arrival order,
// and ends when the queue is empty: an idle gateway has no goroutine.
func (g *Gateway) serve() {
	for {
		g.qmu.Lock()
		if len(g.queue) == 0 || g.f.ctx.Err() != nil {
			g.queue, g.serving = nil, false
			g.qmu.Unlock()
			return
		}
		p := g.queue[0]
		g.queue = g.queue[1:]
		g.qmu.Unlock()
		g.answer(p)
	}
}

// answer carries out one request, or answers a repeat from memory, and
// publishes the result.
func (g *Gateway) answer(p []byte) {
	g.mu.Lock()
	slow := g.slow
	if g.fault&FaultSlow == 0 {
		slow = 0
	}
	g.mu.Unlock()
	if slow > 0 {
		t := time.NewTimer(slow)
		select {
		case <-t.C:
		case <-g.f.ctx.Done():
			t.Stop()
			return
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	res, again := g.answers.get(uplink.ControlID(p))
	if again {
		g.f.stats.repeats.Add(1)
	} else {
		res = g.controlLocked(p)
		if res.Code != codeInvalid {
			g.answers.put(res)
		}
	}
	g.f.stats.controls.Add(1)
	if !g.lossy() {
		if err := g.publishLocked(g.topics().ControlResult(g.id), false, res); err != nil {
			g.f.log.Debug("control result not delivered", "gateway", g.id, "id", res.ID, "err", err)
		}
	}
	if g.cutNext {
		g.cutNext = false
		g.cutLocked()
	}
}

// controlLocked decodes and performs one request.
func (g *Gateway) controlLocked(p []byte) uplink.ControlResult {
	c, err := uplink.DecodeControl(p)
	if err != nil {
		id := uplink.ControlID(p)
		if id == "" {
			id = "invalid"
		}
		return uplink.ControlResult{ID: id, Error: err.Error(), Code: codeInvalid}
	}
	if c.Action != uplink.ActionBundle {
		return uplink.ControlResult{ID: c.ID, Error: "a simulated gateway runs no missions", Code: codeUnsupported}
	}
	return g.offeredLocked(c)
}

// cutLocked drops the hub connection without a goodbye (the broker
// publishes the will) and keeps it down until the trial is decided.
func (g *Gateway) cutLocked() {
	c := g.client
	g.client, g.down = nil, true
	if g.up {
		g.up = false
		g.f.connected.Add(-1)
	}
	if c == nil {
		return
	}
	c.Abort()
	// Close waits for the client's goroutine, which may be waiting for
	// g.mu in a hook: it is closed off this lock.
	g.f.wg.Go(c.Close)
}

// reconnect ends a cut.
func (g *Gateway) reconnectLocked() {
	if !g.down {
		return
	}
	g.down = false
	g.f.wg.Go(func() { g.connect() })
}

// answered remembers the latest control results by request ID, the
// oldest forgotten first; it holds nothing until the first request.
type answered struct {
	order []string
	res   map[string]uplink.ControlResult
}

func (a *answered) get(id string) (uplink.ControlResult, bool) {
	if id == "" || a.res == nil {
		return uplink.ControlResult{}, false
	}
	r, ok := a.res[id]
	return r, ok
}

func (a *answered) put(r uplink.ControlResult) {
	if r.ID == "" {
		return
	}
	if a.res == nil {
		a.res = map[string]uplink.ControlResult{}
	}
	if _, ok := a.res[r.ID]; ok {
		return
	}
	if len(a.order) == recentControls {
		delete(a.res, a.order[0])
		a.order = a.order[1:]
	}
	a.order = append(a.order, r.ID)
	a.res[r.ID] = r
}
