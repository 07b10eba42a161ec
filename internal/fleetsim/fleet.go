package fleetsim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sortie-edge/sortie/bundle"
	"github.com/sortie-edge/sortie/driver"
)

// Fault is what goes wrong on one gateway; faults combine.
type Fault uint8

// The faults a gateway may have.
const (
	// FaultOffline: the gateway never connects (until Gateway.SetOnline).
	FaultOffline Fault = 1 << iota
	// FaultRegistry: its devices.toml differs from the fleet's (another
	// building's), so a bundle carrying the fleet's would replace it; a
	// hub's pre-flight refuses it there (registry_changed), the gateway
	// itself would take it, as an agent that swaps registries does.
	FaultRegistry
	// FaultDevicesSilent: none of its devices ever answers, so a bundle
	// that changes a scene reverts at the end of its soak
	// (devices_silent).
	FaultDevicesSilent
	// FaultUplinkCut: its hub connection drops, without a goodbye, right
	// after it applies a bundle, and comes back only once the trial is
	// decided: the bundle reverts at the end of the confirm window
	// (uplink_down).
	FaultUplinkCut
	// FaultDrift: its config files were edited by hand: its heartbeat's
	// config.files names another hash.
	FaultDrift
	// FaultSlow: it answers each control after a delay, 50 to 500 ms,
	// chosen per gateway.
	FaultSlow
	// FaultLossy: it loses control requests and their results, each with
	// probability Faults.LossRate.
	FaultLossy
)

var faultNames = []string{"offline", "registry", "devices_silent", "uplink_cut", "drift", "slow", "lossy"}

func (f Fault) String() string {
	if f == 0 {
		return "none"
	}
	s := ""
	for i, n := range faultNames {
		if f&(1<<i) != 0 {
			if s != "" {
				s += "+"
			}
			s += n
		}
	}
	return s
}

// Faults are the fractions of the fleet (0 to 1) given each fault,
// chosen by Options.Seed; the counts are rounded, and the gateways of
// one fault are chosen independently of another's.
type Faults struct {
	Offline, Registry, DevicesSilent, UplinkCut, Drift, Slow, Lossy float64
	// LossRate is the probability that a lossy gateway loses a control
	// request or a result (default 0.3).
	LossRate float64
}

func (f Faults) fractions() []float64 {
	return []float64{f.Offline, f.Registry, f.DevicesSilent, f.UplinkCut, f.Drift, f.Slow, f.Lossy}
}

// Defaults for Options.
const (
	DefaultHeartbeat  = 30 * time.Second
	DefaultSoak       = time.Minute
	DefaultConfirm    = 5 * time.Minute
	DefaultVersion    = "v1.0.0"
	DefaultIDPrefix   = "sim-"
	DefaultConnecting = 64
	defaultLossRate   = 0.3
)

// ErrOptions wraps every invalid-options error of New.
var ErrOptions = errors.New("invalid fleet options")

// Options configures a Fleet. Broker and Gateways (or IDs) are required.
type Options struct {
	// Broker is the hub broker's URL.
	Broker string
	// Prefix is the hub's topic prefix; empty means uplink.DefaultPrefix.
	Prefix string
	// Gateways is how many gateways to run, named IDPrefix followed by a
	// five-digit number from 00000; IDs, when set, names them instead.
	Gateways int
	IDPrefix string
	IDs      []string
	// Password returns a gateway's password on the hub broker (its user
	// name is its ID); nil connects without credentials.
	Password func(gateway string) string
	// NoRetain publishes the presence not retained (a hub in the cluster
	// mode).
	NoRetain bool
	// Files is the bundle every gateway's config files make: what it runs
	// until a hub's bundle is kept. Default: DefaultFiles.
	Files *bundle.Bundle
	// Registry is the devices.toml of the gateways with FaultRegistry;
	// default: Files' with a line added (another registry to the agent's
	// byte-for-byte comparison).
	Registry []byte
	// SilentDevices never answer on any gateway: a bundle whose changed
	// scenes use one reverts everywhere (devices_silent).
	SilentDevices []string
	// Version is the agent version the gateways claim (min_agent is
	// checked against it). Default DefaultVersion.
	Version string
	// Heartbeat, Soak and Confirm are the agent's hub heartbeat
	// interval and [bundles] soak and confirm (a hub's soak_seconds
	// overrides Soak).
	Heartbeat, Soak, Confirm time.Duration
	// Faults chooses faulty gateways by fraction; Gateway.SetFault
	// changes one.
	Faults Faults
	// Seed chooses the faulty gateways, the slow ones' delays and what
	// lossy ones lose; 0 picks one (Fleet.Seed says which).
	Seed uint64
	// Clock times heartbeats and trials; default the system's.
	Clock driver.Clock
	// Connecting bounds the connection attempts Start makes at once
	// (default DefaultConnecting); each gateway then reconnects by itself.
	Connecting int
	// Logger receives the fleet's logs; nil discards them.
	Logger *slog.Logger
}

func (o *Options) withDefaults() error {
	if o.Broker == "" {
		return fmt.Errorf("%w: no broker URL", ErrOptions)
	}
	if len(o.IDs) == 0 {
		if o.Gateways <= 0 {
			return fmt.Errorf("%w: no gateways", ErrOptions)
		}
		if o.IDPrefix == "" {
			o.IDPrefix = DefaultIDPrefix
		}
		o.IDs = make([]string, o.Gateways)
		for i := range o.IDs {
			o.IDs[i] = fmt.Sprintf("%s%05d", o.IDPrefix, i)
		}
	}
	seen := make(map[string]bool, len(o.IDs))
	for _, id := range o.IDs {
		if err := driver.ValidateID("gateway", id); err != nil {
			return fmt.Errorf("%w: %w", ErrOptions, err)
		}
		if seen[id] {
			return fmt.Errorf("%w: gateway %q twice", ErrOptions, id)
		}
		seen[id] = true
	}
	for i, f := range o.Faults.fractions() {
		if !(f >= 0 && f <= 1) {
			return fmt.Errorf("%w: fault %s fraction %v is not between 0 and 1", ErrOptions, faultNames[i], f)
		}
	}
	if !(o.Faults.LossRate >= 0 && o.Faults.LossRate <= 1) {
		return fmt.Errorf("%w: loss rate %v is not between 0 and 1", ErrOptions, o.Faults.LossRate)
	}
	if o.Faults.LossRate == 0 {
		o.Faults.LossRate = defaultLossRate
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.Heartbeat, DefaultHeartbeat)
	def(&o.Soak, DefaultSoak)
	def(&o.Confirm, DefaultConfirm)
	if o.Version == "" {
		o.Version = DefaultVersion
	}
	if o.Seed == 0 {
		o.Seed = rand.Uint64()
	}
	if o.Clock == nil {
		o.Clock = driver.SystemClock{}
	}
	if o.Connecting <= 0 {
		o.Connecting = DefaultConnecting
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Fleet is a set of light gateways. Create it with New, connect it with
// Start, stop it with Close.
type Fleet struct {
	opts  Options
	log   *slog.Logger
	known *cache
	// files and other are the two configurations gateways start on.
	files, other *known
	silent       map[string]bool

	gws  []*Gateway
	byID map[string]*Gateway

	rngMu sync.Mutex
	rng   *rand.Rand

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // gateways' control workers and timers' work

	connected atomic.Int64
	stats     counters
}

// counters are the fleet's totals (Stats).
type counters struct {
	heartbeats, statuses, controls, repeats, lost atomic.Uint64
}

// New checks opts and builds the fleet; nothing connects until Start.
func New(opts Options) (*Fleet, error) {
	if err := opts.withDefaults(); err != nil {
		return nil, err
	}
	f := &Fleet{opts: opts, log: opts.Logger.With("component", "fleetsim"), known: newCache(),
		rng: rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x9e3779b97f4a7c15)), silent: map[string]bool{}}
	for _, d := range opts.SilentDevices {
		f.silent[d] = true
	}
	files := opts.Files
	if files == nil {
		var err error
		if files, err = DefaultFiles(); err != nil {
			return nil, err
		}
	}
	var err error
	if f.files, err = f.known.of(files); err != nil {
		return nil, fmt.Errorf("%w: the files bundle: %w", ErrOptions, err)
	}
	if f.other, err = f.known.of(otherRegistry(files, opts.Registry)); err != nil {
		return nil, fmt.Errorf("%w: the other registry: %w", ErrOptions, err)
	}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	f.byID = make(map[string]*Gateway, len(opts.IDs))
	faults := f.chooseFaults(len(opts.IDs))
	now := opts.Clock.Now()
	for i, id := range opts.IDs {
		g := newGateway(f, id, faults[i], now)
		f.gws = append(f.gws, g)
		f.byID[id] = g
	}
	return f, nil
}

// chooseFaults gives each fault to its fraction of n gateways.
func (f *Fleet) chooseFaults(n int) []Fault {
	out := make([]Fault, n)
	for i, frac := range f.opts.Faults.fractions() {
		k := int(math.Round(frac * float64(n)))
		for _, j := range f.rng.Perm(n)[:k] {
			out[j] |= 1 << i
		}
	}
	return out
}

// otherRegistry is files with another devices.toml: reg, or files' own
// with a comment added.
func otherRegistry(files *bundle.Bundle, reg []byte) *bundle.Bundle {
	fs := make([]bundle.File, len(files.Files))
	copy(fs, files.Files)
	for i := range fs {
		if fs[i].Path != bundle.RegistryFile {
			continue
		}
		if reg == nil {
			reg = append(append([]byte(nil), fs[i].Data...), "\n# this gateway's own registry\n"...)
		}
		fs[i].Data = reg
	}
	b, err := bundle.New(files.MinAgent, fs)
	if err != nil {
		return files
	}
	return b
}

// Seed is the seed the fleet's choices came from.
func (f *Fleet) Seed() uint64 { return f.opts.Seed }

// Files is the hash of the bundle the gateways' config files make (the
// gateways with FaultRegistry aside).
func (f *Fleet) Files() string { return f.files.hash }

// Gateways returns every gateway, in the order of Options.IDs.
func (f *Fleet) Gateways() []*Gateway { return f.gws }

// Gateway returns the gateway named id, or nil.
func (f *Fleet) Gateway(id string) *Gateway { return f.byID[id] }

// With returns the gateways that have every fault of mask.
func (f *Fleet) With(mask Fault) []*Gateway {
	var out []*Gateway
	for _, g := range f.gws {
		if g.Fault()&mask == mask {
			out = append(out, g)
		}
	}
	return out
}

// Start connects every gateway but the offline ones, at most
// Options.Connecting attempts at a time, and returns once each has
// connected or ctx ends; gateways not yet connected keep trying.
func (f *Fleet) Start(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(f.opts.Connecting)
	for _, gw := range f.gws {
		if gw.Fault()&FaultOffline != 0 {
			continue
		}
		g.Go(func() error { return gw.start(ctx) })
	}
	return g.Wait()
}

// Beat makes every connected gateway send a heartbeat now, besides
// its periodic ones, at most Options.Connecting at a time; it returns
// how many went out.
func (f *Fleet) Beat(ctx context.Context) int {
	var n atomic.Int64
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(f.opts.Connecting)
	for _, gw := range f.gws {
		if ctx.Err() != nil {
			break
		}
		g.Go(func() error {
			if gw.beatNow() {
				n.Add(1)
			}
			return nil
		})
	}
	_ = g.Wait() // the workers return no error
	return int(n.Load())
}

// Connected is how many gateways are connected now.
func (f *Fleet) Connected() int { return int(f.connected.Load()) }

// Stats are the fleet's totals since New.
type Stats struct {
	Connected  int
	Heartbeats uint64 // heartbeats published
	Statuses   uint64 // bundle statuses published, repeats included
	Controls   uint64 // control requests answered (repeats included)
	Repeats    uint64 // of them, answered from memory
	Lost       uint64 // messages a lossy gateway lost
}

// Stats returns the fleet's totals.
func (f *Fleet) Stats() Stats {
	return Stats{Connected: f.Connected(), Heartbeats: f.stats.heartbeats.Load(), Statuses: f.stats.statuses.Load(),
		Controls: f.stats.controls.Load(), Repeats: f.stats.repeats.Load(), Lost: f.stats.lost.Load()}
}

// Close disconnects every gateway, each saying goodbye (its offline
// status) first, and waits for their work to end.
func (f *Fleet) Close() {
	f.cancel()
	var g errgroup.Group
	g.SetLimit(256)
	for _, gw := range f.gws {
		g.Go(func() error { gw.close(); return nil })
	}
	_ = g.Wait() // close returns no error
	f.wg.Wait()
}

// chance draws a number in [0, 1) from the fleet's seeded source.
func (f *Fleet) chance() float64 {
	f.rngMu.Lock()
	defer f.rngMu.Unlock()
	return f.rng.Float64()
}

// slowDelay draws a slow gateway's delay.
func (f *Fleet) slowDelay() time.Duration {
	f.rngMu.Lock()
	defer f.rngMu.Unlock()
	return 50*time.Millisecond + time.Duration(f.rng.Int64N(int64(450*time.Millisecond)))
}
