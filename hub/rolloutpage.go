package hub

import (
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A rollout's page at 10,000 gateways: GET /api/rollouts/{id} with
// status=, kind=, gateway=, limit= or after= answers a page of its
// gateways that match, with the counts of all of them (by status, by
// kind, by stage and kind, and over time) so that the page draws the
// whole rollout from one small answer.

// Kinds of a rollout's gateway: what it is now, as the dashboard draws
// it (its rollback, once an abort gave it one, says more than the
// status it had reached).
const (
	KindOffered     = "offered"      // notified or received
	KindRefused     = "refused"      // pending, held by the pre-flight check
	KindRollingBack = "rolling_back" // a rollback under way
	KindRolledBack  = "rolled_back"
)

// targetKind is t's kind: one of the statuses, or a Kind.
func targetKind(t *RolloutGateway) string {
	switch t.Back {
	case "":
	case BackRolledBack:
		return KindRolledBack
	case BackFailed:
		return TargetFailed
	case BackUnreachable:
		return TargetUnreachable
	default:
		return KindRollingBack
	}
	switch t.Status {
	case TargetPending:
		if t.Refused != "" {
			return KindRefused
		}
	case TargetNotified, TargetReceived:
		return KindOffered
	}
	return t.Status
}

// countKeys are t's keys in RolloutView.Counts: its status, its
// rollback's, and "refused" while the pre-flight check holds it.
func countKeys(t *RolloutGateway) []string {
	out := []string{t.Status}
	if t.Back != "" {
		out = append(out, "rollback_"+t.Back)
	}
	if t.Refused != "" && t.Status == TargetPending {
		out = append(out, "refused")
	}
	return out
}

// RolloutSelect picks a page of a rollout's gateways: those matching
// any of Status (keys of RolloutView.Counts), any of Kind, and
// containing Gateway, in their order after order After, at most Limit.
type RolloutSelect struct {
	Status  []string
	Kind    []string
	Gateway string
	After   int // -1: from the first
	Limit   int
}

// maxRolloutPage caps a page of a rollout's gateways.
const maxRolloutPage = 1000

// parseRolloutSelect reads the page asked for; ok is false when none is
// (every gateway is answered, as before the list was paged).
func parseRolloutSelect(v url.Values) (RolloutSelect, bool, error) {
	s := RolloutSelect{Gateway: v.Get("gateway"), After: -1, Limit: 100}
	paged := false
	for _, p := range []struct {
		name string
		dst  *[]string
	}{{"status", &s.Status}, {"kind", &s.Kind}} {
		if x := v.Get(p.name); x != "" {
			paged = true
			for k := range strings.SplitSeq(x, ",") {
				*p.dst = append(*p.dst, strings.TrimSpace(k))
			}
		}
	}
	if s.Gateway != "" {
		paged = true
	}
	if x := v.Get("after"); x != "" {
		n, err := strconv.Atoi(x)
		if err != nil || n < 0 {
			return s, false, fmt.Errorf("%w: after must be a gateway's order (the next of the previous page)", ErrInvalid)
		}
		s.After, paged = n, true
	}
	if x := v.Get("limit"); x != "" {
		n, err := strconv.Atoi(x)
		if err != nil || n < 1 || n > maxRolloutPage {
			return s, false, fmt.Errorf("%w: limit must be 1..%d", ErrInvalid, maxRolloutPage)
		}
		s.Limit, paged = n, true
	}
	return s, paged, nil
}

func (s RolloutSelect) match(t *RolloutGateway) bool {
	if s.Gateway != "" && !strings.Contains(t.Gateway, s.Gateway) {
		return false
	}
	if len(s.Status) > 0 && !slices.ContainsFunc(countKeys(t), func(k string) bool { return slices.Contains(s.Status, k) }) {
		return false
	}
	return len(s.Kind) == 0 || slices.Contains(s.Kind, targetKind(t))
}

// RolloutProgress is the rollout's outcomes over time: how many of its
// gateways had become healthy, failed and rolled back (by kind, each at
// its last change) at each of Points times evenly spread from From to
// To.
type RolloutProgress struct {
	From   time.Time        `json:"from"`
	To     time.Time        `json:"to"`
	Series map[string][]int `json:"series"`
	Totals map[string]int   `json:"totals"`
}

// progressPoints is the resolution of RolloutProgress.
const progressPoints = 120

// progressKinds are the kinds drawn over time.
var progressKinds = []string{TargetHealthy, TargetFailed, KindRolledBack}

// pageLocked fills v's counts of every gateway and its page of those
// sel matches.
func (f *Fleet) pageLocked(run *rolloutRun, v *RolloutView, sel RolloutSelect) {
	v.Kinds = map[string]int{}
	v.StageKinds = make([]map[string]int, len(run.r.Stages))
	for i := range v.StageKinds {
		v.StageKinds[i] = map[string]int{}
	}
	to := f.o.Now()
	if !run.r.Ended.IsZero() {
		to = run.r.Ended
	}
	var times []struct {
		kind string
		at   time.Time
	}
	v.Gateways = []*RolloutGateway{}
	for _, t := range run.targets {
		k := targetKind(t)
		v.Kinds[k]++
		if len(v.StageKinds) > 0 {
			v.StageKinds[min(t.Stage, len(v.StageKinds)-1)][k]++
		}
		if slices.Contains(progressKinds, k) && !t.Updated.IsZero() {
			times = append(times, struct {
				kind string
				at   time.Time
			}{k, t.Updated})
			if t.Updated.After(to) {
				to = t.Updated
			}
		}
		if !sel.match(t) {
			continue
		}
		v.Matched++
		if t.Order <= sel.After {
			continue
		}
		if len(v.Gateways) == sel.Limit {
			v.Next = strconv.Itoa(v.Gateways[len(v.Gateways)-1].Order)
			continue
		}
		c := *t
		v.Gateways = append(v.Gateways, &c)
	}
	from := run.r.Created
	if !to.After(from) {
		to = from.Add(time.Second)
	}
	p := &RolloutProgress{From: from, To: to, Series: map[string][]int{}, Totals: map[string]int{}}
	span := to.Sub(from)
	for _, k := range progressKinds {
		p.Series[k] = make([]int, progressPoints+1)
	}
	for _, x := range times {
		// The first point at or after the change counts it.
		i := int((x.at.Sub(from)*progressPoints + span - 1) / span)
		i = max(0, min(progressPoints, i))
		p.Series[x.kind][i]++
		p.Totals[x.kind]++
	}
	for _, s := range p.Series {
		for i := 1; i < len(s); i++ {
			s[i] += s[i-1]
		}
	}
	v.Progress = p
}

// RolloutPage returns one rollout with the page of its gateways sel
// picks, and the counts of all of them.
func (f *Fleet) RolloutPage(id string, sel RolloutSelect) (RolloutView, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	run, err := f.runOf(id)
	if err != nil {
		return RolloutView{}, err
	}
	v := f.viewLocked(run, false)
	f.pageLocked(run, &v, sel)
	return v, nil
}
