package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/bundle"
	"github.com/sortie-edge/sortie/bundle/check"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/scenes"
	"github.com/sortie-edge/sortie/uplink"
)

// BundleOptions let the agent take configuration bundles, from a local
// directory ("agent apply DIR", through the API) or from the hub, and
// run them without a restart: validate, stage durably, swap in, watch
// its health, keep it or revert by itself (docs/fleet.md).
type BundleOptions struct {
	// Files is the bundle the config files make (bundle.FromFiles, the
	// registry and scenes of Options and its Location): what runs while
	// no bundle was applied, and its hash is what the agent reports then.
	// Required.
	Files *bundle.Bundle
	// Soak is how long a bundle stays on trial, its health watched,
	// before it is kept (default 1 minute); a hub's offer may ask for
	// another.
	Soak time.Duration
	// Confirm is how long after the soak a hub's bundle may wait for the
	// hub connection before it is reverted (default 5 minutes).
	Confirm time.Duration
	// ValidateTimeout bounds the validation of a bundle (default 10s):
	// one that takes longer is rejected.
	ValidateTimeout time.Duration
	// Validate, when set, stands in for check.Bundle, for tests (a
	// validator that hangs).
	Validate func(*bundle.Bundle) (*check.Set, error)
	// Reread, when set, reads the config files' bundle again, so that
	// "agent config" shows files edited since the start.
	Reread func() (*bundle.Bundle, error)
}

func (o *BundleOptions) withDefaults() {
	if o.Soak <= 0 {
		o.Soak = time.Minute
	}
	if o.Confirm <= 0 {
		o.Confirm = 5 * time.Minute
	}
	if o.ValidateTimeout <= 0 {
		o.ValidateTimeout = 10 * time.Second
	}
	if o.Validate == nil {
		o.Validate = check.Bundle
	}
}

// liveConfig is a configuration that can run: its validated set and
// where it came from.
type liveConfig struct {
	ref api.ConfigRef
	set *check.Set
	loc *LocationOptions
}

// configs owns which configuration runs. Applies and trial decisions
// hold mu, one at a time; what the driver's observer reads is in the
// trial's watch, under its own lock, so that the commit path never waits
// for an fsync here.
type configs struct {
	o       BundleOptions
	version string // the agent's, against a bundle's min_agent
	store   *configStore
	log     *slog.Logger
	clock   driver.Clock
	// install swaps a configuration in (the trigger service's catalog,
	// the schedules); report sends a status to the hub; connected says
	// whether the hub connection is up; available whether a device
	// answers.
	install func(ctx context.Context, lc *liveConfig) error
	// fixed says why a registry cannot run without a restart, if it
	// cannot (what the embedded broker's access rules took from the
	// registry at start); swap swaps the device layer's registry in
	// (devices.Handlers.SetRegistry), or fails with nothing changed.
	fixed  func(reg *devices.Registry) error
	swap   func(reg *devices.Registry) error
	report func(st uplink.BundleStatus)
	// onOutcome is told of each outcome once (for a metric); repeats
	// to the hub are not outcomes.
	onOutcome func(api.BundleOutcome)
	connected func() bool
	available func(id string) bool

	mu    sync.Mutex
	state configState
	cur   *liveConfig
	prev  *liveConfig // what a revert goes back to while on trial
	files *liveConfig
	trial *trial
	// watch is trial for the driver's observer, which must not wait for
	// mu while an apply fsyncs.
	watch atomic.Pointer[trial]
	// owed is set when a swap back of the device registry failed: the
	// device layer does not run cur's registry, and run tries again
	// (next, after wait, doubling to a minute). problem says so to
	// /readyz without waiting for mu.
	owed     bool
	owedNext time.Time
	owedWait time.Duration
	problem  atomic.Pointer[string]

	wake chan struct{}
}

// trial is the watch kept over a bundle applied and not yet kept.
type trial struct {
	soakEnd, confirmBy time.Time
	fromHub            bool
	scenes, devices    []string
	stops              []func() bool

	mu       sync.Mutex
	changed  map[string]bool // scene names
	missions map[string]bool // missions of changed scenes created on trial
	failed   string          // why a mission of them failed
}

// locationOf maps a bundle's settings onto the agent's options.
func locationOf(s bundle.Settings) *LocationOptions {
	l := s.Location
	if l.Latitude == nil && l.TimeZone == "" {
		return nil
	}
	o := &LocationOptions{TimeZone: l.TimeZone}
	if l.HasPosition() {
		o.Latitude, o.Longitude, o.HasPosition = *l.Latitude, *l.Longitude, true
	}
	return o
}

// openConfigs reads what ran last and settles what a crash left
// undecided: a bundle still on trial is reverted (it was never seen
// healthy), a bundle received and not applied is rejected. It returns
// the configuration to start with.
func openConfigs(o Options, log *slog.Logger) (*configs, *liveConfig, error) {
	bo := *o.Bundles
	bo.withDefaults()
	st, err := openConfigStore(o.DataDir)
	if err != nil {
		return nil, nil, err
	}
	now := o.Clock.Now()
	files := &liveConfig{
		ref: api.ConfigRef{Hash: bo.Files.Hash(), Source: uplink.SourceFiles, Since: now},
		set: &check.Set{Bundle: bo.Files, Hash: bo.Files.Hash(), Registry: o.Registry, Catalog: o.Catalog},
		loc: o.Location,
	}
	c := &configs{o: bo, version: o.Version, store: st, log: log, clock: o.Clock, files: files, wake: make(chan struct{}, 1)}
	if c.state, err = st.load(); err != nil {
		return nil, nil, err
	}
	s := c.state
	dirty := false
	if s.Trial && s.Current != nil {
		log.Warn("bundle: the agent restarted while a bundle was on trial; reverting it", "hash", bundle.Short(s.Current.Hash), "version", s.Current.Version)
		back := hashOr(s.Previous, files)
		s.Last = &api.BundleOutcome{ConfigRef: *s.Current, Status: uplink.BundleReverted, Reason: uplink.ReasonRestarted,
			Message: "the agent restarted before the bundle was confirmed healthy", At: now, Current: back}
		s.Current, s.Previous, s.Trial = s.Previous, nil, false
		dirty = true
	} else if s.Last != nil && s.Last.Status == uplink.BundleReceived {
		s.Last.Status, s.Last.Reason, s.Last.Message, s.Last.At = uplink.BundleRejected, uplink.ReasonRestarted, "the agent restarted before it applied the bundle", now
		s.Last.Current = hashOr(s.Current, files)
		dirty = true
	}
	s.Trial = false
	c.cur = files
	if s.Current != nil {
		lc, err := c.load(*s.Current)
		if err != nil {
			log.Error("bundle: the bundle that ran cannot run again; starting on the files", "hash", bundle.Short(s.Current.Hash), "err", err)
			s.Last = &api.BundleOutcome{ConfigRef: *s.Current, Status: uplink.BundleReverted, Reason: uplink.ReasonInvalid,
				Message: fmt.Sprintf("at start: %v", err), At: now, Current: files.ref.Hash}
			s.Current, s.Previous = nil, nil
			dirty = true
		} else {
			c.cur = lc
		}
	}
	c.state = s
	if dirty {
		if err := st.save(s); err != nil {
			return nil, nil, err
		}
	}
	st.prune(s)
	return c, c.cur, nil
}

func hashOr(r *api.ConfigRef, files *liveConfig) string {
	if r != nil {
		return r.Hash
	}
	return files.ref.Hash
}

// load reads and validates a stored bundle.
func (c *configs) load(ref api.ConfigRef) (*liveConfig, error) {
	b, err := c.store.get(ref.Hash)
	if err != nil {
		return nil, err
	}
	set, err := c.o.Validate(b)
	if err != nil {
		return nil, err
	}
	return &liveConfig{ref: ref, set: set, loc: locationOf(set.Settings)}, nil
}

// offer is a bundle to apply and where it comes from.
type offer struct {
	encoded []byte
	ref     api.ConfigRef // Hash, Version, Source, Rollout
	soak    time.Duration // zero: the agent's own
}

// errStale says a hub's offer is older than, or the same as, one taken.
var errStale = errors.New("stale bundle offer")

// apply runs one offer through: received, validated, staged, swapped
// in and put on trial; or rejected, with nothing changed. A hub's offer
// older than the newest taken is refused with errStale; one of the same
// version is answered with what became of it, not applied again.
func (c *configs) apply(ctx context.Context, of offer) (api.BundleOutcome, error) {
	// Once begun, an apply runs to its end: a caller that goes away
	// must not leave the catalog swapped and the schedules not.
	ctx = context.WithoutCancel(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock.Now()
	ref := of.ref
	ref.Since = time.Time{}
	hub := ref.Source == uplink.SourceHub
	if hub && ref.Version <= c.state.HubVersion {
		if last := c.state.Last; ref.Version == c.state.HubVersion && last != nil && last.Version == ref.Version && last.Hash == ref.Hash {
			c.log.Info("bundle: offer repeated; answering from what it became", "version", ref.Version, "status", last.Status)
			c.send(*last)
			return *last, nil
		}
		c.log.Info("bundle: stale offer ignored", "version", ref.Version, "newest_taken", c.state.HubVersion)
		return api.BundleOutcome{}, fmt.Errorf("%w: version %d, this gateway took version %d", errStale, ref.Version, c.state.HubVersion)
	}
	out := api.BundleOutcome{ConfigRef: ref, Status: uplink.BundleReceived, At: now, Current: c.cur.ref.Hash}
	s := c.state
	if hub {
		s.HubVersion = ref.Version
	}
	s.Last = &out
	if err := c.store.save(s); err != nil {
		return api.BundleOutcome{}, err
	}
	c.state = s
	c.outcome(out)

	reject := func(reason, format string, args ...any) (api.BundleOutcome, error) {
		out.Status, out.Reason, out.Message, out.At = uplink.BundleRejected, reason, fmt.Sprintf(format, args...), c.clock.Now()
		c.log.Warn("bundle rejected", "hash", bundle.Short(ref.Hash), "version", ref.Version, "source", ref.Source, "reason", reason, "detail", out.Message)
		c.settle(out)
		return out, nil
	}
	b, err := bundle.Decode(of.encoded)
	if err != nil {
		return reject(uplink.ReasonInvalid, "%v", err)
	}
	if !bundle.Compatible(b.MinAgent, c.agentVersion()) {
		return reject(uplink.ReasonAgentTooOld, "the bundle needs agent %s or newer; this is %s", b.MinAgent, c.agentVersion())
	}
	set, err := c.validate(ctx, b)
	if errors.Is(err, context.DeadlineExceeded) {
		return reject(uplink.ReasonValidationTimeout, "validation took longer than %s", c.o.ValidateTimeout)
	} else if err != nil {
		return reject(uplink.ReasonInvalid, "%v", err)
	}
	newRegistry := !sameRegistry(c.cur, set)
	if newRegistry && c.fixed != nil {
		if err := c.fixed(set.Registry); err != nil {
			return reject(uplink.ReasonRegistryChanged, "%v; this changes only at a restart of the agent", err)
		}
	}
	lc := &liveConfig{ref: ref, set: set, loc: locationOf(set.Settings)}
	if _, err := scheduleEntries(set.Catalog, lc.loc); err != nil {
		return reject(uplink.ReasonInvalid, "%v", err)
	}
	if err := c.store.put(ref.Hash, of.encoded); err != nil {
		return reject(uplink.ReasonStorage, "%v", err)
	}
	lc.ref.Since = now
	if lc.ref.Hash == c.cur.ref.Hash && c.trial == nil {
		// Already running: only its name changes (a rollback to what a
		// gateway kept, numbered anew).
		s := c.state
		cur := lc.ref
		cur.Since = c.cur.ref.Since
		if s.Current != nil || cur.Source != uplink.SourceFiles {
			s.Current = &cur
		}
		out.Status, out.At = uplink.BundleHealthy, now
		s.Last = &out
		if err := c.store.save(s); err != nil {
			return reject(uplink.ReasonStorage, "%v", err)
		}
		c.state, c.cur = s, &liveConfig{ref: cur, set: c.cur.set, loc: c.cur.loc}
		c.outcome(out)
		return out, nil
	}
	// The device layer's registry first, before the durable switch: a
	// broker that refuses what the new devices need rejects the bundle
	// with nothing changed, and a power cut between the two comes back
	// on the old bundle, whose registry state.json names.
	running := c.cur
	if newRegistry && c.swap != nil {
		if err := c.swap(set.Registry); err != nil {
			return reject(uplink.ReasonRegistryRefused, "the device layer could not take the bundle's registry: %v", err)
		}
		c.paid() // whatever was owed, the device layer runs this one now
	}
	// The one write that switches: from here a power cut comes back on
	// the new bundle, on trial, which the start reverts.
	back, backRef := c.cur, c.state.Current
	if c.trial != nil {
		back, backRef = c.prev, c.state.Previous
	}
	s = c.state
	s.Current, s.Previous, s.Trial = &lc.ref, backRef, true
	out.Status, out.At, out.Current = uplink.BundleApplied, c.clock.Now(), ref.Hash
	s.Last = &out
	if err := c.store.save(s); err != nil {
		c.swapBack(lc, running)
		return reject(uplink.ReasonStorage, "%v", err)
	}
	superseded := c.endTrial()
	if superseded != nil {
		o := api.BundleOutcome{ConfigRef: superseded.ref, Status: uplink.BundleReverted, Reason: uplink.ReasonSuperseded,
			Message: fmt.Sprintf("replaced by bundle %s while on trial", bundle.Short(ref.Hash)), At: out.At, Current: ref.Hash}
		c.outcome(o)
	}
	c.state, c.prev = s, back
	c.cur = lc
	if err := c.install(ctx, lc); err != nil {
		c.log.Error("bundle: swapping in", "err", err)
	}
	// What changed is counted from what a revert goes back to, not from
	// a bundle this one supersedes on trial.
	c.startTrial(back, lc, of.soak, hub)
	c.log.Info("bundle applied; on trial", "hash", bundle.Short(ref.Hash), "version", ref.Version, "source", ref.Source,
		"until", c.trial.soakEnd, "scenes_changed", c.trial.scenes)
	c.outcome(out)
	return out, nil
}

// sameRegistry says whether set carries the devices.toml lc runs.
func sameRegistry(lc *liveConfig, set *check.Set) bool {
	have, _ := lc.set.Bundle.File(bundle.RegistryFile)
	want, _ := set.Bundle.File(bundle.RegistryFile)
	return string(have) == string(want)
}

// devicesChanged lists the devices of next whose entry, type, link or
// ecosystem settings differ from prev's, or that prev lacks.
func devicesChanged(prev, next *devices.Registry) map[string]bool {
	out := map[string]bool{}
	for _, d := range next.Devices {
		o, ok := prev.Device(d.ID)
		if !ok || !reflect.DeepEqual(o, d) || !reflect.DeepEqual(prev.Types[o.Type], next.Types[d.Type]) ||
			!reflect.DeepEqual(prev.Links[o.Link], next.Links[d.Link]) ||
			!reflect.DeepEqual(prev.Protocols[o.Protocol], next.Protocols[d.Protocol]) {
			out[d.ID] = true
		}
	}
	return out
}

// swapBack gives the device layer back the registry of back, when from
// ran another one.
func (c *configs) swapBack(from, back *liveConfig) {
	if c.swap == nil || sameRegistry(from, back.set) {
		return
	}
	if err := c.swap(back.set.Registry); err != nil {
		// The broker refused now what it granted before: the devices of
		// from stay read until run swaps again, or a restart, which reads
		// back's (state.json names it).
		c.log.Error("bundle: the device registry could not be swapped back; trying again", "err", err)
		c.owe(err, time.Second)
		return
	}
	c.paid()
}

// owe notes that the device layer does not run cur's registry, for run
// to try again after wait.
func (c *configs) owe(err error, wait time.Duration) {
	c.owed, c.owedWait, c.owedNext = true, wait, c.clock.Now().Add(wait)
	msg := fmt.Sprintf("the device layer runs another registry than the configuration's (%s): its swap back failed: %v", bundle.Short(c.cur.ref.Hash), err)
	c.problem.Store(&msg)
}

// paid notes that the device layer runs cur's registry.
func (c *configs) paid() {
	c.owed = false
	c.problem.Store(nil)
}

// payOwed swaps cur's registry in again when a swap back failed and its
// time has come. Caller holds mu.
func (c *configs) payOwed() {
	if !c.owed || c.clock.Now().Before(c.owedNext) {
		return
	}
	if err := c.swap(c.cur.set.Registry); err != nil {
		c.owe(err, min(2*c.owedWait, time.Minute))
		return
	}
	c.log.Info("bundle: the device registry swapped back", "hash", bundle.Short(c.cur.ref.Hash))
	c.paid()
}

// Problem says why the device layer does not run the registry of the
// configuration that runs (nil when it does): /readyz reports it.
func (c *configs) Problem() error {
	if p := c.problem.Load(); p != nil {
		return errors.New(*p)
	}
	return nil
}

// settle records a final outcome that changed nothing that runs.
func (c *configs) settle(out api.BundleOutcome) {
	s := c.state
	s.Last = &out
	if err := c.store.save(s); err != nil {
		c.log.Error("bundle: recording an outcome", "err", err)
	} else {
		c.state = s
	}
	c.outcome(out)
}

func (c *configs) agentVersion() string { return c.version }

// validate runs the validator within its time bound.
func (c *configs) validate(ctx context.Context, b *bundle.Bundle) (*check.Set, error) {
	ctx, cancel := context.WithTimeout(ctx, c.o.ValidateTimeout)
	defer cancel()
	type result struct {
		set *check.Set
		err error
	}
	done := make(chan result, 1)
	// A validator is pure work over bytes: one that hangs is left to
	// finish on its own, its answer dropped.
	go func() {
		set, err := c.o.Validate(b)
		done <- result{set, err}
	}()
	select {
	case r := <-done:
		return r.set, r.err
	case <-ctx.Done():
		return nil, context.DeadlineExceeded
	}
}

// startTrial begins watching lc, applied over old.
func (c *configs) startTrial(old, lc *liveConfig, soak time.Duration, fromHub bool) {
	if soak <= 0 {
		soak = c.o.Soak
	}
	now := c.clock.Now()
	t := &trial{soakEnd: now.Add(soak), confirmBy: now.Add(soak + c.o.Confirm), fromHub: fromHub,
		changed: map[string]bool{}, missions: map[string]bool{}}
	devs := map[string]bool{}
	// A scene whose file did not change but whose devices did (a new
	// address, type, link) is on trial as much as an edited one.
	var redone map[string]bool
	if !sameRegistry(old, lc.set) {
		redone = devicesChanged(old.set.Registry, lc.set.Registry)
	}
	for _, name := range lc.set.Catalog.Names() {
		info, _ := lc.set.Catalog.Scene(name)
		data, _ := lc.set.Bundle.File(info.File)
		before, ok := old.set.Bundle.File(info.File)
		if ok && string(before) == string(data) && !slices.ContainsFunc(lc.set.Catalog.Devices(name), func(d string) bool { return redone[d] }) {
			if _, had := old.set.Catalog.Scene(name); had {
				continue
			}
		}
		t.changed[name] = true
		for _, d := range lc.set.Catalog.Devices(name) {
			devs[d] = true
		}
	}
	t.scenes = slices.Sorted(maps.Keys(t.changed))
	t.devices = slices.Sorted(maps.Keys(devs))
	t.stops = append(t.stops, c.clock.AfterFunc(soak, c.signal))
	if fromHub {
		t.stops = append(t.stops, c.clock.AfterFunc(soak+c.o.Confirm, c.signal))
	}
	c.trial = t
	c.watch.Store(t)
}

// endTrial stops watching; it returns what was on trial, if anything.
func (c *configs) endTrial() *liveConfig {
	if c.trial == nil {
		return nil
	}
	for _, stop := range c.trial.stops {
		stop()
	}
	c.trial = nil
	c.watch.Store(nil)
	return c.cur
}

func (c *configs) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// Observe implements driver.Observer: it notes the missions of the
// scenes a bundle on trial changed, and a failure of one of them.
func (c *configs) Observe(ev driver.Event, m *driver.Mission) {
	t := c.watch.Load()
	if t == nil {
		return
	}
	t.mu.Lock()
	failed := false
	switch {
	case ev.Seq == 1 && t.changed[m.Type]:
		t.missions[m.ID] = true
	case ev.To == driver.StateFailed && ev.From != driver.StateFailed && t.missions[m.ID] && t.failed == "":
		t.failed = fmt.Sprintf("mission %s of scene %s failed: %s", m.ID, m.Type, ev.Error)
		failed = true
	}
	t.mu.Unlock()
	if failed {
		c.signal()
	}
}

// run decides trials until ctx ends.
func (c *configs) run(ctx context.Context) error {
	poll := time.NewTicker(time.Second)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.wake:
		case <-poll.C:
			// The hub connection coming up ends a confirm wait; it has no
			// event of its own here.
		}
		c.decide(ctx)
	}
}

// decide keeps or reverts the bundle on trial, when its time has come
// or its health failed.
func (c *configs) decide(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.payOwed()
	t := c.trial
	if t == nil {
		return
	}
	t.mu.Lock()
	failed := t.failed
	t.mu.Unlock()
	if failed != "" {
		c.revert(ctx, uplink.ReasonMissionFailed, failed)
		return
	}
	now := c.clock.Now()
	if now.Before(t.soakEnd) {
		return
	}
	var silent []string
	for _, d := range t.devices {
		if !c.available(d) {
			silent = append(silent, d)
		}
	}
	if len(silent) > 0 {
		c.revert(ctx, uplink.ReasonDevicesSilent, fmt.Sprintf("devices of the changed scenes did not answer by the end of the soak: %v", silent))
		return
	}
	if t.fromHub && !c.connected() {
		if now.Before(t.confirmBy) {
			return
		}
		c.revert(ctx, uplink.ReasonUplinkDown, fmt.Sprintf("no hub connection by %s, so the hub could not confirm the bundle", t.confirmBy.Format(time.RFC3339)))
		return
	}
	c.keep()
}

// keep commits the bundle on trial: healthy.
func (c *configs) keep() {
	s := c.state
	s.Trial = false
	out := api.BundleOutcome{ConfigRef: *s.Current, Status: uplink.BundleHealthy, At: c.clock.Now(), Current: s.Current.Hash}
	s.Last = &out
	if err := c.store.save(s); err != nil {
		// Not kept on disk: the next start would revert it, so revert now
		// and keep memory and disk telling the same story.
		c.revert(context.Background(), uplink.ReasonStorage, err.Error())
		return
	}
	c.state = s
	c.endTrial()
	c.prev = nil
	c.store.prune(s)
	c.log.Info("bundle healthy; kept", "hash", bundle.Short(out.Hash), "version", out.Version, "source", out.Source)
	c.outcome(out)
}

// revert goes back to what ran before the bundle on trial.
func (c *configs) revert(ctx context.Context, reason, msg string) {
	tried := c.endTrial()
	back := c.prev
	if back == nil {
		back = c.files
	}
	s := c.state
	out := api.BundleOutcome{ConfigRef: tried.ref, Status: uplink.BundleReverted, Reason: reason, Message: msg, At: c.clock.Now(), Current: back.ref.Hash}
	out.Since = time.Time{}
	s.Current, s.Previous, s.Trial, s.Last = s.Previous, nil, false, &out
	if err := c.store.save(s); err != nil {
		// The next start reverts a bundle it finds on trial anyway.
		c.log.Error("bundle: recording a revert", "err", err)
	}
	c.state, c.cur, c.prev = s, back, nil
	if err := c.install(ctx, back); err != nil {
		c.log.Error("bundle: swapping back", "err", err)
	}
	// The scenes first, then the registry they were made for: a trigger
	// in between runs an old scene on the new registry, never a new
	// scene without its devices.
	c.swapBack(tried, back)
	c.store.prune(s)
	c.log.Warn("bundle reverted", "hash", bundle.Short(tried.ref.Hash), "version", tried.ref.Version, "reason", reason, "detail", msg, "now", bundle.Short(back.ref.Hash))
	c.outcome(out)
}

// outcome counts a new outcome (onOutcome) and reports it (send).
func (c *configs) outcome(o api.BundleOutcome) {
	if c.onOutcome != nil {
		c.onOutcome(o)
	}
	c.send(o)
}

// send reports an outcome to the hub when the bundle came from it.
func (c *configs) send(o api.BundleOutcome) {
	if o.Source != uplink.SourceHub || c.report == nil {
		return
	}
	c.report(uplink.BundleStatus{Hash: o.Hash, Version: o.Version, Rollout: o.Rollout, Status: o.Status,
		Reason: o.Reason, Message: o.Message, Current: o.Current, At: o.At})
}

// resend says the latest outcome again: a connection to the hub came up.
func (c *configs) resend() {
	c.mu.Lock()
	last := c.state.Last
	c.mu.Unlock()
	if last != nil {
		c.send(*last)
	}
	c.signal()
}

// info is what "agent config" shows.
func (c *configs) info() api.ConfigInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := api.ConfigInfo{Current: c.cur.ref, HubVersion: c.state.HubVersion, Last: c.state.Last}
	if c.trial != nil {
		out.Trial = &api.ConfigTrial{Until: c.trial.soakEnd, Scenes: c.trial.scenes, Devices: c.trial.devices}
		if c.trial.fromHub {
			out.Trial.ConfirmBy = c.trial.confirmBy
		}
		if c.prev != nil {
			p := c.prev.ref
			out.Previous = &p
		}
	}
	if files := c.filesNow(); files != c.cur.ref.Hash {
		out.FilesHash = files
	}
	return out
}

// heartbeat is the running configuration, for the hub.
func (c *configs) heartbeat() *uplink.ConfigState {
	files := c.filesNow()
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.cur.ref
	st := &uplink.ConfigState{Hash: r.Hash, Version: r.Version, Source: r.Source, Since: r.Since, Trial: c.trial != nil, SwapsRegistry: true}
	if files != r.Hash {
		st.Files = files
	}
	return st
}

// filesNow is the hash of the bundle the config files make now: read
// again when BundleOptions.Reread allows, else as at the start.
func (c *configs) filesNow() string {
	if c.o.Reread != nil {
		if b, err := c.o.Reread(); err == nil {
			return b.Hash()
		}
	}
	return c.files.ref.Hash
}

// catalog is the scene catalog that runs now.
func (a *Agent) catalog() *scenes.Catalog {
	if a.trig == nil {
		return a.cat
	}
	return a.trig.cat.Load()
}

// wireConfigs connects the configurations to the parts they swap and
// watch; the hub's, if any, are read when called (the uplink starts
// later).
func (a *Agent) wireConfigs() {
	c := a.cfg
	c.install = func(ctx context.Context, lc *liveConfig) error {
		entries, err := scheduleEntries(lc.set.Catalog, lc.loc)
		if err != nil {
			return err
		}
		a.trig.setCatalog(lc.set.Catalog)
		if a.ha != nil {
			a.ha.setCatalog(lc.set.Catalog)
		}
		return a.sched.replace(ctx, entries)
	}
	c.fixed = a.registryFixed
	hs := a.arb.hs
	c.swap = func(reg *devices.Registry) error {
		if err := hs.SetRegistry(reg); err != nil {
			return err
		}
		a.metrics.setDeviceTypes(deviceTypes(reg))
		return nil
	}
	// Answering: online, and heard from (a device never heard from
	// counts as available to the device layer, so that one without a
	// last will can be commanded; a bundle's trial wants more).
	c.available = func(id string) bool {
		_, heard := a.dev.State(id)
		return heard && a.dev.Available(id)
	}
	c.connected = func() bool { return a.up != nil && a.up.Stats().Connected }
	c.onOutcome = a.metrics.bundleOutcome
	a.metrics.watchTrial(func() bool { return c.watch.Load() != nil })
	c.report = func(st uplink.BundleStatus) {
		if a.up == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := a.up.BundleStatus(ctx, st); err != nil {
			// Said again on the next connection, if it is the latest.
			c.log.Debug("bundle status not sent", "status", st.Status, "err", err)
		}
	}
}

// registryFixed says why reg cannot run without a restart: the access
// rules of the embedded broker with users were made at start from the
// registry that ran then (the devices its device users are, the
// Shelly adapter's src).
func (a *Agent) registryFixed(reg *devices.Registry) error {
	if a.auth == nil {
		return nil
	}
	if err := CheckDeviceUsers(a.opts.Broker.Users, reg); err != nil {
		return fmt.Errorf("the embedded broker's users do not match the registry: %w", err)
	}
	src := "sortie" // the Shelly adapter's default, as at start
	if v, ok := reg.Protocols["shelly"]["src"].(string); ok && v != "" {
		src = v
	}
	if src != a.auth.shellySrc {
		return fmt.Errorf("protocols.shelly.src is %q, the embedded broker lets Shelly devices answer %q", src, a.auth.shellySrc)
	}
	return nil
}

// onHubConnect says again, on each connection to the hub, what became
// of the latest bundle it offered.
func (a *Agent) onHubConnect() {
	if a.cfg != nil {
		a.cfg.resend()
	}
}

// Apply runs a bundle given locally (its canonical encoding): rejected
// with why, or applied and on trial (BundleOptions). It fails only when
// the agent takes no bundles or could not record that it took one.
func (a *Agent) Apply(ctx context.Context, encoded []byte) (api.BundleOutcome, error) {
	if a.cfg == nil {
		return api.BundleOutcome{}, api.ErrNoBundles
	}
	return a.cfg.apply(ctx, offer{encoded: encoded, ref: api.ConfigRef{Hash: bundle.HashOf(encoded), Source: uplink.SourceLocal}})
}

// Config says what configuration runs, from where, since when.
func (a *Agent) Config() (api.ConfigInfo, error) {
	if a.cfg == nil {
		return api.ConfigInfo{}, api.ErrNoBundles
	}
	return a.cfg.info(), nil
}

// offered handles a hub's bundle control: the answer says whether the
// gateway took it; what became of it follows as bundle statuses.
func (a *Agent) offered(ctx context.Context, ctl uplink.Control) uplink.ControlResult {
	res := uplink.ControlResult{ID: ctl.ID}
	if a.cfg == nil {
		res.Code, res.Error = "unsupported", api.ErrNoBundles.Error()
		return res
	}
	o := ctl.Bundle
	out, err := a.cfg.apply(ctx, offer{encoded: o.Bundle, soak: o.Soak(),
		ref: api.ConfigRef{Hash: o.Hash, Version: o.Version, Source: uplink.SourceHub, Rollout: o.Rollout}})
	switch {
	case errors.Is(err, errStale):
		res.Code, res.Error = "stale", err.Error()
	case err != nil:
		res.Code, res.Error = "internal", err.Error()
	case out.Status == uplink.BundleRejected:
		res.Code, res.Error = out.Reason, out.Message
	default:
		res.OK = true
	}
	return res
}
