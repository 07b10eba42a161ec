package hub

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sortie-edge/sortie/bundle"
	"github.com/sortie-edge/sortie/bundle/check"
	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/uplink"
)

// RolloutSpec is what a rollout is asked to do (POST /api/rollouts,
// hub rollout start). Zero fields take the defaults written on each.
type RolloutSpec struct {
	// Group is the target group (default DefaultGroup); Version the
	// release of it to roll out (default the group's latest push).
	Group   string `json:"group,omitempty"`
	Version uint64 `json:"version,omitempty"`
	// Gateways (IDs) or Tag (assigned on the hub) chooses the targets;
	// neither: every gateway the hub knows.
	Gateways []string `json:"gateways,omitempty"`
	Tag      string   `json:"tag,omitempty"`
	// Continuous: gateways that get Tag later, or are first seen later,
	// join (the last stage, or at once once the waves are done), and
	// gateways that were unreachable get it when they come back, until
	// a newer rollout of the group supersedes it. Otherwise the targets
	// are a snapshot taken at the start.
	Continuous bool `json:"continuous,omitempty"`
	// The canary, the first stage: Canary gateways, or CanaryPercent
	// of the targets (rounded up); default 1.
	Canary        int     `json:"canary,omitempty"`
	CanaryPercent float64 `json:"canary_percent,omitempty"`
	// The waves after it: Waves, cumulative percentages of the targets
	// (10, 50, 100), or else an exponential rate: each wave Factor
	// times the one before (the canary first; default 2), at most Cap
	// gateways (0: no cap).
	Waves  []float64 `json:"waves,omitempty"`
	Factor float64   `json:"factor,omitempty"`
	Cap    int       `json:"cap,omitempty"`
	// Soak is how long the hub waits once a stage's gateways all have an
	// outcome before it goes on (default 1m); GatewaySoak the trial each
	// gateway runs before it reports healthy (default the gateway's own
	// [bundles] soak).
	Soak        driver.Duration `json:"soak,omitempty"`
	GatewaySoak driver.Duration `json:"gateway_soak,omitempty"`
	// GatewayTimeout is how long a stage waits for a gateway's outcome
	// before going on without it (default 10m); it is still offered the
	// bundle until the deadline, and counted when it answers.
	GatewayTimeout driver.Duration `json:"gateway_timeout,omitempty"`
	// Resend is how often an unanswered offer is sent again, with the
	// same control ID (default 10s).
	Resend driver.Duration `json:"resend,omitempty"`
	// Retries is how many times a gateway is offered the bundle again
	// (a new release of it) after a failure that may pass: storage,
	// validation_timeout, restarted (default 0).
	Retries int `json:"retries,omitempty"`
	// Deadline ends the rollout that long after its start (default
	// 24h): a gateway with no outcome by then is unreachable.
	Deadline driver.Duration `json:"deadline,omitempty"`
	// The rollout aborts once AbortPercent of the gateways that ran it
	// (healthy or failed) failed, and at least AbortMin of them (default
	// 10% and 1).
	AbortPercent float64 `json:"abort_percent,omitempty"`
	AbortMin     int     `json:"abort_min,omitempty"`
}

func (s *RolloutSpec) defaults() {
	if s.Group == "" {
		s.Group = DefaultGroup
	}
	if s.Canary == 0 && s.CanaryPercent == 0 {
		s.Canary = 1
	}
	if len(s.Waves) == 0 && s.Factor == 0 {
		s.Factor = 2
	}
	orDefault(&s.Soak, driver.Duration(time.Minute))
	orDefault(&s.GatewayTimeout, driver.Duration(10*time.Minute))
	orDefault(&s.Resend, driver.Duration(10*time.Second))
	orDefault(&s.Deadline, driver.Duration(24*time.Hour))
	if s.AbortPercent == 0 {
		s.AbortPercent = 10
	}
	if s.AbortMin == 0 {
		s.AbortMin = 1
	}
}

func (s *RolloutSpec) check() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
	}
	if err := driver.CheckID("group", s.Group); err != nil {
		return bad("%v", err)
	}
	if len(s.Gateways) > 0 && s.Tag != "" {
		return bad("target gateways or a tag, not both")
	}
	if s.Continuous && len(s.Gateways) > 0 {
		return bad("a continuous rollout targets a tag or every gateway, not a list")
	}
	switch {
	case s.Canary < 0, s.CanaryPercent < 0 || s.CanaryPercent > 100:
		return bad("canary: a count, or a percentage from 0 to 100")
	case s.Canary > 0 && s.CanaryPercent > 0:
		return bad("canary: a count or a percentage, not both")
	case len(s.Waves) > 0 && s.Factor != 0:
		return bad("waves (percentages) or an exponential factor, not both")
	case s.Factor != 0 && !(s.Factor >= 1.1 && s.Factor <= 10):
		return bad("factor %v: from 1.1 to 10", s.Factor)
	case s.Cap < 0 || s.Retries < 0 || s.Retries > 10 || s.AbortMin < 0:
		return bad("cap, retries (at most 10) and abort_min are not negative")
	case !(s.AbortPercent > 0 && s.AbortPercent <= 100):
		return bad("abort_percent %v: above 0, at most 100", s.AbortPercent)
	case s.GatewaySoak != 0 && (s.GatewaySoak.D() < time.Second || s.GatewaySoak.D() > 24*time.Hour):
		return bad("gateway_soak: from 1s to 24h")
	case s.Soak < 0 || s.GatewayTimeout <= 0 || s.Resend <= 0 || s.Deadline <= 0:
		return bad("soak, gateway_timeout, resend and deadline are positive")
	}
	for i, w := range s.Waves {
		if !(w > 0 && w <= 100) || (i > 0 && w <= s.Waves[i-1]) {
			return bad("waves: increasing percentages above 0, at most 100")
		}
	}
	for _, gw := range s.Gateways {
		if err := driver.CheckID("gateway", gw); err != nil {
			return bad("%v", err)
		}
	}
	return nil
}

// stages cuts n targets into the canary and the waves (cumulative).
func (s *RolloutSpec) stages(n int) []int {
	ceil := func(f float64) int { return int(math.Ceil(f - 1e-9)) }
	c := s.Canary
	if s.CanaryPercent > 0 {
		c = ceil(s.CanaryPercent * float64(n) / 100)
	}
	c = min(max(c, 1), n)
	out := []int{c}
	if len(s.Waves) > 0 {
		for _, w := range s.Waves {
			if k := min(ceil(w*float64(n)/100), n); k > out[len(out)-1] {
				out = append(out, k)
			}
		}
		if out[len(out)-1] < n {
			out = append(out, n)
		}
		return out
	}
	size := float64(max(c, 1))
	for last := c; last < n; last = out[len(out)-1] {
		size *= s.Factor
		step := ceil(size)
		if s.Cap > 0 && step > s.Cap {
			step, size = s.Cap, float64(s.Cap)
		}
		out = append(out, min(last+step, n))
	}
	return out
}

// FleetOptions configures NewFleet.
type FleetOptions struct {
	// Send publishes a control request to a gateway and does not wait
	// for its result, which comes back through NoteResult. The Service
	// fills it in.
	Send func(gw string, c uplink.Control) error
	// Now is the clock (default time.Now): the engine never sleeps on
	// it, Step reads it, so tests move it.
	Now func() time.Time
	// Tick is how often Run steps when nothing arrives (soaks,
	// deadlines, resends); default 1s.
	Tick time.Duration
	// RevertEvery spaces the drift policy's offers to one gateway;
	// default 1m.
	RevertEvery time.Duration
	// Logger receives the engine's logs; nil discards them.
	Logger *slog.Logger
	// KeepRollouts is how long an ended rollout is kept, with each of
	// its gateways' outcomes (default 90 days); KeepRolloutsPerGroup
	// caps them per group (default 50). The newest of a group is kept.
	KeepRollouts         time.Duration
	KeepRolloutsPerGroup int
}

// gatewayLister is what the engine reads of the hub's gateways at
// load: their presence and last heartbeat.
type gatewayLister interface {
	Gateways(ctx context.Context) ([]Gateway, error)
}

// Fleet is the hub's rollout engine: bundles, rollouts in stages,
// abort and rollback, each gateway's bundle state and drift. Its state
// is in memory and written through to its FleetStore: every change is
// durable before the offers it allows are sent, so a hub restarted
// mid-rollout resumes from the store (Load), sending again only offers
// that had no answer, each with its first control ID (the gateway
// answers a repeat from memory). Its methods may be called from any
// goroutine; Step (or Run) does the work that time and messages make
// due.
type Fleet struct {
	st  FleetStore
	o   FleetOptions
	log *slog.Logger

	inMu  sync.Mutex
	inbox []fleetEvent
	wake  chan struct{}
	// accepting is set while the state is loaded: a cluster replica
	// that does not drive the rollouts drops what it hears.
	accepting atomic.Bool

	mu       sync.Mutex
	loaded   bool
	runs     map[string]*rolloutRun
	order    []*rolloutRun
	gws      map[string]*FleetGateway
	seen     map[string]presenceOf
	groups   map[string]*Group
	controls map[string]controlRef
	sets     map[string]*check.Set
	encs     map[string][]byte
	nextID   uint64

	dirtyR map[*Rollout]bool
	dirtyT map[*RolloutGateway]bool
	dirtyG map[*FleetGateway]bool
	dirtyP map[*Group]bool
	forget []string // rollouts to delete (prune)
	out    []outgoing

	metrics *fleetMetrics
}

type rolloutRun struct {
	// check asks the step to count the failures against the threshold.
	check   bool
	r       *Rollout
	targets []*RolloutGateway // by Order
	byGW    map[string]*RolloutGateway
}

type presenceOf struct {
	online bool
	hb     *uplink.Heartbeat
}

// controlRef says what a control ID was sent for.
type controlRef struct {
	run  *rolloutRun
	t    *RolloutGateway
	back bool
	fg   *FleetGateway // a drift revert
}

type outgoing struct {
	gw string
	c  uplink.Control
}

type fleetEvent struct {
	gw     string
	status *uplink.BundleStatus
	result *uplink.ControlResult
	g      *Gateway
}

// NewFleet returns an engine over st. Call Load (or Run) before the
// rest.
func NewFleet(st FleetStore, o FleetOptions) *Fleet {
	if o.Now == nil {
		o.Now = time.Now
	}
	orDefault(&o.Tick, time.Second)
	orDefault(&o.RevertEvery, time.Minute)
	orDefault(&o.KeepRollouts, defaultKeepRollouts)
	orDefault(&o.KeepRolloutsPerGroup, defaultKeepRolloutsPerGroup)
	log := o.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	f := &Fleet{st: st, o: o, log: log, wake: make(chan struct{}, 1)}
	f.reset()
	f.metrics = newFleetMetrics(f)
	return f
}

func (f *Fleet) reset() {
	f.runs, f.order = map[string]*rolloutRun{}, nil
	f.gws, f.seen, f.groups = map[string]*FleetGateway{}, map[string]presenceOf{}, map[string]*Group{}
	f.controls, f.sets, f.encs = map[string]controlRef{}, map[string]*check.Set{}, map[string][]byte{}
	f.dirtyR, f.dirtyT, f.dirtyG, f.dirtyP = map[*Rollout]bool{}, map[*RolloutGateway]bool{}, map[*FleetGateway]bool{}, map[*Group]bool{}
	f.forget = nil
}

// Load reads the engine's state from the store, and the gateways'
// presence from it when it keeps gateways (the bbolt Store does).
func (f *Fleet) Load(ctx context.Context) error {
	st, err := f.st.LoadFleet(ctx)
	if err != nil {
		return fmt.Errorf("load fleet: %w", err)
	}
	var gws []Gateway
	if l, ok := f.st.(gatewayLister); ok {
		if gws, err = l.Gateways(ctx); err != nil {
			return fmt.Errorf("load fleet: %w", err)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reset()
	for _, r := range st.Rollouts {
		run := &rolloutRun{r: r, byGW: map[string]*RolloutGateway{}}
		f.runs[r.ID] = run
		f.order = append(f.order, run)
		if n, err := strconv.ParseUint(strings.TrimPrefix(r.ID, "r-"), 10, 64); err == nil {
			f.nextID = max(f.nextID, n)
		}
	}
	slices.SortFunc(f.order, func(a, b *rolloutRun) int { return a.r.Created.Compare(b.r.Created) })
	for _, t := range st.Targets {
		run := f.runs[t.Rollout]
		if run == nil {
			continue
		}
		run.targets = append(run.targets, t)
		run.byGW[t.Gateway] = t
		if t.Control != "" {
			f.controls[t.Control] = controlRef{run: run, t: t}
		}
		if t.BackControl != "" {
			f.controls[t.BackControl] = controlRef{run: run, t: t, back: true}
		}
	}
	for _, run := range f.runs {
		slices.SortFunc(run.targets, func(a, b *RolloutGateway) int { return a.Order - b.Order })
	}
	for _, g := range st.Gateways {
		f.gws[g.Gateway] = g
		if g.RevertControl != "" {
			f.controls[g.RevertControl] = controlRef{fg: g}
		}
	}
	for _, g := range st.Groups {
		f.groups[g.Name] = g
	}
	for i := range gws {
		f.seen[gws[i].ID] = presenceOf{online: gws[i].State == StateOnline, hb: gws[i].Heartbeat}
	}
	f.loaded = true
	f.accepting.Store(true)
	return nil
}

// unload forgets the state: a cluster replica that stopped driving the
// rollouts (another replica does now).
func (f *Fleet) unload() {
	f.accepting.Store(false)
	f.mu.Lock()
	f.reset()
	f.loaded = false
	f.mu.Unlock()
	f.inMu.Lock()
	f.inbox = nil
	f.inMu.Unlock()
}

// Leading says whether the state is loaded here: always on the single
// hub once it runs; on the one cluster replica that drives the rollouts.
func (f *Fleet) Leading() bool { return f.accepting.Load() }

// reader is f when it holds the state, else a copy read from the store
// now (a cluster replica that does not drive: the API still answers).
func (f *Fleet) reader(ctx context.Context) (*Fleet, error) {
	if f.Leading() {
		return f, nil
	}
	r := NewFleet(f.st, FleetOptions{Now: f.o.Now, Logger: f.log})
	if err := r.Load(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// NoteStatus takes a gateway's bundle status (hub/gateways/{gw}/bundle/status).
func (f *Fleet) NoteStatus(gw string, s uplink.BundleStatus) {
	f.note(fleetEvent{gw: gw, status: &s})
}

// NoteResult takes the result of a control the engine sent; others
// are ignored.
func (f *Fleet) NoteResult(gw string, r uplink.ControlResult) {
	f.note(fleetEvent{gw: gw, result: &r})
}

// NoteGateway takes a gateway's record after the hub stored a change
// of it (presence, heartbeat).
func (f *Fleet) NoteGateway(g Gateway) {
	f.note(fleetEvent{gw: g.ID, g: &g})
}

func (f *Fleet) note(e fleetEvent) {
	if !f.accepting.Load() {
		return
	}
	f.inMu.Lock()
	f.inbox = append(f.inbox, e)
	f.inMu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// Run loads the state (unless Load did) and steps until ctx ends: at once when messages
// arrive, and every Tick.
func (f *Fleet) Run(ctx context.Context) error {
	f.mu.Lock()
	loaded := f.loaded
	f.mu.Unlock()
	if !loaded {
		if err := f.Load(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
	t := time.NewTicker(f.o.Tick)
	defer t.Stop()
	backoff := time.Duration(0)
	for {
		if err := f.Step(ctx); err != nil && ctx.Err() == nil {
			// The state stays in memory, marked to write: the next step
			// tries again, and sends nothing before it is written.
			backoff = min(max(2*backoff, time.Second), 30*time.Second)
			f.log.Error("rollouts: write state", "err", err, "retry_in", backoff)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			continue
		}
		backoff = 0
		select {
		case <-ctx.Done():
			return nil
		case <-f.wake:
		case <-t.C:
		}
	}
}

// Step takes the messages that arrived, does what is due at Now
// (notify a stage, resend, go on after a soak, abort, roll back, end
// at the deadline, revert a drift), writes the changes, and only then
// sends the offers they allow.
func (f *Fleet) Step(ctx context.Context) error {
	f.inMu.Lock()
	in := f.inbox
	f.inbox = nil
	f.inMu.Unlock()
	f.mu.Lock()
	if !f.loaded {
		f.mu.Unlock()
		if err := f.Load(ctx); err != nil {
			return err
		}
		f.mu.Lock()
	}
	now := f.o.Now()
	for _, e := range in {
		switch {
		case e.status != nil:
			f.applyStatus(e.gw, *e.status, now)
		case e.result != nil:
			f.applyResult(e.gw, *e.result, now)
		case e.g != nil:
			f.applyGateway(*e.g, now)
		}
	}
	for _, run := range f.order {
		f.advance(run, now)
	}
	f.prune(now)
	out, err := f.saveLocked(ctx)
	f.mu.Unlock()
	if err != nil {
		return err
	}
	f.send(out)
	return nil
}

// saveLocked writes what changed and hands back the offers that may
// now go out; on an error the offers are dropped (sent again at the
// next resend, once written) and the records stay marked.
func (f *Fleet) saveLocked(ctx context.Context) ([]outgoing, error) {
	var c FleetState
	for r := range f.dirtyR {
		c.Rollouts = append(c.Rollouts, r)
	}
	for t := range f.dirtyT {
		c.Targets = append(c.Targets, t)
	}
	for g := range f.dirtyG {
		c.Gateways = append(c.Gateways, g)
	}
	for g := range f.dirtyP {
		c.Groups = append(c.Groups, g)
	}
	c.Forget = f.forget
	out := f.out
	f.out = nil
	if len(c.Rollouts)+len(c.Targets)+len(c.Gateways)+len(c.Groups)+len(c.Forget) > 0 {
		if err := f.st.SaveFleet(ctx, c); err != nil {
			return nil, err
		}
		clear(f.dirtyR)
		clear(f.dirtyT)
		clear(f.dirtyG)
		clear(f.dirtyP)
		f.forget = nil
	}
	return out, nil
}

func (f *Fleet) send(out []outgoing) {
	for _, o := range out {
		if f.o.Send == nil {
			continue
		}
		if err := f.o.Send(o.gw, o.c); err != nil {
			f.log.Debug("rollouts: offer not sent; sent again later", "gateway", o.gw, "err", err)
		}
	}
}

// bundleSet returns a stored bundle, validated (cached by hash).
func (f *Fleet) bundleSet(ctx context.Context, hash string) (*check.Set, error) {
	if s := f.sets[hash]; s != nil {
		return s, nil
	}
	_, enc, err := f.st.Bundle(ctx, hash)
	if err != nil {
		return nil, err
	}
	b, err := bundle.Decode(enc)
	if err != nil {
		return nil, fmt.Errorf("stored bundle %s: %w", bundle.Short(hash), err)
	}
	set, err := check.Bundle(b)
	if err != nil {
		return nil, fmt.Errorf("stored bundle %s no longer validates: %w", bundle.Short(hash), err)
	}
	f.sets[hash] = set
	return set, nil
}

// rollbackRelease numbers the release that puts hash back for rollout
// r's abort, or finds the one an abort that could not be written
// numbered (a release is written on its own, before the abort).
func (f *Fleet) rollbackRelease(r *Rollout, hash string, now time.Time) (Release, error) {
	ctx := context.Background()
	rels, err := f.st.Releases(ctx, r.Spec.Group)
	if err != nil {
		return Release{}, err
	}
	for _, rel := range rels {
		if rel.Kind == ReleaseRollback && rel.Rollout == r.ID && rel.Hash == hash {
			return rel, nil
		}
	}
	return f.st.AddRelease(ctx, Release{Group: r.Spec.Group, Hash: hash, Kind: ReleaseRollback, Rollout: r.ID, At: now})
}

// offer queues a bundle offer to a gateway.
func (f *Fleet) offer(gw, control string, version uint64, hash, rollout string, soak time.Duration, kind string) {
	set, err := f.bundleSet(context.Background(), hash)
	if err != nil {
		f.log.Error("rollouts: cannot offer a bundle", "gateway", gw, "hash", bundle.Short(hash), "err", err)
		return
	}
	enc := f.encs[hash]
	if enc == nil {
		if enc, err = set.Bundle.Encode(); err != nil {
			f.log.Error("rollouts: cannot offer a bundle", "gateway", gw, "hash", bundle.Short(hash), "err", err)
			return
		}
		f.encs[hash] = enc // shared by every offer of it: read-only
	}
	f.out = append(f.out, outgoing{gw: gw, c: uplink.Control{ID: control, Action: uplink.ActionBundle, Bundle: &uplink.BundleOffer{
		Hash: hash, Version: version, Rollout: rollout, SoakSeconds: math.Round(soak.Seconds()), Bundle: enc,
	}}})
	f.metrics.offers.WithLabelValues(kind).Inc()
}

func (f *Fleet) online(gw string) bool { return f.seen[gw].online }

func (f *Fleet) fleetGateway(gw string) *FleetGateway {
	g := f.gws[gw]
	if g == nil {
		g = &FleetGateway{Gateway: gw}
		f.gws[gw] = g
	}
	return g
}

func (f *Fleet) touch(run *rolloutRun, now time.Time) {
	run.r.Updated = now
	f.dirtyR[run.r] = true
}

// statusRank orders the steps of one version's statuses: a status of
// a lower rank after a higher one is old news.
func statusRank(s string) int {
	switch s {
	case uplink.BundleReceived:
		return 1
	case uplink.BundleApplied:
		return 2
	case uplink.BundleHealthy, uplink.BundleRejected, uplink.BundleReverted:
		return 3
	}
	return 0
}

// applyStatus records a bundle status, keyed by (gateway, version,
// status): a repeat changes nothing, and an older version never moves
// the gateway back.
func (f *Fleet) applyStatus(gw string, s uplink.BundleStatus, now time.Time) {
	if s.Gateway != gw {
		f.log.Warn("rollouts: bundle status names another gateway; dropped", "topic_gateway", gw, "gateway", s.Gateway)
		f.metrics.statuses.WithLabelValues("invalid").Inc()
		return
	}
	fg := f.fleetGateway(gw)
	switch {
	case s.Version < fg.Version, s.Version == fg.Version && statusRank(s.Status) < statusRank(fg.Status):
		f.metrics.statuses.WithLabelValues("old").Inc()
	case s.Version == fg.Version && (s.Status == fg.Status || statusRank(s.Status) == 3 && statusRank(fg.Status) == 3):
		f.metrics.statuses.WithLabelValues("repeat").Inc()
	default:
		f.metrics.statuses.WithLabelValues("new").Inc()
		fg.Version, fg.Hash, fg.Status, fg.Reason, fg.At = s.Version, s.Hash, s.Status, s.Reason, s.At
		if s.Current != "" {
			// What runs, a heartbeat sooner than the next heartbeat says it.
			cfg := uplink.ConfigState{Hash: s.Current, Source: uplink.SourceHub, Version: s.Version, Since: s.At, Trial: s.Status == uplink.BundleApplied}
			if s.Current != s.Hash {
				if cfg = (uplink.ConfigState{Hash: s.Current, Since: s.At}); fg.Config != nil && fg.Config.Hash == s.Current {
					cfg = *fg.Config
				}
			}
			if fg.Config != nil {
				cfg.Files = fg.Config.Files
			}
			fg.Config = &cfg
		}
		if s.Status == uplink.BundleHealthy {
			fg.Expected, fg.ExpectedVersion = s.Hash, s.Version
			if fg.Drifted && fg.Config != nil && fg.Config.Hash == s.Hash {
				fg.Drifted, fg.Drift, fg.DriftSince = false, "", time.Time{}
			}
		}
		f.dirtyG[fg] = true
	}
	run := f.runs[s.Rollout]
	if run == nil {
		return
	}
	t := run.byGW[gw]
	if t == nil {
		return
	}
	switch {
	case s.Version == t.Version && s.Hash == run.r.Hash:
		f.forwardStatus(run, t, s, now)
	case t.Back != "" && s.Version == t.BackVersion:
		f.backStatus(run, t, s.Status, s.Reason, s.Message, now)
	}
}

func (f *Fleet) forwardStatus(run *rolloutRun, t *RolloutGateway, s uplink.BundleStatus, now time.Time) {
	late := t.Status == TargetUnreachable && (run.r.active() || run.r.Following)
	if t.ended() && !late {
		return
	}
	t.Answered = true
	if t.Previous == "" && s.Status == uplink.BundleReceived && s.Current != s.Hash {
		// Offered before the hub knew what it ran: the gateway says it.
		t.Previous = s.Current
	}
	switch s.Status {
	case uplink.BundleReceived:
		if t.Status == TargetNotified || late {
			t.Status = TargetReceived
		}
	case uplink.BundleApplied:
		t.Status = TargetApplied
	case uplink.BundleHealthy:
		t.Status, t.Reason, t.Message = TargetHealthy, "", ""
	case uplink.BundleRejected, uplink.BundleReverted:
		f.fail(run, t, s.Reason, s.Message, now)
	}
	t.Updated = now
	f.dirtyT[t] = true
	f.touch(run, now)
	run.check = true // counted once per step: a count per status would cost the fleet squared
}

// retryable reasons may pass on their own: the same bundle is worth
// offering again.
func retryable(reason string) bool {
	return reason == uplink.ReasonStorage || reason == uplink.ReasonValidationTimeout || reason == uplink.ReasonRestarted ||
		reason == uplink.ReasonRegistryRefused // a broker away or refusing for a moment
}

// fail ends a target as failed, or offers it again (a new release of
// the same bundle) when the reason may pass and retries are left.
func (f *Fleet) fail(run *rolloutRun, t *RolloutGateway, reason, msg string, now time.Time) {
	r := run.r
	if retryable(reason) && t.Offers <= r.Spec.Retries && r.State == RolloutRunning {
		rel, err := f.st.AddRelease(context.Background(), Release{Group: r.Spec.Group, Hash: r.Hash, Kind: ReleaseRetry, Rollout: r.ID, At: now})
		if err == nil {
			f.log.Info("rollouts: offering again", "rollout", r.ID, "gateway", t.Gateway, "reason", reason, "version", rel.Version)
			t.Version, t.Status, t.Reason, t.Message = rel.Version, TargetPending, reason, msg
			t.Control, t.Answered = "", false
			f.dirtyT[t] = true
			return
		}
		f.log.Error("rollouts: number a retry", "rollout", r.ID, "err", err)
	}
	t.Status, t.Reason, t.Message = TargetFailed, reason, msg
	f.dirtyT[t] = true
}

func (f *Fleet) backStatus(run *rolloutRun, t *RolloutGateway, status, reason, msg string, now time.Time) {
	if t.backEnded() {
		return
	}
	switch status {
	case uplink.BundleHealthy:
		t.Back, t.BackReason = BackRolledBack, ""
	case uplink.BundleRejected, uplink.BundleReverted:
		t.Back, t.BackReason = BackFailed, strings.TrimSpace(reason+": "+msg)
	default:
		t.Back = BackNotified
	}
	t.Updated = now
	f.dirtyT[t] = true
	f.touch(run, now)
}

// applyResult takes a control result: an answer stops the resends; a
// refusal ends the target.
func (f *Fleet) applyResult(gw string, res uplink.ControlResult, now time.Time) {
	ref, ok := f.controls[res.ID]
	if !ok {
		return
	}
	switch {
	case ref.fg != nil:
		if !res.OK {
			f.log.Warn("rollouts: drift revert refused", "gateway", gw, "code", res.Code, "err", res.Error)
		}
	case ref.back:
		t := ref.t
		if t.BackControl != res.ID || t.backEnded() {
			return
		}
		if !res.OK {
			t.Back, t.BackReason = BackFailed, strings.TrimSpace(res.Code+": "+res.Error)
			t.Updated = now
			f.dirtyT[t] = true
			f.touch(ref.run, now)
		}
	default:
		t := ref.t
		if t.Control != res.ID || t.ended() {
			return
		}
		t.Answered = true
		if !res.OK {
			f.fail(ref.run, t, res.Code, res.Error, now)
			ref.run.check = true
		}
		t.Updated = now
		f.dirtyT[t] = true
		f.touch(ref.run, now)
	}
}

// applyGateway takes a gateway's presence and heartbeat: it may be
// offered what waited for it, join a continuous rollout, or show a
// drift.
func (f *Fleet) applyGateway(g Gateway, now time.Time) {
	f.seen[g.ID] = presenceOf{online: g.State == StateOnline, hb: g.Heartbeat}
	f.joinContinuous(g.ID, now)
	if g.Heartbeat == nil || g.Heartbeat.Config == nil {
		return
	}
	fg := f.fleetGateway(g.ID)
	cfg := *g.Heartbeat.Config
	if fg.Config == nil || *fg.Config != cfg {
		fg.Config = &cfg
		f.dirtyG[fg] = true
	}
	f.inferKept(g.ID, cfg, g.Heartbeat.Time, now)
	if !fg.At.IsZero() && g.Heartbeat.Time.Before(fg.At) {
		return // older than the last bundle status: not news about drift
	}
	f.drift(fg, now)
}

// inferKept reads a kept bundle from a heartbeat: a status sent while
// the hub was away (restarting; its session is clean) is lost to it,
// and the gateway sends its latest again only when it reconnects
// itself. A heartbeat that runs a release offered, not on trial, says
// the same as its healthy status.
//
// Its revert is read the same way: a gateway that said it applied the
// release and whose heartbeat since then (both times by the gateway's
// clock) runs, not on trial, what it ran before, reverted it; its
// status said why, and was lost on the way (a cluster's lead changing
// hands drops what arrives meanwhile). It ends failed, not unreachable
// at the deadline.
func (f *Fleet) inferKept(gw string, cfg uplink.ConfigState, sent, now time.Time) {
	if cfg.Trial {
		return
	}
	if fg := f.gws[gw]; fg != nil && fg.Status == uplink.BundleApplied && sent.After(fg.At) {
		for _, run := range f.order {
			if t := run.byGW[gw]; t != nil && run.r.active() && t.Status == TargetApplied && t.Version == fg.Version &&
				t.Previous != "" && t.Previous != run.r.Hash && cfg.Hash == t.Previous {
				f.applyStatus(gw, uplink.BundleStatus{Gateway: gw, Hash: run.r.Hash, Version: t.Version, Rollout: run.r.ID,
					Status: uplink.BundleReverted, Current: cfg.Hash, At: sent,
					Message: "its heartbeat runs the bundle it ran before again; the status saying why was lost on the way"}, now)
			}
		}
	}
	if cfg.Source != uplink.SourceHub || cfg.Version == 0 {
		return
	}
	for _, run := range f.order {
		t := run.byGW[gw]
		if t == nil || !run.r.active() && !run.r.Following {
			continue
		}
		s := uplink.BundleStatus{Gateway: gw, Hash: cfg.Hash, Version: cfg.Version, Rollout: run.r.ID, Status: uplink.BundleHealthy, At: cfg.Since}
		if t.Version == cfg.Version && cfg.Hash == run.r.Hash && t.took() && t.Status != TargetHealthy ||
			t.Back == BackNotified && t.BackVersion == cfg.Version && cfg.Hash == t.Previous {
			f.applyStatus(gw, s, now)
		}
	}
}

// Kinds of drift (FleetGateway.Drift).
const (
	// DriftConfig: the gateway runs another configuration than the
	// bundle it should run (a local apply, a registry edited and the
	// agent restarted on its files, ...).
	DriftConfig = "config"
	// DriftFiles: the gateway runs on its config files, and they were
	// edited by hand since it started (in force at its next start).
	DriftFiles = "files"
)

// drift compares what a gateway runs with what it should, and applies
// its group's policy.
func (f *Fleet) drift(fg *FleetGateway, now time.Time) {
	cfg := fg.Config
	kind := ""
	switch {
	case cfg == nil || cfg.Trial || f.outstanding(fg.Gateway):
	case fg.Expected != "" && cfg.Hash != fg.Expected:
		kind = DriftConfig
	case cfg.Source == uplink.SourceFiles && cfg.Files != "" && cfg.Files != cfg.Hash:
		kind = DriftFiles
	}
	if kind == "" {
		if fg.Drifted {
			fg.Drifted, fg.Drift, fg.DriftSince = false, "", time.Time{}
			f.dirtyG[fg] = true
		}
		return
	}
	if !fg.Drifted || fg.Drift != kind {
		fg.Drifted, fg.Drift, fg.DriftSince = true, kind, now
		f.dirtyG[fg] = true
		f.log.Warn("gateway drifted", "gateway", fg.Gateway, "drift", kind,
			"runs", bundle.Short(cfg.Hash), "source", cfg.Source, "files", bundle.Short(cfg.Files), "expected", bundle.Short(fg.Expected))
	}
	switch f.policy(fg.Group) {
	case DriftAdopt:
		if kind != DriftConfig {
			return // edited files do not run yet: nothing to adopt
		}
		f.log.Info("drift adopted: the hub now expects what the gateway runs", "gateway", fg.Gateway, "hash", bundle.Short(cfg.Hash))
		fg.Expected, fg.ExpectedVersion = cfg.Hash, cfg.Version
		fg.Drifted, fg.Drift, fg.DriftSince = false, "", time.Time{}
		f.dirtyG[fg] = true
		f.metrics.drift.WithLabelValues(DriftAdopt).Inc()
	case DriftRevert:
		// Edited files are put out of force by what runs now, as a
		// bundle: the agent then runs it, not the files, at its next start.
		want := fg.Expected
		if want == "" {
			want = cfg.Hash
		}
		f.revert(fg, want, now)
	default:
		// alert: shown by the API and counted by the metrics
	}
}

// revert offers a drifted gateway the bundle it should run, as a newer
// release, once per RevertEvery at most.
func (f *Fleet) revert(fg *FleetGateway, want string, now time.Time) {
	if !f.online(fg.Gateway) || (!fg.RevertSent.IsZero() && now.Sub(fg.RevertSent) < f.o.RevertEvery) {
		return
	}
	if fg.RevertControl == "" || fg.Version >= fg.RevertVersion || fg.RevertHash != want {
		group := fg.Group
		if group == "" {
			group = DefaultGroup
		}
		rel, err := f.st.AddRelease(context.Background(), Release{Group: group, Hash: want, Kind: ReleaseRevert, At: now})
		if err != nil {
			f.log.Error("drift revert: the hub cannot offer the bundle the gateway should run", "gateway", fg.Gateway, "hash", bundle.Short(want), "err", err)
			fg.RevertSent = now
			return
		}
		delete(f.controls, fg.RevertControl)
		fg.RevertControl, fg.RevertVersion, fg.RevertHash = newID(), rel.Version, want
		f.controls[fg.RevertControl] = controlRef{fg: fg}
		f.metrics.drift.WithLabelValues(DriftRevert).Inc()
	}
	fg.RevertSent = now
	f.dirtyG[fg] = true
	f.offer(fg.Gateway, fg.RevertControl, fg.RevertVersion, want, "", 0, "revert")
}

// policy is a group's drift policy; a gateway no rollout targeted yet
// is in DefaultGroup.
func (f *Fleet) policy(group string) string {
	if group == "" {
		group = DefaultGroup
	}
	if g := f.groups[group]; g != nil && g.DriftPolicy != "" {
		return g.DriftPolicy
	}
	return DriftAlert
}

// outstanding says a rollout is under way on the gateway: its running
// configuration is in motion, not drifted.
func (f *Fleet) outstanding(gw string) bool {
	for _, run := range f.order {
		if !run.r.active() && !run.r.Following {
			continue
		}
		if t := run.byGW[gw]; t != nil && (!t.ended() && t.Status != TargetPending || t.Back == BackNotified) {
			return true
		}
	}
	return false
}

// joinContinuous adds a gateway to the continuous rollouts whose tag it
// has (or that target every gateway) and that do not hold it yet.
func (f *Fleet) joinContinuous(gw string, now time.Time) {
	for _, run := range f.order {
		r := run.r
		if !r.Spec.Continuous || run.byGW[gw] != nil || r.State != RolloutRunning && r.State != RolloutPaused && !r.Following {
			continue
		}
		if r.Spec.Tag != "" && !slices.Contains(f.gws[gw].tags(), r.Spec.Tag) {
			continue
		}
		last := len(r.Stages) - 1
		t := &RolloutGateway{Rollout: r.ID, Gateway: gw, Order: len(run.targets), Stage: last, Status: TargetPending, Version: r.Version, Updated: now}
		run.targets = append(run.targets, t)
		run.byGW[gw] = t
		r.Stages[last]++
		f.dirtyT[t] = true
		f.touch(run, now)
		f.fleetGateway(gw).Group = r.Spec.Group
		f.dirtyG[f.gws[gw]] = true
		f.log.Info("rollouts: gateway joins a continuous rollout", "rollout", r.ID, "gateway", gw)
	}
}

func (g *FleetGateway) tags() []string {
	if g == nil {
		return nil
	}
	return g.Tags
}

// checkAbort aborts a running or paused rollout once its failures
// reach the threshold, counted over the gateways that ran it.
func (f *Fleet) checkAbort(run *rolloutRun, now time.Time) {
	r := run.r
	if r.State != RolloutRunning && r.State != RolloutPaused {
		return
	}
	executed, failed := 0, 0
	for _, t := range run.targets {
		if t.executed() {
			executed++
			if t.Status == TargetFailed {
				failed++
			}
		}
	}
	if failed < r.Spec.AbortMin || float64(failed)*100 < r.Spec.AbortPercent*float64(executed) {
		return
	}
	f.abort(run, now, fmt.Sprintf("%d of the %d gateways that ran it failed (threshold %v%%, at least %d)", failed, executed, r.Spec.AbortPercent, r.Spec.AbortMin))
}

// abort records the decision and what it rolls back, before anything
// of the rollback is sent: the gateways that may run the bundle are
// offered what they ran before, as a newer release, at the same pace
// as the rollout went.
func (f *Fleet) abort(run *rolloutRun, now time.Time, why string) {
	r := run.r
	f.log.Warn("rollout aborted; rolling back the gateways that took it", "rollout", r.ID, "why", why)
	f.metrics.aborts.Inc()
	r.State, r.Reason, r.Aborted = RolloutAborting, why, now
	r.Stage, r.StageStarted, r.StageSettled = 0, time.Time{}, time.Time{}
	if d := now.Add(r.Spec.GatewayTimeout.D()); d.After(r.Deadline) {
		r.Deadline = d
	}
	if r.Rollback == nil {
		r.Rollback = map[string]uint64{}
	}
	for _, t := range run.targets {
		switch {
		case t.Status == TargetPending:
			t.Status = TargetNotSent
		case t.took() && t.Back == "":
			if t.Previous == r.Hash {
				break // nothing to put back
			}
			if t.Previous == "" {
				// It took the bundle, and what it ran before is not known:
				// said, not left to look rolled back.
				t.Back, t.BackReason = BackFailed, "no way back: what it ran before the rollout is not known"
				f.dirtyT[t] = true
				break
			}
			v, ok := r.Rollback[t.Previous]
			if !ok {
				rel, err := f.rollbackRelease(r, t.Previous, now)
				if err != nil {
					t.Back, t.BackReason = BackFailed, fmt.Sprintf("no way back: %v", err)
					break
				}
				v = rel.Version
				r.Rollback[t.Previous] = v
			}
			t.Back, t.BackVersion = BackPending, v
		default:
			continue
		}
		t.Updated = now
		f.dirtyT[t] = true
	}
	f.touch(run, now)
}

// advance does what is due for one rollout.
func (f *Fleet) advance(run *rolloutRun, now time.Time) {
	r := run.r
	if run.check {
		run.check = false
		f.checkAbort(run, now)
	}
	switch {
	case r.State == RolloutAborting:
		f.advanceBack(run, now)
	case r.active():
		f.advanceForward(run, now)
	case r.Following:
		f.follow(run, now)
	}
}

func (f *Fleet) advanceForward(run *rolloutRun, now time.Time) {
	r := run.r
	if !now.Before(r.Deadline) {
		f.end(run, now, RolloutCompleted, "deadline")
		return
	}
	f.resend(run, now)
	if r.State == RolloutPaused {
		// No new offers; the stage under way still settles and soaks,
		// so that a resume does not start its soak again.
		if !r.StageStarted.IsZero() {
			settled, _ := f.stageSettled(run, now)
			f.soaked(run, settled, now)
		}
		return
	}
	if r.StageStarted.IsZero() {
		if refused := f.preflight(run, now); refused > 0 {
			r.State = RolloutPaused
			r.Reason = fmt.Sprintf("pre-flight: %d gateway(s) of stage %d would fail; see each one's reason, then resume (-skip to go on without them) or abort", refused, r.Stage)
			f.log.Warn("rollout held by the pre-flight check", "rollout", r.ID, "stage", r.Stage, "refused", refused)
			f.touch(run, now)
			return
		}
		r.StageStarted = now
		f.touch(run, now)
	}
	for _, t := range run.targets {
		if t.Stage <= r.Stage && t.Status == TargetPending && f.online(t.Gateway) {
			f.notify(run, t, now)
		}
	}
	settled, allEnded := f.stageSettled(run, now)
	if !f.soaked(run, settled, now) {
		return
	}
	if r.Stage < len(r.Stages)-1 {
		r.Stage, r.StageStarted, r.StageSettled = r.Stage+1, time.Time{}, time.Time{}
		f.touch(run, now)
		f.advanceForward(run, now)
		return
	}
	if allEnded {
		f.end(run, now, RolloutCompleted, "")
	}
}

// stageSettled says whether every target of the stages so far has an
// outcome or timed out (settled), and whether every one has an outcome.
func (f *Fleet) stageSettled(run *rolloutRun, now time.Time) (settled, allEnded bool) {
	r := run.r
	timeout := !now.Before(r.StageStarted.Add(r.Spec.GatewayTimeout.D()))
	settled, allEnded = true, true
	for _, t := range run.targets {
		if t.Stage <= r.Stage && !t.ended() {
			allEnded = false
			if !timeout {
				settled = false
			}
		}
	}
	return settled, allEnded
}

// notify sends a target its offer, the intent written first (the
// control ID is in the record the save writes before the send).
func (f *Fleet) notify(run *rolloutRun, t *RolloutGateway, now time.Time) {
	r := run.r
	if t.Previous == "" {
		if fg := f.gws[t.Gateway]; fg != nil && fg.Config != nil {
			t.Previous = fg.Config.Hash
		}
	}
	if t.Control == "" {
		t.Control = newID()
		t.Offers++
		f.controls[t.Control] = controlRef{run: run, t: t}
	}
	t.Status, t.Notified, t.Sent, t.Answered, t.Updated = TargetNotified, now, now, false, now
	t.Sends++
	f.dirtyT[t] = true
	fg := f.fleetGateway(t.Gateway)
	if fg.Group != r.Spec.Group {
		fg.Group = r.Spec.Group
		f.dirtyG[fg] = true
	}
	f.offer(t.Gateway, t.Control, t.Version, r.Hash, r.ID, r.Spec.GatewaySoak.D(), "rollout")
}

// resend sends again, with the same control ID, offers that had no
// answer (forward, and rollback offers).
func (f *Fleet) resend(run *rolloutRun, now time.Time) {
	r := run.r
	every := r.Spec.Resend.D()
	for _, t := range run.targets {
		if !f.online(t.Gateway) {
			continue
		}
		if t.Status == TargetNotified && !t.Answered && t.Control != "" && !now.Before(t.Sent.Add(every)) && r.State != RolloutAborting {
			t.Sent = now
			t.Sends++
			f.dirtyT[t] = true
			f.offer(t.Gateway, t.Control, t.Version, r.Hash, r.ID, r.Spec.GatewaySoak.D(), "resend")
		}
		if t.Back == BackNotified && t.BackControl != "" && !now.Before(t.BackSent.Add(every)) {
			t.BackSent = now
			f.dirtyT[t] = true
			f.offer(t.Gateway, t.BackControl, t.BackVersion, t.Previous, r.ID, r.Spec.GatewaySoak.D(), "resend")
		}
	}
}

// advanceBack rolls back, stage by stage, the gateways an abort
// named, and ends the rollout once each has an outcome (or at the
// deadline).
func (f *Fleet) advanceBack(run *rolloutRun, now time.Time) {
	r := run.r
	if !now.Before(r.Deadline) {
		f.end(run, now, RolloutAborted, "")
		return
	}
	f.resend(run, now)
	size := func(stage int) int {
		if stage >= len(r.Stages) {
			return math.MaxInt
		}
		if stage == 0 {
			return max(r.Stages[0], 1)
		}
		return max(r.Stages[stage]-r.Stages[stage-1], 1)
	}
	if r.StageStarted.IsZero() {
		n := 0
		for _, t := range run.targets {
			if t.Back == BackPending && t.BackStage == 0 && n < size(r.Stage) {
				t.BackStage = r.Stage + 1
				f.dirtyT[t] = true
				n++
			}
		}
		if n == 0 {
			if f.backDone(run) {
				f.end(run, now, RolloutAborted, "")
			}
			return
		}
		r.StageStarted = now
		f.touch(run, now)
	}
	settled := !now.Before(r.StageStarted.Add(r.Spec.GatewayTimeout.D()))
	if !settled {
		settled = true
		for _, t := range run.targets {
			if t.BackStage == r.Stage+1 && !t.backEnded() {
				settled = false
			}
		}
	}
	for _, t := range run.targets {
		if t.BackStage != 0 && t.BackStage <= r.Stage+1 && t.Back == BackPending && f.online(t.Gateway) {
			if t.BackControl == "" {
				t.BackControl = newID()
				f.controls[t.BackControl] = controlRef{run: run, t: t, back: true}
			}
			t.Back, t.BackNotified, t.BackSent, t.Updated = BackNotified, now, now, now
			f.dirtyT[t] = true
			f.offer(t.Gateway, t.BackControl, t.BackVersion, t.Previous, r.ID, r.Spec.GatewaySoak.D(), "rollback")
		}
	}
	if !f.soaked(run, settled, now) {
		return
	}
	r.Stage, r.StageStarted, r.StageSettled = r.Stage+1, time.Time{}, time.Time{}
	f.touch(run, now)
	f.advanceBack(run, now)
}

// soaked notes when the stage under way settled, and says whether
// its soak has passed since.
func (f *Fleet) soaked(run *rolloutRun, settled bool, now time.Time) bool {
	r := run.r
	if !settled {
		return false
	}
	if r.StageSettled.IsZero() {
		r.StageSettled = now
		f.touch(run, now)
	}
	return !now.Before(r.StageSettled.Add(r.Spec.Soak.D()))
}

// backDone says every rollback has an outcome.
func (f *Fleet) backDone(run *rolloutRun) bool {
	for _, t := range run.targets {
		if t.Back != "" && !t.backEnded() {
			return false
		}
	}
	return true
}

// end ends a rollout: whatever has no outcome yet is unreachable (or
// not sent, if its stage never came).
func (f *Fleet) end(run *rolloutRun, now time.Time, state, reason string) {
	r := run.r
	for _, t := range run.targets {
		was, wasBack := t.Status, t.Back
		switch {
		case t.Status == TargetPending && state == RolloutSuperseded:
			t.Status = TargetSuperseded
		case t.Status == TargetPending && (t.Stage > r.Stage || t.Stage == r.Stage && r.StageStarted.IsZero()):
			t.Status = TargetNotSent // its stage never came
		case !t.ended() && state == RolloutSuperseded:
			t.Status = TargetSuperseded
		case !t.ended():
			t.Status = TargetUnreachable
		}
		if t.Back == BackPending || t.Back == BackNotified {
			t.Back = BackUnreachable
		}
		if t.Status != was || t.Back != wasBack {
			// Only those the end changes: Updated is when a gateway
			// reached its outcome, which the rollout page draws.
			t.Updated = now
			f.dirtyT[t] = true
		}
	}
	if reason != "" || r.State != RolloutAborting {
		r.Reason = reason
	}
	r.State, r.Ended = state, now
	r.Following = r.Spec.Continuous && state == RolloutCompleted
	f.touch(run, now)
	f.log.Info("rollout ended", "rollout", r.ID, "state", state, "reason", reason)
}

// follow offers a completed continuous rollout's release to its
// gateways that have not got it: joined late, or unreachable before.
func (f *Fleet) follow(run *rolloutRun, now time.Time) {
	f.resend(run, now)
	memo := registryMemo{}
	for _, t := range run.targets {
		if (t.Status == TargetPending || t.Status == TargetUnreachable || t.Status == TargetNotSent) && f.online(t.Gateway) {
			if reason := f.refusal(run.r, t.Gateway, memo); reason != "" {
				// What cannot pass by itself ends it; the rest (a read
				// that failed, a device missing for a moment) is looked
				// at again at the next step.
				if t.Refused != reason {
					t.Refused, t.Updated = reason, now
					f.dirtyT[t] = true
				}
				if lasting(reason) {
					t.Status = TargetSkipped
				}
				continue
			}
			f.notify(run, t, now)
		}
	}
}

// preflight checks the targets of the stage about to start against
// what each gateway reports; it returns how many it refuses (and
// notes why on each).
func (f *Fleet) preflight(run *rolloutRun, now time.Time) int {
	r := run.r
	n := 0
	memo := registryMemo{}
	for _, t := range run.targets {
		if t.Stage != r.Stage || t.Status != TargetPending {
			continue
		}
		reason := f.refusal(r, t.Gateway, memo)
		if reason != t.Refused {
			t.Refused, t.Updated = reason, now
			f.dirtyT[t] = true
		}
		if reason != "" {
			n++
		}
	}
	return n
}

// refusal is why a gateway would fail the rollout's bundle, from what
// it reports, or "". A gateway the hub has not heard from is not
// refused: nothing is known against it, and the deadline ends it.
func (f *Fleet) refusal(r *Rollout, gw string, memo registryMemo) string {
	set, err := f.bundleSet(context.Background(), r.Hash)
	if err != nil {
		return fmt.Sprintf("the bundle cannot be read: %v", err)
	}
	hb := f.seen[gw].hb
	if hb == nil {
		return ""
	}
	if !bundle.Compatible(set.Bundle.MinAgent, hb.Version) {
		return fmt.Sprintf("agent_too_old: the gateway runs agent %s; the bundle needs %s", hb.Version, set.Bundle.MinAgent)
	}
	if hb.Config == nil {
		return "no_bundles: its heartbeat carries no configuration (an agent before bundles, or one that takes none)"
	}
	cur := hb.Config.Hash
	if cur == r.Hash {
		return ""
	}
	curSet, err := f.bundleSet(context.Background(), cur)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return fmt.Sprintf("no_way_back: the hub does not hold the bundle it runs (%s), so an abort could not put it back; push it first (hub bundle push)", bundle.Short(cur))
		}
		return fmt.Sprintf("no_way_back: %v", err)
	}
	have, _ := curSet.Bundle.File(bundle.RegistryFile)
	want, _ := set.Bundle.File(bundle.RegistryFile)
	if string(have) != string(want) {
		if !hb.Config.SwapsRegistry {
			return "registry_changed: the bundle's devices.toml is not the one it runs (" + registryDiff(curSet, set) + "); this agent swaps its registry only at a restart"
		}
		// An agent that swaps registries takes the bundle's: right when
		// the group's registry was edited, wrong when the gateway runs a
		// registry of its own (another building's devices), which the
		// bundle would replace.
		if !f.releasedIn(r.Spec.Group, have, memo) {
			return "registry_changed: it runs a devices.toml of its own, not one released to group " + r.Spec.Group + " (" + registryDiff(curSet, set) + "); the bundle would replace it"
		}
		return "" // devices it adds that do not answer revert its trial (devices_silent)
	}
	if missing := missingDevices(set, hb.Devices); len(missing) > 0 {
		return fmt.Sprintf("devices_missing: it reports no device %s of the bundle's registry", strings.Join(missing, ", "))
	}
	return ""
}

// registryMemo is what releasedIn learnt of each group, for one pass
// over a stage's gateways: one read of the group's releases, not one per
// gateway.
type registryMemo map[string]map[string]bool

// releasedIn reports whether a bundle with the devices.toml reg was ever
// released to group (any version, any scenes). A read that fails says
// no; the gateway is looked at again at the next step.
func (f *Fleet) releasedIn(group string, reg []byte, memo registryMemo) bool {
	regs, ok := memo[group]
	if !ok {
		rels, err := f.st.Releases(context.Background(), group)
		if err != nil {
			return false
		}
		regs = map[string]bool{}
		for _, rel := range rels {
			if set, err := f.bundleSet(context.Background(), rel.Hash); err == nil {
				data, _ := set.Bundle.File(bundle.RegistryFile)
				regs[string(data)] = true
			}
		}
		memo[group] = regs
	}
	return regs[string(reg)]
}

// lasting reports whether a pre-flight refusal stays until an operator
// or the gateway's agent changes something (its version, its registry),
// rather than passing by itself.
func lasting(reason string) bool {
	for _, p := range []string{"agent_too_old", "no_bundles", "registry_changed"} {
		if strings.HasPrefix(reason, p) {
			return true
		}
	}
	return false
}

func registryDiff(have, want *check.Set) string {
	ids := func(s *check.Set) []string {
		var out []string
		for _, d := range s.Registry.Devices {
			out = append(out, d.ID)
		}
		return out
	}
	h, w := ids(have), ids(want)
	var added, gone []string
	for _, id := range w {
		if !slices.Contains(h, id) {
			added = append(added, id)
		}
	}
	for _, id := range h {
		if !slices.Contains(w, id) {
			gone = append(gone, id)
		}
	}
	if len(added)+len(gone) == 0 {
		return "same devices, other settings"
	}
	return fmt.Sprintf("adds %v, drops %v", added, gone)
}

// missingDevices are the registry's devices a heartbeat's inventory
// leaves out (none when it lists none: an agent with no inventory).
func missingDevices(set *check.Set, inv []uplink.DeviceState) []string {
	if len(inv) == 0 {
		return nil
	}
	var out []string
	for _, d := range set.Registry.Devices {
		if !slices.ContainsFunc(inv, func(s uplink.DeviceState) bool { return s.ID == d.ID }) {
			out = append(out, d.ID)
		}
	}
	return out
}

// spread orders targets so that each stage is a fair sample, the same
// for the same rollout ID on every replica and after a restart.
func spread(id string, gws []string) {
	key := func(gw string) string {
		s := sha256.Sum256([]byte(id + "\x00" + gw))
		return string(s[:])
	}
	slices.SortFunc(gws, func(a, b string) int { return strings.Compare(key(a), key(b)) })
}
