package scenes

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
)

// Catalog is a validated set of scenes. It is read-only and safe for
// concurrent use.
type Catalog struct {
	reg    *devices.Registry
	scenes map[string]*scene
	names  []string
}

// Load reads every *.toml file in dir (not its subdirectories) and
// validates the scenes against reg. Problems in the files are reported
// together as a *LoadError; I/O failures are returned as they are.
func Load(dir string, reg *devices.Registry) (*Catalog, error) {
	if reg == nil {
		return nil, errors.New("load scenes: nil device registry")
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("load scenes: %w", err)
	}
	var files []string
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".toml") {
			files = append(files, filepath.Join(dir, e.Name()))
		}
	}
	if len(files) == 0 {
		return nil, &LoadError{Errors: []FieldError{{File: dir, Msg: "no *.toml scene files"}}}
	}
	srcs := make([]SourceFile, 0, len(files))
	for _, f := range files {
		data, err := readFile(f)
		if err != nil {
			return nil, fmt.Errorf("load scenes: %w", err)
		}
		srcs = append(srcs, SourceFile{Name: f, Data: data})
	}
	return LoadFiles(srcs, reg)
}

// SourceFile is one scene file's name (for error messages) and content.
type SourceFile struct {
	Name string
	Data []byte
}

// LoadFiles validates the scenes of several files' contents against reg
// with exactly the rules of Load, which reads them from a directory: a
// configuration bundle (package bundle) holds its files in memory.
func LoadFiles(files []SourceFile, reg *devices.Registry) (*Catalog, error) {
	if reg == nil {
		return nil, errors.New("load scenes: nil device registry")
	}
	if len(files) == 0 {
		return nil, &LoadError{Errors: []FieldError{{Msg: "no scene files"}}}
	}
	b := &builder{reg: reg}
	for _, f := range files {
		b.add(f.Data, f.Name)
	}
	return b.catalog()
}

// readFile reads at most one byte more than MaxFileSize, so a huge file
// is rejected without being read whole.
func readFile(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // read-only: nothing to lose once read
	return io.ReadAll(io.LimitReader(f, MaxFileSize+1))
}

// Parse validates the scenes of one file's contents; file names the
// source in error messages.
func Parse(data []byte, file string, reg *devices.Registry) (*Catalog, error) {
	if reg == nil {
		return nil, errors.New("parse scenes: nil device registry")
	}
	b := &builder{reg: reg}
	b.add(data, file)
	return b.catalog()
}

// builder merges files into a Catalog, catching names used twice.
type builder struct {
	reg    *devices.Registry
	errs   []FieldError
	scenes []*scene
	seen   map[string]*scene
}

func (b *builder) add(data []byte, file string) {
	p := &parser{file: file, reg: b.reg}
	scs := p.parse(data)
	b.errs = append(b.errs, p.errs...)
	if b.seen == nil {
		b.seen = make(map[string]*scene)
	}
	for _, sc := range scs {
		if first := b.seen[sc.name]; first != nil {
			b.errs = append(b.errs, FieldError{File: file, Scene: sc.name, Field: "name",
				Msg: fmt.Sprintf("duplicate scene name (first in %s)", first.file)})
			continue
		}
		b.seen[sc.name] = sc
		b.scenes = append(b.scenes, sc)
	}
}

func (b *builder) catalog() (*Catalog, error) {
	if len(b.errs) > 0 {
		return nil, &LoadError{Errors: b.errs}
	}
	c := &Catalog{reg: b.reg, scenes: b.seen, names: make([]string, 0, len(b.scenes))}
	for _, sc := range b.scenes {
		c.names = append(c.names, sc.name)
	}
	sort.Strings(c.names)
	if errs := c.checkSchedules(); len(errs) > 0 {
		return nil, &LoadError{Errors: errs}
	}
	return c, nil
}

// Names returns the scene names, sorted.
func (c *Catalog) Names() []string { return append([]string(nil), c.names...) }

// Scene describes the named scene.
func (c *Catalog) Scene(name string) (Info, bool) {
	sc := c.scenes[name]
	if sc == nil {
		return Info{}, false
	}
	return sc.info(), true
}

// Devices returns the IDs of the devices the named scene's steps
// command or wait for, sorted, each once: what a configuration change
// that touches the scene puts to the test.
func (c *Catalog) Devices(name string) []string {
	sc := c.scenes[name]
	if sc == nil {
		return nil
	}
	seen := map[string]bool{}
	for _, st := range sc.steps {
		if st.device != "" {
			seen[st.device] = true
		}
	}
	return slices.Sorted(maps.Keys(seen))
}

func (sc *scene) info() Info {
	info := Info{
		Name: sc.name, Description: sc.description, File: sc.file, Mode: sc.mode,
		Priority: sc.priority, Deadline: sc.deadline, Steps: len(sc.steps),
	}
	params := make(map[string]*Param)
	for _, st := range sc.steps {
		st.eachValue(func(v value) {
			if !v.isFrom() {
				return
			}
			p := params[v.from]
			if p == nil {
				p = &Param{Name: v.from, Required: true}
				params[v.from] = p
			}
			if v.hasDefault && p.Required {
				p.Required, p.Default = false, v.def
			}
		})
	}
	for _, k := range slices.Sorted(maps.Keys(params)) {
		info.Params = append(info.Params, *params[k])
	}
	return info
}

// eachValue calls f for every parameter value of the step, its
// compensation included, in a fixed order.
func (st *step) eachValue(f func(v value)) {
	for _, k := range slices.Sorted(maps.Keys(st.params)) {
		f(st.params[k])
	}
	if st.compensate != nil {
		for _, k := range slices.Sorted(maps.Keys(st.compensate.params)) {
			f(st.compensate.params[k])
		}
	}
}

// delayParams is the Params of a "delay" step.
type delayParams struct {
	Duration driver.Duration `json:"duration"`
}

// Build turns a trigger of the named scene into a mission spec. Trigger
// parameters are checked against the registry here, so a bad value is
// rejected before any mission exists. Errors are *TriggerError with
// reason unknown_scene or invalid_param. The caller sets RequestKey,
// Source and TraceID.
func (c *Catalog) Build(name string, trigger map[string]any) (driver.Spec, error) {
	sc := c.scenes[name]
	if sc == nil {
		return driver.Spec{}, triggerErr(ReasonUnknownScene, "no scene %q (have %s)", name, strings.Join(c.names, ", "))
	}
	info := sc.info()
	for _, k := range slices.Sorted(maps.Keys(trigger)) {
		if !hasParam(info.Params, k) {
			return driver.Spec{}, triggerErr(ReasonInvalidParam, "param %q: scene %s %s", k, name, takes(info.Params))
		}
	}
	trig, err := normalizeParams(trigger)
	if err != nil {
		return driver.Spec{}, err
	}
	spec := driver.Spec{
		Type: sc.name, Priority: sc.priority, Timeout: sc.deadline,
		Steps: make([]driver.Step, 0, len(sc.steps)), Values: trig,
	}
	for _, st := range sc.steps {
		if st.onConflict == "" {
			st.onConflict = sc.onConflict
		}
		ds, err := c.buildStep(&st, trig)
		if err != nil {
			return driver.Spec{}, err
		}
		spec.Steps = append(spec.Steps, ds)
	}
	return spec, nil
}

func hasParam(ps []Param, name string) bool {
	for _, p := range ps {
		if p.Name == name {
			return true
		}
	}
	return false
}

// takes lists a scene's parameters for an error message.
func takes(ps []Param) string {
	if len(ps) == 0 {
		return "takes no params"
	}
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Name
	}
	return "takes " + strings.Join(names, ", ")
}

func (c *Catalog) buildStep(st *step, trig map[string]any) (driver.Step, error) {
	ds := driver.Step{ID: st.id, ContinueOnError: st.continueOnError}
	if st.group != nil {
		g := *st.group
		ds.Group = &g
	}
	var params any
	switch st.kind {
	case kindDelay:
		ds.Kind, ds.Name = DelayKind, "delay "+st.delay.String()
		params = delayParams{Duration: driver.Duration(st.delay)}
	case kindWait:
		ds.Kind, ds.Name, ds.Target = WaitKind, "wait for "+st.device, st.device
		params = devices.WaitParams{Device: st.device, State: st.state, Timeout: driver.Duration(st.waitTimeout)}
	default:
		ds.Kind, ds.Target = CommandKind, st.device
		ds.Timeout, ds.Retry = driver.Duration(st.timeout), st.retry
		resolved, err := c.resolve(st.device, st.command, trig)
		if err != nil {
			return ds, err
		}
		ds.Name = commandName(st.action, st.device, resolved, func(k string) bool { return c.reg.Shown(st.device, st.action, k) })
		params = devices.CommandParams{
			Device: st.device, Action: st.action, Params: resolved, Verify: st.verify,
			VerifyTimeout: driver.Duration(st.verifyTimeout), AckTimeout: driver.Duration(st.ackTimeout),
			OnConflict: st.onConflict,
		}
		comp, err := c.compensation(st, trig)
		if err != nil {
			return ds, err
		}
		ds.Compensate = comp
	}
	raw, err := json.Marshal(params)
	if err != nil {
		return ds, fmt.Errorf("build step %s: %w", st.id, err)
	}
	ds.Params = raw
	return ds, nil
}

func (c *Catalog) compensation(st *step, trig map[string]any) (*driver.Compensation, error) {
	// The undo is checked and waited for like the step it undoes.
	verify, verifyTimeout, ackTimeout := st.verify, driver.Duration(st.verifyTimeout), driver.Duration(st.ackTimeout)
	var params any
	switch {
	case st.restore:
		params = devices.RestoreParams{Device: st.device, Verify: verify, VerifyTimeout: verifyTimeout, AckTimeout: ackTimeout}
	case st.compensate != nil:
		resolved, err := c.resolve(st.device, *st.compensate, trig)
		if err != nil {
			return nil, err
		}
		params = devices.CommandParams{Device: st.device, Action: st.compensate.action, Params: resolved,
			Verify: verify, VerifyTimeout: verifyTimeout, AckTimeout: ackTimeout}
	default:
		return nil, nil
	}
	raw, err := json.Marshal(params)
	if err != nil {
		return nil, fmt.Errorf("build compensation of step %s: %w", st.id, err)
	}
	kind := CommandKind
	if st.restore {
		kind = RestoreKind
	}
	return &driver.Compensation{Kind: kind, Params: raw, Timeout: driver.Duration(st.timeout), Retry: st.retry}, nil
}

// resolve fills a command's parameters from the trigger and checks the
// ones that came from it.
func (c *Catalog) resolve(dev string, cmd command, trig map[string]any) (map[string]any, error) {
	if len(cmd.params) == 0 {
		return nil, nil
	}
	out := make(map[string]any, len(cmd.params))
	for _, k := range slices.Sorted(maps.Keys(cmd.params)) {
		v := cmd.params[k]
		if !v.isFrom() {
			out[k] = v.constant
			continue
		}
		tv, ok := trig[v.from]
		if !ok {
			if !v.hasDefault {
				return nil, triggerErr(ReasonInvalidParam, "param %q: missing (no default)", v.from)
			}
			out[k] = v.def
			continue
		}
		err := c.reg.Check(dev, cmd.action, map[string]any{k: tv})
		var ce *devices.CheckError
		if errors.As(err, &ce) && ce.Field == k {
			return nil, triggerErr(ReasonInvalidParam, "param %q: %s (%s %s.%s)", v.from, ce.Reason, dev, cmd.action, k)
		}
		out[k] = tv
	}
	return out, nil
}

// maxName bounds a step's Name: it travels to the hub in the mission's
// step table, from gateways with little bandwidth.
const maxName = 80

// commandName labels a command step: its action, device and parameters
// ("turn_on living-light brightness=40"), cut at maxName. A parameter
// whose value is not shown (devices.Registry.Shown: a code, free text)
// is named with its value hidden ("unlock front-door code=***"): the
// name goes to the hub, its store, dashboard and CSV, and a trigger's
// values, a lock's code among them, would go with it.
func commandName(action, dev string, params map[string]any, shown func(param string) bool) string {
	var b strings.Builder
	b.WriteString(action + " " + dev)
	for _, k := range slices.Sorted(maps.Keys(params)) {
		if shown(k) {
			fmt.Fprintf(&b, " %s=%v", k, params[k])
		} else {
			b.WriteString(" " + k + "=***")
		}
	}
	if b.Len() <= maxName {
		return b.String()
	}
	const more = "…"
	return strings.ToValidUTF8(b.String()[:maxName-len(more)], "") + more
}
