package driver

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Options configures a Driver. Zero fields take the documented defaults.
type Options struct {
	// Store persists missions. Required.
	Store Store
	// Handlers maps step kinds to handlers. More can be added with
	// Register before Start.
	Handlers map[string]Handler
	// Observers receive every committed event.
	Observers []Observer
	// Clock tells time; default SystemClock.
	Clock Clock
	// Logger; default discards.
	Logger *slog.Logger
	// Workers bounds how many steps execute at once; default 16.
	Workers int
	// StepTimeout bounds a step attempt whose step sets no timeout;
	// default 10s.
	StepTimeout time.Duration
	// LeaseGrace is added to a step's timeout to form its lease; default 5s.
	LeaseGrace time.Duration
	// StopGrace is how long Stop waits for in-flight steps before
	// cancelling them; default 10s.
	StopGrace time.Duration
	// NotReadyRetry is how long a not-ready step waits when its error
	// gives no RetryAfter and nothing wakes it; default 5s.
	NotReadyRetry time.Duration
	// MaxWait bounds not-ready waiting when neither the step's
	// MaxElapsed nor the mission's deadline does; default 10m.
	MaxWait time.Duration
	// Owner names this driver in leases; default a random ID.
	Owner string
	// Seed seeds backoff jitter; zero seeds from the clock.
	Seed uint64
	// MaxLive bounds the missions live at once (not terminal): a Submit
	// beyond it fails with ErrFull and creates nothing. Every live
	// mission is held in memory, so the bound is what keeps a burst of
	// triggers from growing the process with the burst. Zero means no
	// bound. Missions loaded at Start, and operators' Retry of finished
	// ones, are never refused; a Submit of a request key already stored
	// returns its mission.
	MaxLive int
}

func (o *Options) setDefaults() {
	if o.Clock == nil {
		o.Clock = SystemClock{}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.Workers <= 0 {
		o.Workers = 16
	}
	if o.StepTimeout <= 0 {
		o.StepTimeout = 10 * time.Second
	}
	if o.LeaseGrace <= 0 {
		o.LeaseGrace = 5 * time.Second
	}
	if o.StopGrace <= 0 {
		o.StopGrace = 10 * time.Second
	}
	if o.NotReadyRetry <= 0 {
		o.NotReadyRetry = 5 * time.Second
	}
	if o.MaxWait <= 0 {
		o.MaxWait = 10 * time.Minute
	}
	if o.Owner == "" {
		o.Owner = "driver-" + randomHex(6)
	}
	if o.Seed == 0 {
		o.Seed = uint64(o.Clock.Now().UnixNano())
	}
}

// Driver advances missions. It is safe for concurrent use. Create one with
// New, register handlers, then either Start it (and Stop it) or call Step
// to advance what is due synchronously (for tests).
type Driver struct {
	opts  Options
	store Store
	clock Clock
	log   *slog.Logger

	mu        sync.Mutex
	handlers  map[string]Handler
	observers []Observer
	entries   map[string]*entry
	reserved  int // Submits past the MaxLive check, not yet in entries
	sched     scheduler
	running   int  // workers in flight
	zombies   int  // abandoned handlers still running (see expire)
	refusedN  int  // transitions the state table refused (see refused)
	started   bool // Start has run
	stopping  bool // Stop has begun: take no new steps
	// draining is Stop's first phase: the loop runs only to resume
	// attempts parked in flight (their outcome is on its way), until
	// none is left or the grace runs out; drained hears of each end.
	draining bool
	drained  chan struct{}
	// parked counts parked attempts; inFlight those of them whose effect
	// is under way.
	parked, inFlight int
	randMu           sync.Mutex
	rand             *mrand.Rand

	kick      chan struct{} // wakes the loop; buffered, one pending kick is enough
	stopCh    chan struct{} // closed when Stop begins
	timerStop func() bool
	timerAt   time.Time

	runCtx    context.Context // parent of step contexts; cancelled when Stop's grace runs out
	runCancel context.CancelFunc
	loopDone  chan struct{}
	workers   sync.WaitGroup
	// idle hands a due mission to a parked worker goroutine. Workers
	// outlive their missions because a new goroutine would grow its
	// stack again, copying it two or three times, for every mission.
	idle chan task

	idSeq atomic.Uint32
	// noteMu serialises notes on finished missions (see Note).
	noteMu sync.Mutex

	// wakes counts Wake calls, and lastWake records the count at the last
	// Wake of each key (bounded: see Wake). A step that returns to wait
	// for a key Wake named while it ran is woken at once: Wake passes
	// running missions by, since they are not waiting yet.
	wakes    uint64
	lastWake map[string]uint64
	wakeRing []string // lastWake's keys in insertion order, to evict the oldest
	wakeNext int
	// byKey files waiting entries (parked attempts, not-ready waits) by
	// what they wait for, so Wake costs the entries it wakes, not a scan
	// of every mission. Most keys (a command's ack, its turn) have one
	// entry, so a slice, not a set: it costs a parked step ~50 bytes
	// rather than a map's ~300.
	byKey map[string][]*entry
}

// New returns a driver. It does not touch the store until Start or Step.
func New(opts Options) (*Driver, error) {
	if opts.Store == nil {
		return nil, errors.New("driver: Options.Store is required")
	}
	opts.setDefaults()
	d := &Driver{
		opts:      opts,
		store:     opts.Store,
		clock:     opts.Clock,
		log:       opts.Logger,
		handlers:  make(map[string]Handler, len(opts.Handlers)),
		observers: append([]Observer(nil), opts.Observers...),
		entries:   make(map[string]*entry),
		kick:      make(chan struct{}, 1),
		idle:      make(chan task),
		lastWake:  make(map[string]uint64, maxWakeKeys),
		wakeRing:  make([]string, maxWakeKeys),
		byKey:     make(map[string][]*entry),
		stopCh:    make(chan struct{}),
		drained:   make(chan struct{}, 1),
		rand:      mrand.New(mrand.NewPCG(opts.Seed, opts.Seed^0x9e3779b97f4a7c15)),
	}
	for k, h := range opts.Handlers {
		d.handlers[k] = h
	}
	d.runCtx, d.runCancel = context.WithCancel(context.Background())
	return d, nil
}

// Register adds a handler for a step kind. It replaces any earlier one.
func (d *Driver) Register(kind string, h Handler) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.handlers[kind] = h
}

// Observe adds an observer of committed events.
func (d *Driver) Observe(o Observer) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.observers = append(d.observers, o)
}

// Owner is the name this driver writes into leases.
func (d *Driver) Owner() string { return d.opts.Owner }

// load reads active missions from the store into the scheduler once.
func (d *Driver) load(ctx context.Context) error {
	d.mu.Lock()
	if d.started {
		d.mu.Unlock()
		return nil
	}
	d.started = true
	d.mu.Unlock()
	ms, err := d.store.Active(ctx)
	if err != nil {
		return fmt.Errorf("load active missions: %w", err)
	}
	now := d.clock.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, m := range ms {
		if _, ok := d.entries[m.ID]; ok || m.State.Terminal() {
			continue
		}
		e := &entry{m: m, ready: -1, timer: -1}
		d.entries[m.ID] = e
		d.placeLocked(e, now)
	}
	if len(ms) > 0 {
		d.log.Info("loaded active missions", "count", len(ms))
	}
	return nil
}

// Start loads the active missions and starts the loop. Missions left
// STEP_RUNNING under another owner's lease are recovered at once: the
// store's file lock guarantees that owner is gone.
func (d *Driver) Start(ctx context.Context) error {
	if err := d.load(ctx); err != nil {
		return err
	}
	d.mu.Lock()
	if d.loopDone != nil || d.stopping {
		d.mu.Unlock()
		return errors.New("driver: already started")
	}
	d.loopDone = make(chan struct{})
	d.mu.Unlock()
	go d.loop()
	return nil
}

// Run starts the driver and stops it when ctx is done, for use in an
// errgroup. It returns nil after a clean stop.
func (d *Driver) Run(ctx context.Context) error {
	if err := d.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.Background(), d.opts.StopGrace)
	defer cancel()
	return d.Stop(stopCtx)
}

// Stop stops taking steps and waits for in-flight steps to finish and
// be saved, up to Options.StopGrace or ctx, whichever ends first: steps
// executing, and attempts parked in flight (a command sent, its ack to
// come), which are resumed as their outcome arrives. Steps still
// running then are cancelled, and attempts still parked are left; their
// missions stay STEP_RUNNING under this driver's lease and are recovered
// by the next Start. Nothing new starts once Stop is called.
func (d *Driver) Stop(ctx context.Context) error {
	d.mu.Lock()
	if d.stopping || d.draining {
		d.mu.Unlock()
		return nil
	}
	d.draining = true
	close(d.stopCh) // idle workers go; a resume during the drain gets a new one
	started := d.loopDone != nil
	d.mu.Unlock()
	grace := time.NewTimer(d.opts.StopGrace)
	defer grace.Stop()
	var err error
	if started {
		err = d.drain(ctx, grace.C)
	}
	d.mu.Lock()
	d.stopping = true
	loopDone := d.loopDone
	if d.timerStop != nil {
		d.timerStop()
	}
	d.mu.Unlock()
	d.signal()
	if loopDone != nil {
		<-loopDone
	}
	done := make(chan struct{})
	go func() { d.workers.Wait(); close(done) }()
	if err == nil {
		select {
		case <-done:
		case <-ctx.Done():
			err = fmt.Errorf("stop: in-flight steps cancelled: %w", ctx.Err())
		case <-grace.C:
			err = errors.New("stop: in-flight steps cancelled after grace period")
		}
	}
	d.runCancel()
	// Handlers get one more moment to notice the cancellation; one that
	// ignores its context is abandoned rather than hanging shutdown.
	select {
	case <-done:
	case <-time.After(time.Second):
		err = errors.Join(err, errors.New("stop: a step handler ignored cancellation"))
	}
	return err
}

// drain waits until no step executes and no attempt is parked in
// flight, or until grace or ctx ends. The loop keeps resuming parked
// attempts meanwhile, and only those.
func (d *Driver) drain(ctx context.Context, grace <-chan time.Time) error {
	d.signal()
	for {
		d.mu.Lock()
		running, inFlight := d.running, d.inFlight
		d.mu.Unlock()
		if running == 0 && inFlight == 0 {
			return nil
		}
		select {
		case <-d.drained:
		case <-ctx.Done():
			return fmt.Errorf("stop: %d step(s) in flight cancelled or left for the next start: %w", running+inFlight, ctx.Err())
		case <-grace:
			return fmt.Errorf("stop: %d step(s) still in flight after the grace period; they go on at the next start", running+inFlight)
		}
	}
}

// signal wakes the loop without blocking.
func (d *Driver) signal() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// loop dispatches due missions to workers and sleeps until the earliest
// wake time or a kick. It never polls.
func (d *Driver) loop() {
	defer close(d.loopDone)
	for {
		d.mu.Lock()
		if d.stopping {
			d.mu.Unlock()
			return
		}
		d.dispatchLocked(d.clock.Now())
		d.armLocked(d.sched.next())
		d.mu.Unlock()
		<-d.kick
	}
}

// dispatchLocked hands due missions, in priority order, to workers while
// slots are free: to a parked worker if one is waiting, else to a new
// one. d.mu is held, and the loop must have started and not be stopping.
func (d *Driver) dispatchLocked(now time.Time) {
	d.sched.promote(now)
	var held []*entry
	defer func() {
		for _, e := range held {
			d.sched.place(e, now, false)
		}
	}()
	for d.running < d.opts.Workers {
		e := d.sched.popReady()
		if e == nil {
			return
		}
		if d.draining && !e.hasInFlight() {
			held = append(held, e) // stopping: nothing new starts
			continue
		}
		e.running = true
		d.running++
		select {
		case d.idle <- task{e, e.gen}:
		default:
			d.workers.Add(1)
			go d.work(task{e, e.gen})
		}
	}
}

// armLocked sets the wake-up timer to at, replacing a later one.
func (d *Driver) armLocked(at time.Time) {
	if at.IsZero() || (d.timerStop != nil && d.timerAt.Equal(at)) {
		return
	}
	if d.timerStop != nil {
		d.timerStop()
	}
	d.timerAt = at
	d.timerStop = d.clock.AfterFunc(at.Sub(d.clock.Now()), func() {
		// Forget the fired timer, so the next arm for the same instant
		// (a wall-clock step back can make it fire early) sets a new one.
		d.mu.Lock()
		if d.timerAt.Equal(at) {
			d.timerStop, d.timerAt = nil, time.Time{}
		}
		d.mu.Unlock()
		d.signal()
	})
	// A timer is set for a duration from now. A clock that jumped past at
	// between reading now and setting the timer (a test's, advanced from
	// another goroutine) has set it for later than at, so look again.
	if !d.clock.Now().Before(at) {
		d.signal()
	}
}

// task is a mission dispatched to a worker, with the entry's generation
// at dispatch.
type task struct {
	e   *entry
	gen uint64
}

// work advances one mission by one step in a worker goroutine, then,
// keeping its slot, whichever mission is due next, until none is: a
// mission whose step just ended is usually due again at once, and going
// through the loop would cost two goroutine hand-offs per step. gen is
// the entry's generation at dispatch: if the worker's lease expired and
// the mission was handed to another worker meanwhile, this one no longer
// owns the entry and leaves it alone (it still held a worker slot).
// Then the goroutine waits for the loop's next dispatch, until Stop.
func (d *Driver) work(t task) {
	defer d.workers.Done()
	for {
		e, gen := t.e, t.gen
		for e != nil {
			d.advance(e, gen)
			var wakeLoop bool
			e, gen, wakeLoop = d.finishWork(e, gen, true)
			if wakeLoop {
				d.signal()
			}
		}
		select {
		case t = <-d.idle:
		case <-d.stopCh:
			return
		}
	}
}

// finishWork hands the entry back after a worker's turn. A worker whose
// lease expired meanwhile (a zombie) gave its slot and the entry up in
// expire already. With next set, a worker that still holds its slot
// takes the next due mission, if any, and keeps the slot for it;
// wakeLoop says the loop has work the worker does not do: a timer to
// arm earlier, or more due missions for free slots.
func (d *Driver) finishWork(e *entry, gen uint64, next bool) (*entry, uint64, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e.gen != gen {
		d.zombies--
		return nil, 0, true
	}
	d.running--
	e.running = false
	now := d.clock.Now()
	switch {
	case !e.m.State.Terminal():
		d.placeLocked(e, now)
	case e.mu.TryLock(): // no control call holds it: it leaves the table
		d.placeLocked(e, now)
		e.mu.Unlock()
	default:
		// A control call holds the entry (a Retry that took it while the
		// step's failure was being committed) and will file it by the
		// state it leaves: removed now, a retried mission would run with
		// no entry in the table, and the next control call would build a
		// second one. The holder files it; unless it revives the mission,
		// the entry goes once the holder is done.
		d.sched.remove(e)
		d.fileLocked(e)
		go d.forgetWhenFree(e)
	}
	if d.draining {
		select {
		case d.drained <- struct{}{}:
		default:
		}
	}
	var n *entry
	if next && !d.stopping && !d.draining {
		d.sched.promote(now)
		if n = d.sched.popReady(); n != nil {
			n.running = true
			d.running++
		}
	}
	at := d.sched.next()
	wakeLoop := n == nil ||
		!at.IsZero() && (d.timerStop == nil || at.Before(d.timerAt)) ||
		d.running < d.opts.Workers && d.sched.hasReady()
	if n == nil {
		return nil, 0, wakeLoop
	}
	return n, n.gen, wakeLoop
}

// forgetWhenFree drops a terminal mission's entry once the control call
// holding it is done, unless that call revived the mission.
func (d *Driver) forgetWhenFree(e *entry) {
	e.mu.Lock()
	defer e.mu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	if e.m.State.Terminal() && !e.running && d.entries[e.m.ID] == e {
		d.sched.remove(e)
		d.fileLocked(e)
		delete(d.entries, e.m.ID)
	}
}

// Step advances, one step each, every mission that is due now, in
// priority order, in the calling goroutine, and returns how many it
// advanced. It is the deterministic alternative to Start for tests; do
// not mix the two.
func (d *Driver) Step(ctx context.Context) (int, error) {
	if err := d.load(ctx); err != nil {
		return 0, err
	}
	d.mu.Lock()
	now := d.clock.Now()
	d.sched.promote(now)
	var batch []*entry
	var gens []uint64
	for e := d.sched.popReady(); e != nil; e = d.sched.popReady() {
		e.running = true
		d.running++
		batch = append(batch, e)
		gens = append(gens, e.gen)
	}
	d.mu.Unlock()
	for i, e := range batch {
		d.advance(e, gens[i])
		d.finishWork(e, gens[i], false)
	}
	return len(batch), ctx.Err()
}

// NextWake is the earliest time a waiting mission becomes due, or zero.
// Tests with a fake clock advance to it.
func (d *Driver) NextWake() time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.sched.next()
}

// placeLocked files e by its mission's state: terminal missions leave
// the scheduler; running ones stay out until their worker returns.
func (d *Driver) placeLocked(e *entry, now time.Time) {
	m := e.m
	if m.State.Terminal() {
		d.sched.remove(e)
		d.fileLocked(e)
		delete(d.entries, m.ID)
		return
	}
	if e.running {
		d.sched.remove(e)
		d.fileLocked(e)
		return
	}
	if inGroup(m) || len(e.bparks) > 0 {
		d.placeGroupLocked(e, now)
		return
	}
	if p := e.park; p != nil {
		// A Wake that came while the attempt ran, before it was filed
		// under its key, still counts.
		if p.p.Key != "" && d.lastWake[p.p.Key] > e.ranSince {
			p.p.Woken = true
		}
		e.wake = p.p.Until
		if p.p.Woken {
			e.wake = now
		}
		d.fileLocked(e, p.p.Key)
		d.sched.place(e, now, false)
		return
	}
	if m.Control.wakeable() {
		d.fileLocked(e, m.Control.WaitFor)
	} else {
		d.fileLocked(e)
	}
	wake, sleeping := wakeTime(m, now)
	if e.woken && m.Control.wakeable() {
		wake, sleeping = now, false // a Wake not yet used by an advance
	}
	if e.backoff.After(now) {
		wake, sleeping = e.backoff, false
	}
	e.wake = wake
	d.sched.place(e, now, sleeping)
}

// wakeTime says when the loop must look at m next; sleeping means only an
// explicit operation (Resume) can make it due.
func wakeTime(m *Mission, now time.Time) (time.Time, bool) {
	dl := m.Meta.Deadline
	switch m.State {
	case StatePaused:
		if dl.IsZero() {
			return time.Time{}, true
		}
		return dl, false
	case StateStepFailed, StateCompensating, StateRunning:
		w := m.Due
		// A retry or wait that would outlast the deadline wakes at the
		// deadline instead, to fail the mission on time.
		if m.State != StateCompensating && !w.IsZero() && !dl.IsZero() && dl.Before(w) {
			w = dl
		}
		return w, false
	default:
		return time.Time{}, false
	}
}

// maxWakeKeys bounds Driver.lastWake (keys are device IDs, command IDs
// and the like). The oldest is forgotten first; forgetting costs a step
// whose Wake came in the microseconds before it parked a wait until its
// timer, never its outcome.
const maxWakeKeys = 4096

// fileLocked files e under keys in byKey (none, or only "", takes it
// out). d.mu is held.
func (d *Driver) fileLocked(e *entry, keys ...string) {
	keys = slices.DeleteFunc(keys, func(k string) bool { return k == "" })
	if slices.Equal(e.keys, keys) {
		return
	}
	for _, k := range e.keys {
		if rest := withoutEntry(d.byKey[k], e); len(rest) > 0 {
			d.byKey[k] = rest
		} else {
			delete(d.byKey, k)
		}
	}
	e.keys = slices.Clone(keys)
	for _, k := range keys {
		if list := d.byKey[k]; len(list) == 0 || list[len(list)-1] != e {
			d.byKey[k] = append(list, e)
		}
	}
}

// Wake makes the missions waiting on key due now: parked attempts whose
// handler named it in Pending (the device handlers name a command's ack,
// or a device whose state they verify), and not-ready steps whose error
// named it in StepError.WaitFor (the device handlers use the device ID),
// e.g. because that device came back online. Waits that name nothing (a
// delay) are not woken.
func (d *Driver) Wake(key string) {
	if key == "" {
		return
	}
	d.mu.Lock()
	d.wakes++
	if _, ok := d.lastWake[key]; !ok {
		if old := d.wakeRing[d.wakeNext]; old != "" {
			delete(d.lastWake, old)
		}
		d.wakeRing[d.wakeNext] = key
		d.wakeNext = (d.wakeNext + 1) % len(d.wakeRing)
	}
	d.lastWake[key] = d.wakes
	now := d.clock.Now()
	n := 0
	for _, e := range d.byKey[key] {
		if len(e.bparks) > 0 || inGroup(e.m) {
			d.wakeGroupLocked(e, key)
			if !e.running && e.ready < 0 {
				e.wake = now
				d.sched.place(e, now, false)
				n++
			}
			continue
		}
		if e.running || e.timer < 0 {
			continue // running: lastWake tells it when it files itself again
		}
		if e.park != nil {
			e.park.p.Woken = true
		} else {
			e.woken = true
		}
		e.wake = now
		d.sched.place(e, now, false)
		n++
	}
	if n > 0 && d.loopDone != nil && !d.stopping {
		// Straight to a free worker: an ack is what a parked step waits
		// for, and going through the loop would cost it a goroutine
		// hand-off.
		d.dispatchLocked(now)
		n = 0
		if d.sched.hasReady() {
			n = 1 // the loop hands out the rest as slots free up
		}
	}
	d.mu.Unlock()
	if n > 0 {
		d.signal()
	}
}

// newID returns a 24-hex-digit ID that sorts by creation time: 48 bits
// of milliseconds, 16 bits of counter, 32 random bits.
func (d *Driver) newID(now time.Time) string {
	var b [12]byte
	ms := uint64(now.UnixMilli())
	binary.BigEndian.PutUint64(b[0:8], ms<<16|uint64(d.idSeq.Add(1)&0xffff))
	_, _ = rand.Read(b[8:])
	return hex.EncodeToString(b[:])
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (d *Driver) jitter(p RetryPolicy, next int) time.Duration {
	d.randMu.Lock()
	defer d.randMu.Unlock()
	return p.Backoff(next, d.rand)
}

// withoutEntry removes e from s in place (it is there once at most).
// Written out, not slices.DeleteFunc: each generic instantiation is half
// a kilobyte of the agent's binary, which has a budget.
func withoutEntry(s []*entry, e *entry) []*entry {
	for i, x := range s {
		if x == e {
			copy(s[i:], s[i+1:])
			s[len(s)-1] = nil
			return s[:len(s)-1]
		}
	}
	return s
}
