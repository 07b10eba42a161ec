package scenes

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
)

// parser validates the scenes of one file, collecting every problem.
type parser struct {
	file string
	reg  *devices.Registry
	errs []FieldError
}

// parse returns the file's valid scenes; problems go to p.errs.
func (p *parser) parse(data []byte) []*scene {
	loc := FieldError{File: p.file}
	if len(data) > MaxFileSize {
		loc.Msg = fmt.Sprintf("file is %d bytes (max %d)", len(data), MaxFileSize)
		p.errs = append(p.errs, loc)
		return nil
	}
	var doc struct {
		Scene []map[string]any `toml:"scene"`
	}
	md, err := toml.Decode(string(data), &doc)
	if err != nil {
		loc.Msg = strings.TrimPrefix(err.Error(), "toml: ")
		p.errs = append(p.errs, loc)
		return nil
	}
	// Only top-level keys: the scene tables are decoded into maps and
	// checked key by key below (the metadata marks some of their keys
	// undecoded, without array indexes to say where).
	for _, k := range md.Undecoded() {
		if len(k) == 0 || k[0] == "scene" {
			continue
		}
		p.errs = append(p.errs, FieldError{File: p.file, Field: k.String(), Msg: "unknown key (scenes are [[scene]] tables)"})
	}
	if len(doc.Scene) == 0 && len(p.errs) == 0 {
		loc.Msg = "no [[scene]] tables"
		p.errs = append(p.errs, loc)
	}
	var out []*scene
	for i, m := range doc.Scene {
		if sc := p.scene(i, m); sc != nil {
			out = append(out, sc)
		}
	}
	return out
}

// scene validates the i-th [[scene]] table; nil means it had problems.
func (p *parser) scene(i int, m map[string]any) *scene {
	before := len(p.errs)
	loc := FieldError{File: p.file, Scene: fmt.Sprintf("#%d", i+1)}
	t := p.table(loc, "", m)
	sc := &scene{file: p.file, priority: DefaultPriority, deadline: DefaultDeadline, mode: DefaultMode}
	if name, ok := t.required("name"); ok {
		if err := driver.ValidateID("scene name", name); err != nil {
			t.fail("name", "%s", idReason(err))
		} else {
			sc.name = name
			t.loc.Scene = name
		}
	}
	if d, ok := t.str("description"); ok {
		if len(d) > MaxDescription {
			t.fail("description", "is %d bytes long (max %d)", len(d), MaxDescription)
		}
		sc.description = d
	}
	if pr, ok := t.integer("priority"); ok {
		if pr < driver.MinPriority || pr > driver.MaxPriority {
			t.fail("priority", "%d is outside %d..%d", pr, driver.MinPriority, driver.MaxPriority)
		}
		sc.priority = int(pr)
	}
	if d, ok := t.duration("deadline"); ok {
		sc.deadline = d
	}
	if mode, ok := t.str("mode"); ok {
		sc.mode = Mode(mode)
		if !sc.mode.valid() {
			t.fail("mode", "%q is not one of single, restart, queued, parallel", mode)
		}
	}
	if pol, ok := t.str("policy"); ok {
		switch driver.Policy(pol) {
		case driver.PolicyAll, driver.PolicyBestEffort:
			sc.policy = driver.Policy(pol)
		default:
			t.fail("policy", "%q is not \"all\" or \"best_effort\" (a quorum is a group's)", pol)
		}
	}
	if oc, ok := t.str("on_conflict"); ok {
		sc.onConflict = oc
		checkConflict(t, oc)
	}
	steps := p.stepTables(t)
	for j, sm := range steps {
		if isGroup(sm) {
			sc.steps = append(sc.steps, p.group(t.loc, j, sm, sc.policy)...)
			continue
		}
		if st, ok := p.step(t.loc, j, sm); ok {
			if sc.policy == driver.PolicyBestEffort {
				if _, set := sm["on_error"]; !set {
					st.continueOnError = true
				}
			}
			sc.steps = append(sc.steps, st)
		}
	}
	seenGroups := map[string]bool{}
	for i, st := range sc.steps {
		if st.group == nil || i > 0 && sc.steps[i-1].group == st.group {
			continue
		}
		if seenGroups[st.group.ID] {
			t.fail("step", "two parallel groups have id %q: a group's id is unique in its scene", st.group.ID)
		}
		seenGroups[st.group.ID] = true
	}
	if len(sc.steps) > MaxSteps {
		t.fail("step", "%d steps, counting each branch of a parallel group (max %d)", len(sc.steps), MaxSteps)
	}
	sc.schedules = p.schedules(t, sc.name)
	t.done()
	p.checkSteps(t, sc)
	if len(p.errs) > before {
		return nil
	}
	return sc
}

// stepTables returns the scene's [[scene.step]] tables.
func (p *parser) stepTables(t *table) []map[string]any {
	v, ok := t.get("step")
	if !ok {
		t.fail("step", "a scene needs at least one [[scene.step]]")
		return nil
	}
	var steps []map[string]any
	switch s := v.(type) {
	case []map[string]any:
		steps = s
	case []any:
		for _, e := range s {
			m, ok := e.(map[string]any)
			if !ok {
				t.fail("step", "%s is not a table", describe(e))
				return nil
			}
			steps = append(steps, m)
		}
	default:
		t.fail("step", "%s is not an array of tables", describe(v))
		return nil
	}
	switch {
	case len(steps) == 0:
		t.fail("step", "a scene needs at least one [[scene.step]]")
	case len(steps) > MaxSteps:
		t.fail("step", "%d steps (max %d)", len(steps), MaxSteps)
		return nil
	}
	return steps
}

// checkSteps runs the checks that span steps.
func (p *parser) checkSteps(t *table, sc *scene) {
	ids := make(map[string]int, len(sc.steps))
	var delays time.Duration
	for j, st := range sc.steps {
		if first, dup := ids[st.id]; dup {
			loc := t.loc
			loc.Step, loc.StepName, loc.Field = j+1, st.id, "id"
			loc.Msg = fmt.Sprintf("duplicate step id %q (also step %d)", st.id, first)
			p.errs = append(p.errs, loc)
			continue
		}
		ids[st.id] = j + 1
		delays += st.delay
		if st.kind == kindWait && st.waitTimeout > sc.deadline {
			if !st.waitTimeoutSet {
				sc.steps[j].waitTimeout = sc.deadline // the default, cut to fit
				continue
			}
			loc := t.loc
			loc.Step, loc.StepName, loc.Field = j+1, st.name, "wait_for.timeout"
			loc.Msg = fmt.Sprintf("%s is longer than the scene's deadline %s", st.waitTimeout, sc.deadline)
			p.errs = append(p.errs, loc)
		}
	}
	if delays > sc.deadline {
		t.fail("deadline", "%s is shorter than the scene's delays (%s in all)", sc.deadline, delays)
	}
}

// commandKeys are the keys only device steps have.
var commandKeys = []string{"action", "params", "timeout", "retry", "verify", "verify_timeout", "ack_timeout", "compensate", "on_conflict"}

// step validates the j-th step table of a scene.
func (p *parser) step(sceneLoc FieldError, j int, m map[string]any) (step, bool) {
	before := len(p.errs)
	loc := sceneLoc
	loc.Step = j + 1
	var st step
	var kinds []string
	if _, ok := m["device"]; ok {
		kinds, st.kind = append(kinds, "device"), kindCommand
	} else if _, ok := m["action"]; ok {
		kinds, st.kind = append(kinds, "action"), kindCommand
	}
	if _, ok := m["delay"]; ok {
		kinds, st.kind = append(kinds, "delay"), kindDelay
	}
	if _, ok := m["wait_for"]; ok {
		kinds, st.kind = append(kinds, "wait_for"), kindWait
	}
	loc.StepName = stepName(m, kinds)
	t := p.table(loc, "", m)
	switch len(kinds) {
	case 1:
	case 0:
		t.fail("", "a step needs device and action, delay, or wait_for")
		return st, false
	default:
		t.fail("", "a step is one of device/action, delay or wait_for, not %s", strings.Join(kinds, " and "))
		return st, false
	}
	if id, ok := t.str("id"); ok {
		if err := driver.ValidateID("step id", id); err != nil {
			t.fail("id", "%s", idReason(err))
		}
		st.id = id
	}
	if oe, ok := t.str("on_error"); ok {
		switch oe {
		case "fail":
		case "continue":
			st.continueOnError = true
		default:
			t.fail("on_error", "%q is not \"fail\" or \"continue\"", oe)
		}
	}
	switch st.kind {
	case kindCommand:
		p.command(t, &st)
		st.name = st.device
		if st.id == "" {
			st.id = fmt.Sprintf("%d-%s", j+1, st.device)
		}
	case kindDelay:
		p.onlyCommand(t)
		if d, ok := t.duration("delay"); ok {
			st.delay = d
		}
		st.name = "delay"
		if st.id == "" {
			st.id = fmt.Sprintf("%d-delay", j+1)
		}
	case kindWait:
		p.onlyCommand(t)
		p.waitFor(t, &st)
		st.name = "wait_for " + st.device
		if st.id == "" {
			st.id = fmt.Sprintf("%d-wait-%s", j+1, st.device)
		}
	}
	t.done()
	return st, len(p.errs) == before
}

// stepName labels a step in messages before it is validated.
func stepName(m map[string]any, kinds []string) string {
	if id, ok := m["id"].(string); ok && id != "" {
		return id
	}
	if len(kinds) != 1 {
		return ""
	}
	switch kinds[0] {
	case "delay":
		return "delay"
	case "wait_for":
		if w, ok := m["wait_for"].(map[string]any); ok {
			if d, ok := w["device"].(string); ok {
				return "wait_for " + d
			}
		}
		return "wait_for"
	}
	d, _ := m["device"].(string)
	return d
}

// onlyCommand rejects device-step keys on other steps, with a clearer
// message than "unknown key".
func (p *parser) onlyCommand(t *table) {
	for _, k := range commandKeys {
		if t.has(k) {
			t.get(k)
			t.fail(k, "only device steps have %s", k)
		}
	}
}

// command validates a device step.
func (p *parser) command(t *table, st *step) {
	dev, devOK := p.device(t, "device")
	st.device = dev
	st.command = p.action(t, dev, devOK)
	if d, ok := t.duration("timeout"); ok {
		st.timeout = d
	}
	if r := t.sub("retry"); r != nil {
		st.retry = p.retry(r)
	}
	verifySet := false
	if v, ok := t.boolean("verify"); ok {
		st.verify, verifySet = v, true
	}
	if d, ok := t.duration("verify_timeout"); ok {
		st.verifyTimeout = d
		if !st.verify && verifySet {
			t.fail("verify_timeout", "set but verify is false")
		} else if !verifySet {
			t.fail("verify_timeout", "set without verify = true")
		}
	}
	if st.verify && devOK && st.action != "" {
		placeholder := make(map[string]any, len(st.params))
		for k := range st.params {
			placeholder[k] = nil
		}
		if len(p.reg.Expected(dev, st.action, placeholder)) == 0 {
			t.fail("verify", "action %q leads to no known state to verify", st.action)
		}
	}
	if d, ok := t.duration("ack_timeout"); ok {
		st.ackTimeout = d
	}
	if oc, ok := t.str("on_conflict"); ok {
		st.onConflict = oc
		checkConflict(t, oc)
	}
	// timeout bounds the whole attempt; a longer wait inside it could
	// never run out.
	if st.timeout > 0 {
		for _, w := range []struct {
			key string
			d   time.Duration
		}{{"ack_timeout", st.ackTimeout}, {"verify_timeout", st.verifyTimeout}} {
			if w.d > st.timeout {
				t.fail(w.key, "%s is longer than the step's timeout %s", w.d, st.timeout)
			}
		}
	}
	if v, ok := t.get("compensate"); ok {
		switch c := v.(type) {
		case string:
			if c == "restore" {
				st.restore = true
			} else {
				t.fail("compensate", "%q is not \"restore\" or a table { action, params }", c)
			}
		case map[string]any:
			ct := p.table(t.loc, "compensate.", c)
			cmd := p.action(ct, dev, devOK)
			st.compensate = &cmd
			ct.done()
		default:
			t.fail("compensate", "%s is not \"restore\" or a table { action, params }", describe(v))
		}
	}
}

// device reads a device ID and checks the registry knows it.
func (p *parser) device(t *table, key string) (string, bool) {
	id, ok := t.required(key)
	if !ok {
		return id, false
	}
	if _, known := p.reg.Device(id); !known {
		known := make([]string, len(p.reg.Devices))
		for i, d := range p.reg.Devices {
			known[i] = d.ID
		}
		t.fail(key, "unknown device %q (known: %s)", id, strings.Join(known, ", "))
		return id, false
	}
	return id, true
}

// action reads t's action and params keys for device dev and checks them
// against the registry: every constant and every default must pass the
// registry's check, so a scene that loads sends only valid commands.
func (p *parser) action(t *table, dev string, devOK bool) command {
	var cmd command
	name, ok := t.required("action")
	cmd.action = name
	var a *devices.Action
	if ok && devOK {
		d, _ := p.reg.Device(dev)
		typ := p.reg.Types[d.Type]
		if a = typ.Actions[name]; a == nil {
			t.fail("action", "a %s has no action %q (has %s)", d.Type, name, strings.Join(slices.Sorted(maps.Keys(typ.Actions)), ", "))
		}
	}
	pt := t.sub("params")
	if pt != nil {
		cmd.params = make(map[string]value, len(pt.m))
		for _, k := range slices.Sorted(maps.Keys(pt.m)) {
			v, _ := pt.get(k)
			val, ok := p.value(pt, k, v)
			if !ok {
				continue
			}
			cmd.params[k] = val
			if a == nil {
				continue
			}
			if !val.isFrom() {
				p.check(pt, k, dev, name, k, val.constant)
			} else if val.hasDefault {
				p.check(pt, k+".default", dev, name, k, val.def)
			}
		}
	}
	if a != nil {
		for _, k := range slices.Sorted(maps.Keys(a.Params)) {
			if _, given := cmd.params[k]; !given && a.Params[k].Required {
				t.fail("params."+k, "missing required param")
			}
		}
	}
	return cmd
}

// value reads one step parameter: a constant, or a table
// { from = "param", default = ... } taking a trigger parameter.
func (p *parser) value(pt *table, key string, v any) (value, bool) {
	m, ok := v.(map[string]any)
	if !ok {
		return value{constant: v}, true
	}
	vt := p.table(pt.loc, pt.prefix+key+".", m)
	defer vt.done()
	from, ok := vt.required("from")
	if !ok {
		return value{}, false
	}
	if !validName(from) {
		vt.fail("from", "%q is not a parameter name (letters, digits, '_' and '-', at most %d bytes)", from, MaxParamName)
		return value{}, false
	}
	val := value{from: from}
	val.def, val.hasDefault = vt.get("default")
	return val, true
}

func (v value) isFrom() bool { return v.from != "" }

// check validates one parameter value with the registry and reports the
// registry's reason at field.
func (p *parser) check(t *table, field, dev, action, param string, v any) {
	err := p.reg.Check(dev, action, map[string]any{param: v})
	var ce *devices.CheckError
	if errors.As(err, &ce) && ce.Field == param {
		t.fail(field, "%s", ce.Reason)
	}
}

// retry reads a retry table into a driver.RetryPolicy.
func (p *parser) retry(t *table) driver.RetryPolicy {
	var rp driver.RetryPolicy
	if n, ok := t.integer("max_attempts"); ok {
		if n < 1 {
			t.fail("max_attempts", "%d must be at least 1", n)
		} else {
			rp.MaxAttempts = int(min(n, 1<<20))
		}
	}
	for _, d := range []struct {
		key string
		dst *driver.Duration
	}{{"initial_backoff", &rp.InitialBackoff}, {"max_backoff", &rp.MaxBackoff}, {"max_elapsed", &rp.MaxElapsed}} {
		if v, ok := t.duration(d.key); ok {
			*d.dst = driver.Duration(v)
		}
	}
	if f, ok := t.number("multiplier"); ok {
		rp.Multiplier = f
	}
	if f, ok := t.number("jitter"); ok {
		rp.Jitter = f
	}
	t.done()
	// Check each rule on its own so that every bad key is reported, not
	// just the first Validate would return.
	bad := false
	if rp.Multiplier != 0 && rp.Multiplier < 1 {
		t.fail("multiplier", "%g must be at least 1", rp.Multiplier)
		bad = true
	}
	if rp.Jitter < 0 || rp.Jitter > 1 {
		t.fail("jitter", "%g must be between 0 and 1", rp.Jitter)
		bad = true
	}
	if rp.MaxBackoff != 0 && rp.InitialBackoff > rp.MaxBackoff {
		t.fail("initial_backoff", "%s must not exceed max_backoff %s", rp.InitialBackoff, rp.MaxBackoff)
		bad = true
	}
	if bad {
		return rp
	}
	if err := rp.Validate(); err != nil {
		// The driver's messages name the key ("retry.jitter must be ...");
		// split it off so Field carries it like every other error.
		key, msg, ok := strings.Cut(err.Error(), " ")
		if rest, found := strings.CutPrefix(key, t.prefix); ok && found {
			t.fail(rest, "%s", msg)
		} else {
			t.fail("", "%s", err)
		}
	}
	return rp
}

// waitFor validates a wait_for step.
func (p *parser) waitFor(t *table, st *step) {
	st.waitTimeout = DefaultWaitTimeout
	w := t.sub("wait_for")
	if w == nil {
		return
	}
	defer w.done()
	dev, devOK := p.device(w, "device")
	st.device = dev
	if d, ok := w.duration("timeout"); ok {
		st.waitTimeout, st.waitTimeoutSet = d, true
	}
	if !w.has("state") {
		w.get("state")
		w.fail("state", "missing (e.g. state = { locked = true })")
		return
	}
	s := w.sub("state")
	if s == nil {
		return
	}
	if len(s.m) == 0 {
		s.fail("", "empty: name at least one state key")
		return
	}
	st.state = make(map[string]any, len(s.m))
	settable := p.reg.Settable(dev)
	for _, k := range slices.Sorted(maps.Keys(s.m)) {
		v, _ := s.get(k)
		st.state[k] = v
		if !devOK {
			continue
		}
		if !slices.Contains(settable, k) {
			d, _ := p.reg.Device(dev)
			s.fail(k, "not a state key of a %s (has %s)", d.Type, strings.Join(settable, ", "))
			continue
		}
		p.check(s, k, dev, devices.SetAction, k, v)
	}
}

// MaxParamName bounds trigger parameter names.
const MaxParamName = 64

// validName keeps trigger parameter names short and plain, the way the
// registry names action parameters.
func validName(s string) bool {
	if s == "" || len(s) > MaxParamName {
		return false
	}
	for _, c := range s {
		if ok := c == '_' || c == '-' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'; !ok {
			return false
		}
	}
	return true
}

// idReason drops the driver's "invalid mission: " prefix, which is noise
// in a scene file message.
func idReason(err error) string {
	return strings.TrimPrefix(err.Error(), driver.ErrInvalid.Error()+": ")
}

// checkConflict checks an on_conflict value.
func checkConflict(t *table, v string) {
	switch v {
	case devices.ConflictPreempt, devices.ConflictQueue, devices.ConflictSkip:
	default:
		t.fail("on_conflict", "%q is not \"preempt\", \"queue\" or \"skip\"", v)
	}
}
