package scenes

import (
	"fmt"
	"maps"
	"slices"

	"github.com/sortie-edge/sortie/driver"
)

// isGroup says whether a step table is a parallel group.
func isGroup(m map[string]any) bool {
	_, devs := m["devices"]
	_, par := m["parallel"]
	return devs || par
}

// group validates the j-th step table of a scene, a parallel group, and
// returns its branches: one device step per device, each taking the
// group's device step keys (action, params, retry, compensate, ...)
// unless it sets its own. scenePolicy is the group's policy unless it
// sets one.
func (p *parser) group(sceneLoc FieldError, j int, m map[string]any, scenePolicy driver.Policy) []step {
	before := len(p.errs)
	loc := sceneLoc
	loc.Step = j + 1
	id, _ := m["id"].(string)
	loc.StepName = id
	t := p.table(loc, "", m)
	g := &driver.Group{ID: fmt.Sprintf("%d-parallel", j+1), Policy: scenePolicy}
	if id, ok := t.str("id"); ok {
		if err := driver.ValidateID("step id", id); err != nil {
			t.fail("id", "%s", idReason(err))
		}
		g.ID = id
	}
	if pol, ok := t.str("policy"); ok {
		switch driver.Policy(pol) {
		case driver.PolicyAll, driver.PolicyBestEffort, driver.PolicyQuorum:
			g.Policy = driver.Policy(pol)
		default:
			t.fail("policy", "%q is not \"all\", \"best_effort\" or \"quorum\"", pol)
		}
	}
	if q, ok := t.integer("quorum"); ok {
		if g.Policy != "" && g.Policy != driver.PolicyQuorum && t.has("policy") {
			t.fail("quorum", "set but policy is %q", g.Policy)
		}
		g.Policy, g.Quorum = driver.PolicyQuorum, int(min(max(q, 0), MaxSteps+1))
	} else if g.Policy == driver.PolicyQuorum {
		t.fail("quorum", "missing: policy \"quorum\" needs quorum = N")
	}
	if g.Policy == driver.PolicyAll {
		g.Policy = "" // the default, not stored
	}
	// What every branch takes from the group.
	shared := make(map[string]any)
	for _, k := range append(slices.Clone(commandKeys), "on_error") {
		if v, ok := t.get(k); ok {
			shared[k] = v
		}
	}
	var branches []map[string]any
	if v, ok := t.get("devices"); ok {
		list, isList := v.([]any)
		switch {
		case !isList:
			t.fail("devices", "%s is not an array of device IDs", describe(v))
		case len(list) == 0:
			t.fail("devices", "is empty: list at least one device ID")
		}
		for _, d := range list {
			b := maps.Clone(shared)
			b["device"] = d
			branches = append(branches, b)
		}
		if t.has("parallel") {
			t.get("parallel")
			t.fail("parallel", "a group has devices or parallel, not both")
		}
	} else if v, ok := t.get("parallel"); ok {
		tables, ok := tableList(v)
		if !ok || len(tables) == 0 {
			t.fail("parallel", "%s is not a non-empty array of tables ([[scene.step.parallel]])", describe(v))
		}
		for _, bt := range tables {
			b := maps.Clone(shared)
			maps.Copy(b, bt)
			branches = append(branches, b)
		}
	}
	t.done()
	var out []step
	seen := make(map[string]int)
	for i, b := range branches {
		if !isDeviceStep(b) {
			bl := loc
			bl.StepName = g.ID
			bl.Field = fmt.Sprintf("parallel[%d]", i) // TOML's own numbering, from 0
			bl.Msg = "a branch is a device step (device and action); delays and waits go before or after the group"
			p.errs = append(p.errs, bl)
			continue
		}
		dev, _ := b["device"].(string)
		if _, has := b["id"]; !has {
			b["id"] = g.ID + "." + dev
		}
		st, ok := p.step(loc, j, b)
		if !ok {
			continue
		}
		if first, dup := seen[st.device]; dup {
			t.fail("", "device %s is in the group twice (its branches %d and %d, from 1): one command per device at a time", st.device, first+1, i+1)
			continue
		}
		seen[st.device] = i
		st.group = g
		out = append(out, st)
	}
	if g.Policy == driver.PolicyQuorum && t.has("quorum") && len(out) > 0 && (g.Quorum < 1 || g.Quorum > len(out)) {
		t.fail("quorum", "%d is outside 1..%d (the group's branches)", g.Quorum, len(out))
	}
	p.dedupe(before)
	if len(p.errs) > before {
		return nil
	}
	return out
}

// isDeviceStep says whether a step table is a device step.
func isDeviceStep(m map[string]any) bool {
	_, delay := m["delay"]
	_, wait := m["wait_for"]
	return !delay && !wait
}

// tableList reads an array of tables, as TOML gives either form.
func tableList(v any) ([]map[string]any, bool) {
	switch s := v.(type) {
	case []map[string]any:
		return s, true
	case []any:
		out := make([]map[string]any, 0, len(s))
		for _, e := range s {
			m, ok := e.(map[string]any)
			if !ok {
				return nil, false
			}
			out = append(out, m)
		}
		return out, true
	}
	return nil, false
}

// dedupe drops repeats among the errors since before: a group's shared
// key that is wrong is wrong in every branch, and said once.
func (p *parser) dedupe(before int) {
	seen := make(map[FieldError]bool)
	kept := p.errs[:before]
	for _, e := range p.errs[before:] {
		key := e
		key.StepName = ""
		if !seen[key] {
			seen[key] = true
			kept = append(kept, e)
		}
	}
	p.errs = kept
}
