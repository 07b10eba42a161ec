package hub

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/sortie-edge/sortie/bundle"
	"github.com/sortie-edge/sortie/bundle/check"
	"github.com/sortie-edge/sortie/driver"
)

// PushBundle stores a bundle given as its canonical encoding, in group
// ("" DefaultGroup), after validating it with the agent's rules
// (bundle/check): a bundle an agent would reject is refused here, with
// every problem named. Pushing the group's latest bundle again returns
// its release (created false).
func (f *Fleet) PushBundle(ctx context.Context, group string, encoded []byte) (Release, bool, error) {
	if group == "" {
		group = DefaultGroup
	}
	if err := driver.CheckID("group", group); err != nil {
		return Release{}, false, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	b, err := bundle.Decode(encoded)
	if err != nil {
		return Release{}, false, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	set, err := check.Bundle(b)
	if err != nil {
		return Release{}, false, fmt.Errorf("%w: the bundle does not validate with the agent's rules: %w", ErrInvalid, err)
	}
	info := BundleInfo{Hash: set.Hash, MinAgent: b.MinAgent, Size: len(encoded), Pushed: f.o.Now()}
	for _, file := range b.Files {
		info.Files = append(info.Files, file.Path)
	}
	rel, created, err := f.st.PutBundle(ctx, group, info, encoded, f.o.Now())
	if err != nil {
		return Release{}, false, err
	}
	f.mu.Lock()
	f.sets[set.Hash] = set
	f.mu.Unlock()
	return rel, created, nil
}

// StartRollout starts a rollout of a release to the gateways spec
// targets; a rollout of the same group still active (or following)
// is superseded. The rollout is written before it returns; its canary
// goes out at the next Step.
func (f *Fleet) StartRollout(ctx context.Context, spec RolloutSpec) (RolloutView, error) {
	spec.defaults()
	if err := spec.check(); err != nil {
		return RolloutView{}, err
	}
	rel, err := f.release(ctx, spec.Group, spec.Version)
	if err != nil {
		return RolloutView{}, err
	}
	if _, err := f.bundleSetLocked(ctx, rel.Hash); err != nil {
		return RolloutView{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.loaded {
		return RolloutView{}, ErrNotLeader
	}
	now := f.o.Now()
	targets, err := f.resolve(spec)
	if err != nil {
		return RolloutView{}, err
	}
	f.nextID++
	r := &Rollout{ID: fmt.Sprintf("r-%d", f.nextID), Spec: spec, Version: rel.Version, Hash: rel.Hash, State: RolloutRunning,
		Created: now, Updated: now, Deadline: now.Add(spec.Deadline.D())}
	spread(r.ID, targets)
	r.Stages = spec.stages(len(targets))
	run := &rolloutRun{r: r, byGW: map[string]*RolloutGateway{}}
	var olds []runSnapshot
	stage := 0
	for i, gw := range targets {
		for i >= r.Stages[stage] {
			stage++
		}
		t := &RolloutGateway{Rollout: r.ID, Gateway: gw, Order: i, Stage: stage, Status: TargetPending, Version: rel.Version, Updated: now}
		run.targets = append(run.targets, t)
		run.byGW[gw] = t
		f.dirtyT[t] = true
	}
	for _, old := range f.order {
		if old.r.Spec.Group != spec.Group {
			continue
		}
		if old.r.active() || old.r.Following {
			olds = append(olds, f.snapshot(old))
		}
		switch {
		case old.r.active():
			f.end(old, now, RolloutSuperseded, "superseded by "+r.ID)
		case old.r.Following:
			old.r.Following = false
			f.touch(old, now)
		}
	}
	f.runs[r.ID] = run
	f.order = append(f.order, run)
	f.dirtyR[r] = true
	out, err := f.saveLocked(ctx)
	if err != nil {
		// Not started: the rollouts it superseded go on as they were.
		for _, o := range olds {
			f.restore(o)
		}
		delete(f.runs, r.ID)
		f.order = f.order[:len(f.order)-1]
		delete(f.dirtyR, r)
		for _, t := range run.targets {
			delete(f.dirtyT, t)
		}
		// A write that failed may yet have committed (PostgreSQL's answer
		// lost): the next write deletes it then.
		f.forget = append(f.forget, r.ID)
		return RolloutView{}, err
	}
	f.out = append(f.out, out...) // nothing is sent from here: Step sends
	f.log.Info("rollout started", "rollout", r.ID, "group", spec.Group, "version", rel.Version, "hash", bundle.Short(rel.Hash), "targets", len(targets), "stages", r.Stages)
	f.poke()
	return f.viewLocked(run, true), nil
}

func (f *Fleet) poke() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// release finds the release a rollout sends: the version asked for, or
// the group's latest push.
func (f *Fleet) release(ctx context.Context, group string, version uint64) (Release, error) {
	rels, err := f.st.Releases(ctx, group)
	if err != nil {
		return Release{}, err
	}
	for _, r := range rels {
		if version == 0 && r.Kind == ReleasePush || version != 0 && r.Version == version {
			return r, nil
		}
	}
	if version == 0 {
		return Release{}, fmt.Errorf("%w: group %q has no bundle (hub bundle push DIR -group %s)", ErrNotFound, group, group)
	}
	return Release{}, fmt.Errorf("%w: group %q has no version %d", ErrNotFound, group, version)
}

func (f *Fleet) bundleSetLocked(ctx context.Context, hash string) (*check.Set, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bundleSet(ctx, hash)
}

// resolve lists a spec's targets: IDs (each must be known), a tag, or
// every gateway known.
func (f *Fleet) resolve(spec RolloutSpec) ([]string, error) {
	if len(spec.Gateways) > 0 {
		var unknown []string
		for _, gw := range spec.Gateways {
			if _, ok := f.seen[gw]; !ok && f.gws[gw] == nil {
				unknown = append(unknown, gw)
			}
		}
		if len(unknown) > 0 {
			return nil, fmt.Errorf("%w: %s", ErrUnknownGateway, strings.Join(unknown, ", "))
		}
		out := slices.Clone(spec.Gateways)
		slices.Sort(out)
		return slices.Compact(out), nil
	}
	var out []string
	for gw := range f.known() {
		if spec.Tag == "" || slices.Contains(f.gws[gw].tags(), spec.Tag) {
			out = append(out, gw)
		}
	}
	slices.Sort(out)
	if len(out) == 0 && !spec.Continuous {
		return nil, fmt.Errorf("%w: no gateway has tag %q", ErrInvalid, spec.Tag)
	}
	return out, nil
}

func (f *Fleet) known() map[string]bool {
	out := map[string]bool{}
	for gw := range f.seen {
		out[gw] = true
	}
	for gw := range f.gws {
		out[gw] = true
	}
	return out
}

func (f *Fleet) runOf(id string) (*rolloutRun, error) {
	run := f.runs[id]
	if run == nil {
		return nil, fmt.Errorf("%w: rollout %q", ErrNotFound, id)
	}
	return run, nil
}

// control runs an operator's change of one rollout and writes it.
func (f *Fleet) control(ctx context.Context, id string, change func(run *rolloutRun, now time.Time) error) (RolloutView, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.loaded {
		return RolloutView{}, ErrNotLeader
	}
	run, err := f.runOf(id)
	if err != nil {
		return RolloutView{}, err
	}
	snap := f.snapshot(run)
	if err := change(run, f.o.Now()); err != nil {
		f.restore(snap)
		return RolloutView{}, err
	}
	out, err := f.saveLocked(ctx)
	if err != nil {
		// The operator is told it failed: then it did not happen, and the
		// engine does not act on it now or write it later.
		f.restore(snap)
		return RolloutView{}, err
	}
	f.out = append(f.out, out...)
	f.poke()
	return f.viewLocked(run, false), nil
}

// runSnapshot is a rollout's records as they were before an operator's
// change, put back when the change cannot be written.
type runSnapshot struct {
	run     *rolloutRun
	check   bool
	r       Rollout
	targets []RolloutGateway
}

func (f *Fleet) snapshot(run *rolloutRun) runSnapshot {
	s := runSnapshot{run: run, check: run.check, r: *run.r, targets: make([]RolloutGateway, len(run.targets))}
	s.r.Rollback = maps.Clone(run.r.Rollback)
	s.r.Stages = slices.Clone(run.r.Stages)
	for i, t := range run.targets {
		s.targets[i] = *t
	}
	return s
}

// restore puts a snapshot back. Its records stay marked to write: a
// write that failed may yet have committed (PostgreSQL's answer lost),
// and the next write then puts the store back as memory holds it.
func (f *Fleet) restore(s runSnapshot) {
	run := s.run
	run.check = s.check
	*run.r = s.r
	f.dirtyR[run.r] = true
	for i, t := range run.targets[:len(s.targets)] {
		*t = s.targets[i]
		f.dirtyT[t] = true
	}
}

// Pause stops a running rollout from notifying more gateways; what
// was sent is still followed, and the deadline still ends it.
func (f *Fleet) Pause(ctx context.Context, id string) (RolloutView, error) {
	return f.control(ctx, id, func(run *rolloutRun, now time.Time) error {
		if run.r.State != RolloutRunning {
			return fmt.Errorf("%w: rollout %s is %s", ErrInvalid, id, run.r.State)
		}
		run.r.State, run.r.Reason = RolloutPaused, "paused by the operator"
		f.touch(run, now)
		return nil
	})
}

// Resume goes on with a paused rollout. A stage the pre-flight check
// held is checked again; with skip, the gateways it still refuses are
// left out (skipped) and the others go on.
func (f *Fleet) Resume(ctx context.Context, id string, skip bool) (RolloutView, error) {
	return f.control(ctx, id, func(run *rolloutRun, now time.Time) error {
		r := run.r
		if r.State != RolloutPaused {
			return fmt.Errorf("%w: rollout %s is %s", ErrInvalid, id, r.State)
		}
		if skip && r.StageStarted.IsZero() {
			f.preflight(run, now)
			for _, t := range run.targets {
				if t.Stage == r.Stage && t.Status == TargetPending && t.Refused != "" {
					t.Status, t.Updated = TargetSkipped, now
					f.dirtyT[t] = true
				}
			}
		}
		r.State, r.Reason = RolloutRunning, ""
		f.touch(run, now)
		return nil
	})
}

// Abort aborts a running or paused rollout: the gateways that took its
// bundle are rolled back.
func (f *Fleet) Abort(ctx context.Context, id string) (RolloutView, error) {
	return f.control(ctx, id, func(run *rolloutRun, now time.Time) error {
		if run.r.State != RolloutRunning && run.r.State != RolloutPaused {
			return fmt.Errorf("%w: rollout %s is %s", ErrInvalid, id, run.r.State)
		}
		f.abort(run, now, "aborted by the operator")
		f.advanceBack(run, now) // nothing to roll back ends it at once
		return nil
	})
}

// SetTags replaces a gateway's tags (the hub's own: the agent reports
// none); a continuous rollout of one of them takes it in.
func (f *Fleet) SetTags(ctx context.Context, gw string, tags []string) (FleetGateway, error) {
	if err := driver.CheckID("gateway", gw); err != nil {
		return FleetGateway{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	for _, t := range tags {
		if err := driver.CheckID("tag", t); err != nil {
			return FleetGateway{}, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.loaded {
		return FleetGateway{}, ErrNotLeader
	}
	if _, ok := f.known()[gw]; !ok {
		return FleetGateway{}, fmt.Errorf("%w: %q", ErrUnknownGateway, gw)
	}
	fg := f.fleetGateway(gw)
	was := fg.Tags
	fg.Tags = slices.Compact(slices.Sorted(slices.Values(tags)))
	f.dirtyG[fg] = true
	out, err := f.saveLocked(ctx)
	if err != nil {
		fg.Tags = was // still marked: see restore
		return FleetGateway{}, err
	}
	f.out = append(f.out, out...)
	// The tags are written: a continuous rollout taking the gateway in
	// is the engine's own change from here, written by its next step if
	// not now.
	f.joinContinuous(gw, f.o.Now())
	out, err = f.saveLocked(ctx)
	if err != nil {
		f.log.Warn("rollouts: write state; the next step tries again", "err", err)
	}
	f.out = append(f.out, out...)
	f.poke()
	return *fg, nil
}

// SetGroup sets a group's drift policy (alert, adopt or revert).
func (f *Fleet) SetGroup(ctx context.Context, g Group) (Group, error) {
	if err := driver.CheckID("group", g.Name); err != nil {
		return Group{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	switch g.DriftPolicy {
	case DriftAlert, DriftAdopt, DriftRevert:
	default:
		return Group{}, fmt.Errorf("%w: drift_policy %q: alert, adopt or revert", ErrInvalid, g.DriftPolicy)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.loaded {
		return Group{}, ErrNotLeader
	}
	p := f.groups[g.Name]
	if p == nil {
		p = &Group{Name: g.Name}
		f.groups[g.Name] = p
	}
	was := *p
	p.DriftPolicy = g.DriftPolicy
	f.dirtyP[p] = true
	out, err := f.saveLocked(ctx)
	if err != nil {
		*p = was // still marked: see restore
		return Group{}, err
	}
	f.out = append(f.out, out...)
	return *p, nil
}

// Groups lists the groups with settings, and those of the releases.
func (f *Fleet) Groups(ctx context.Context) ([]Group, error) {
	rels, err := f.st.Releases(ctx, "")
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	names := map[string]bool{}
	for _, r := range rels {
		names[r.Group] = true
	}
	for n := range f.groups {
		names[n] = true
	}
	var out []Group
	for _, n := range slices.Sorted(func(yield func(string) bool) {
		for n := range names {
			if !yield(n) {
				return
			}
		}
	}) {
		out = append(out, Group{Name: n, DriftPolicy: f.policy(n)})
	}
	return out, nil
}

// RolloutView is a rollout with its counts by status (and, when asked,
// its gateways): GET /api/rollouts/{id}.
type RolloutView struct {
	Rollout
	// Counts are the targets by status, and by rollback status under
	// "rollback_" + status.
	Counts   map[string]int    `json:"counts"`
	Targets  int               `json:"targets"`
	Gateways []*RolloutGateway `json:"gateways,omitempty"`
	// A page (rolloutpage.go): the targets by kind, by stage and kind,
	// and over time; how many match the page's filter, and the after=
	// of the next page ("" at the end).
	Kinds      map[string]int   `json:"kinds,omitempty"`
	StageKinds []map[string]int `json:"stage_kinds,omitempty"`
	Progress   *RolloutProgress `json:"progress,omitempty"`
	Matched    int              `json:"matched,omitempty"`
	Next       string           `json:"next,omitempty"`
}

func (f *Fleet) viewLocked(run *rolloutRun, gateways bool) RolloutView {
	v := RolloutView{Rollout: *run.r, Counts: map[string]int{}, Targets: len(run.targets)}
	v.Stages = slices.Clone(run.r.Stages)
	for _, t := range run.targets {
		v.Counts[t.Status]++
		if t.Back != "" {
			v.Counts["rollback_"+t.Back]++
		}
		if t.Refused != "" && t.Status == TargetPending {
			v.Counts["refused"]++
		}
		if gateways {
			c := *t
			v.Gateways = append(v.Gateways, &c)
		}
	}
	return v
}

// Rollout returns one rollout, with its gateways.
func (f *Fleet) Rollout(id string) (RolloutView, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	run, err := f.runOf(id)
	if err != nil {
		return RolloutView{}, err
	}
	return f.viewLocked(run, true), nil
}

// Rollouts lists the rollouts, newest first, without their gateways.
func (f *Fleet) Rollouts() []RolloutView {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]RolloutView, 0, len(f.order))
	for i := len(f.order) - 1; i >= 0; i-- {
		out = append(out, f.viewLocked(f.order[i], false))
	}
	return out
}

// Gateways lists what the hub knows of each gateway's configuration,
// drift included, by ID.
func (f *Fleet) Gateways() []FleetGateway {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]FleetGateway, 0, len(f.gws))
	for _, g := range f.gws {
		out = append(out, *g)
	}
	slices.SortFunc(out, func(a, b FleetGateway) int { return strings.Compare(a.Gateway, b.Gateway) })
	return out
}
