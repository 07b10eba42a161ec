package hub

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The fleet at a glance (docs/hub.md, "The fleet at a glance"): the
// gateways counted by state on the hub, the gateways list paged and
// filtered here, and the worst gateways and scenes by failure rate
// (rank.go). A dashboard of 10,000 gateways reads counts and pages,
// never every gateway.

// Gateway states the glance counts and the gateways list filters by.
// A gateway is in one presence state (StateOnline, StateOffline,
// StateUnknown) and any number of the conditions.
const (
	// CondBacklog: its last heartbeat reported outbox entries not yet
	// acknowledged.
	CondBacklog = "backlog"
	// CondDrifted: it runs another configuration than the hub expects
	// (FleetGateway.Drifted).
	CondDrifted = "drifted"
	// CondRollout: a target of an active rollout without an outcome yet
	// (pending, offered, on trial, or being rolled back).
	CondRollout = "rollout"
	// CondRolloutFailed: the newest rollout that targeted it failed on
	// it (its bundle, or its rollback).
	CondRolloutFailed = "rollout_failed"
)

// glanceStates are the values of the state filter, presence first.
var glanceStates = []string{StateOnline, StateOffline, StateUnknown, CondBacklog, CondDrifted, CondRollout, CondRolloutFailed}

// gatewayFacts is what the rollout engine knows of a gateway.
type gatewayFacts struct {
	tags          []string
	drifted       bool
	rollout       bool
	rolloutFailed bool
}

// facts returns, per gateway the engine knows, its tags, drift, and
// where it stands in the newest rollout that targeted it.
func (f *Fleet) facts() map[string]gatewayFacts {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]gatewayFacts, len(f.gws))
	for id, g := range f.gws {
		out[id] = gatewayFacts{tags: g.Tags, drifted: g.Drifted}
	}
	type newest struct {
		t      *RolloutGateway
		active bool
	}
	last := map[string]newest{}
	// Newest rollout first, each gateway's first target kept: the
	// newest rollout of a whole fleet answers for all of it, and the
	// kept history (each with every gateway) is not read under mu.
	known := len(f.known())
	for i := len(f.order) - 1; i >= 0 && len(last) < known; i-- {
		run := f.order[i]
		for _, t := range run.targets {
			if _, ok := last[t.Gateway]; !ok {
				last[t.Gateway] = newest{t, run.r.active()}
			}
		}
	}
	for gw, n := range last {
		x := out[gw]
		x.rolloutFailed = n.t.Status == TargetFailed || n.t.Back == BackFailed
		x.rollout = n.active && (!n.t.ended() || n.t.Back != "" && !n.t.backEnded())
		out[gw] = x
	}
	return out
}

// conditions lists the conditions of a gateway of brief g.
func conditions(g GatewayBrief, x gatewayFacts) []string {
	var out []string
	if g.Backlog > 0 {
		out = append(out, CondBacklog)
	}
	if x.drifted {
		out = append(out, CondDrifted)
	}
	if x.rollout {
		out = append(out, CondRollout)
	}
	if x.rolloutFailed {
		out = append(out, CondRolloutFailed)
	}
	return out
}

// glanceFacts reads the engine's facts, or none on a hub without one.
func (a *API) glanceFacts(ctx context.Context) (map[string]gatewayFacts, bool, error) {
	fl := a.fleet()
	if fl == nil {
		return nil, false, nil
	}
	if fl.Leading() {
		return fl.facts(), true, nil
	}
	// A replica that does not drive reads the engine's state from the
	// store for it: at most every 5 s, not at every page of every
	// dashboard.
	now := time.Now()
	if x, ok := a.facts.get("", now); ok {
		return x, true, nil
	}
	rd, err := fl.reader(ctx)
	if err != nil {
		return nil, false, err
	}
	x := rd.facts()
	a.facts.put("", now, x)
	return x, true, nil
}

// FleetOverview is the body of GET /api/fleet/overview.
type FleetOverview struct {
	Gateways int `json:"gateways"`
	// States counts the gateways by presence: online, offline, unknown
	// (never reported); they add up to Gateways.
	States map[string]int `json:"states"`
	// Conditions counts the gateways with a backlog, drifted, in an
	// active rollout, or failed by their newest rollout: a gateway may
	// be in several, or none.
	Conditions map[string]int `json:"conditions"`
	// Tags counts the gateways by hub tag.
	Tags map[string]int `json:"tags"`
	// Rollouts says whether the hub keeps rollouts: without, drift and
	// rollouts are not counted.
	Rollouts bool      `json:"rollouts"`
	At       time.Time `json:"at"`
}

func (a *API) glanceRoutes() {
	a.mux.HandleFunc("/api/fleet/overview", a.auth(a.method(http.MethodGet, a.fleetOverview)))
	a.mux.HandleFunc("/api/fleet/worst", a.auth(a.method(http.MethodGet, a.fleetWorst)))
}

func (a *API) fleetOverview(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	if o, ok := a.overview.get("", now); ok {
		writeJSON(w, http.StatusOK, o)
		return
	}
	gws, err := a.st.GatewayBriefs(r.Context())
	if err != nil {
		a.fail(w, r, err)
		return
	}
	facts, rollouts, err := a.glanceFacts(r.Context())
	if err != nil {
		a.fail(w, r, err)
		return
	}
	o := FleetOverview{Gateways: len(gws), States: map[string]int{StateOnline: 0, StateOffline: 0, StateUnknown: 0},
		Conditions: map[string]int{CondBacklog: 0, CondDrifted: 0, CondRollout: 0, CondRolloutFailed: 0}, Tags: map[string]int{},
		Rollouts: rollouts, At: a.svc.Now().UTC()}
	for _, g := range gws {
		o.States[presenceState(g.State)]++
		x := facts[g.ID]
		for _, c := range conditions(g, x) {
			o.Conditions[c]++
		}
		for _, t := range x.tags {
			o.Tags[t]++
		}
	}
	a.overview.put("", now, o)
	writeJSON(w, http.StatusOK, o)
}

// presenceState is a gateway's state as counted: online, offline or
// unknown.
func presenceState(state string) string {
	switch state {
	case StateOnline, StateOffline:
		return state
	}
	return StateUnknown
}

// gatewayFilter is what GET /api/gateways takes: state, tag, an ID
// substring (q), and a page (limit, after an ID). Without limit every
// match is answered, as before the list was paged.
type gatewayFilter struct {
	state, tag, q, after string
	limit                int
}

// maxGatewayPage caps a page of gateways.
const maxGatewayPage = 1000

func parseGatewayFilter(v url.Values) (gatewayFilter, error) {
	f := gatewayFilter{state: v.Get("state"), tag: v.Get("tag"), q: v.Get("q"), after: v.Get("after")}
	if f.state != "" && !slices.Contains(glanceStates, f.state) {
		return f, fmt.Errorf("%w: state %q is not one of %s", ErrInvalid, f.state, strings.Join(glanceStates, ", "))
	}
	if s := v.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxGatewayPage {
			return f, fmt.Errorf("%w: limit must be 1..%d", ErrInvalid, maxGatewayPage)
		}
		f.limit = n
	}
	return f, nil
}

func (f gatewayFilter) match(g GatewayBrief, x gatewayFacts) bool {
	if f.q != "" && !strings.Contains(strings.ToLower(g.ID), strings.ToLower(f.q)) {
		return false
	}
	if f.tag != "" && !slices.Contains(x.tags, f.tag) {
		return false
	}
	switch f.state {
	case "":
		return true
	case StateOnline, StateOffline, StateUnknown:
		return presenceState(g.State) == f.state
	}
	return slices.Contains(conditions(g, x), f.state)
}

// GatewayPage is the body of GET /api/gateways: the gateways of the
// page, by ID; Total counts every gateway that matches the filter, Next
// is the after= of the next page ("" at the end).
type GatewayPage struct {
	Gateways []GatewayView `json:"gateways"`
	Total    int           `json:"total"`
	Next     string        `json:"next,omitempty"`
}

func (a *API) gateways(w http.ResponseWriter, r *http.Request) {
	f, err := parseGatewayFilter(r.URL.Query())
	if err != nil {
		a.fail(w, r, err)
		return
	}
	// The filter and the count read the briefs; only the page's
	// gateways are read whole.
	gws, err := a.st.GatewayBriefs(r.Context())
	if err != nil {
		a.fail(w, r, err)
		return
	}
	facts, _, err := a.glanceFacts(r.Context())
	if err != nil {
		a.fail(w, r, err)
		return
	}
	slices.SortFunc(gws, func(x, y GatewayBrief) int { return strings.Compare(x.ID, y.ID) })
	p := GatewayPage{Gateways: []GatewayView{}}
	var page []string
	for _, g := range gws {
		if !f.match(g, facts[g.ID]) {
			continue
		}
		p.Total++
		if f.after != "" && g.ID <= f.after {
			continue
		}
		if f.limit > 0 && len(page) == f.limit {
			p.Next = page[len(page)-1]
			continue
		}
		page = append(page, g.ID)
	}
	if len(page) > 0 {
		recs, err := a.st.GatewaysByID(r.Context(), page)
		if err != nil {
			a.fail(w, r, err)
			return
		}
		// Missions failed in the last 24 hours, by when they finished.
		failed, err := a.st.FailedSince(r.Context(), a.svc.Now().Add(-24*time.Hour), page)
		if err != nil {
			a.fail(w, r, err)
			return
		}
		for _, g := range recs {
			x := facts[g.ID]
			p.Gateways = append(p.Gateways, GatewayView{Gateway: g, Failed24h: failed[g.ID], Tags: x.tags, Conditions: conditions(briefOf(&g), x)})
		}
	}
	writeJSON(w, http.StatusOK, p)
}

// fleetWorst answers GET /api/fleet/worst?by=gateway|scene|device&range=24h|7d|30d&limit=&min=.
func (a *API) fleetWorst(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	by, rng := q.Get("by"), q.Get("range")
	if by == "" {
		by = "gateway"
	}
	if rng == "" {
		rng = "7d"
	}
	limit, minN := worstLimit, int64(worstMin)
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > worstMaxLimit {
			a.fail(w, r, fmt.Errorf("%w: limit must be 1..%d", ErrInvalid, worstMaxLimit))
			return
		}
		limit = n
	}
	if s := q.Get("min"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 1 {
			a.fail(w, r, fmt.Errorf("%w: min must be a count of at least 1", ErrInvalid))
			return
		}
		minN = n
	}
	st, ok := a.st.(totalsReader)
	if !ok {
		writeError(w, http.StatusNotImplemented, "no_rollup", "this hub's store keeps no outcome roll-up")
		return
	}
	now := time.Now()
	key := by + "|" + rng + "|" + strconv.FormatInt(minN, 10) + "|" + strconv.Itoa(limit)
	out, ok := a.worst.get(key, now)
	if !ok {
		var err error
		if out, err = BuildWorst(r.Context(), st, by, rng, minN, limit, now); err != nil {
			a.fail(w, r, err)
			return
		}
		a.worst.put(key, now, out)
	}
	writeJSON(w, http.StatusOK, out)
}
