package homeassistant

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
)

// abbreviations are the short forms of the discovery keys this package
// reads (Home Assistant's table has many more: keys Sortie does not
// read are ignored, as Home Assistant ignores unknown keys).
var abbreviations = map[string]string{
	"avty": "availability", "avty_mode": "availability_mode", "avty_t": "availability_topic",
	"avty_tpl": "availability_template", "pl_avail": "payload_available", "pl_not_avail": "payload_not_available",
	"t": "topic", "cmd_t": "command_topic", "cmd_tpl": "command_template", "stat_t": "state_topic",
	"val_tpl": "value_template", "stat_val_tpl": "state_value_template",
	"pl_on": "payload_on", "pl_off": "payload_off", "stat_on": "state_on", "stat_off": "state_off",
	"bri_cmd_t": "brightness_command_topic", "bri_cmd_tpl": "brightness_command_template",
	"bri_stat_t": "brightness_state_topic", "bri_val_tpl": "brightness_value_template", "bri_scl": "brightness_scale",
	"clr_temp_cmd_t": "color_temp_command_topic", "clr_temp_cmd_tpl": "color_temp_command_template",
	"clr_temp_stat_t": "color_temp_state_topic", "clr_temp_val_tpl": "color_temp_value_template",
	"clr_temp_k": "color_temp_kelvin", "sup_clrm": "supported_color_modes",
	"pl_lock": "payload_lock", "pl_unlk": "payload_unlock", "stat_locked": "state_locked",
	"stat_unlocked": "state_unlocked", "stat_locking": "state_locking", "stat_unlocking": "state_unlocking",
	"stat_jam": "state_jammed",
	"pos_t":    "position_topic", "pos_tpl": "position_template", "set_pos_t": "set_position_topic",
	"set_pos_tpl": "set_position_template", "pos_open": "position_open", "pos_clsd": "position_closed",
	"stat_open": "state_open", "stat_opening": "state_opening", "stat_clsd": "state_closed",
	"stat_closing": "state_closing", "stat_stopped": "state_stopped",
	"mode_cmd_t": "mode_command_topic", "mode_cmd_tpl": "mode_command_template", "mode_stat_t": "mode_state_topic",
	"mode_stat_tpl": "mode_state_template", "temp_cmd_t": "temperature_command_topic",
	"temp_cmd_tpl": "temperature_command_template", "temp_stat_t": "temperature_state_topic",
	"temp_stat_tpl": "temperature_state_template",
	"opt":           "optimistic", "uniq_id": "unique_id", "dev": "device", "o": "origin", "p": "platform",
	"cmps": "components", "e": "encoding",
}

// unsupported are keys whose meaning Sortie cannot honour: a config
// holding one is refused, with the reason, rather than half-obeyed.
var unsupported = map[string]string{
	"command_on_template":  "the template schema of lights (use the default or JSON schema)",
	"command_off_template": "the template schema of lights (use the default or JSON schema)",
	"state_template":       "the template schema of lights (use the default or JSON schema)",
	"encoding":             "payload encodings other than UTF-8",
}

// Normalize returns raw, a discovery config as Home Assistant reads it,
// with its abbreviated keys written in full and "~" expanded in the
// values of *_topic keys (at either end, as Home Assistant does), in
// availability lists too. It does not check the config.
func Normalize(raw map[string]any) map[string]any {
	base, _ := raw["~"].(string)
	var norm func(m map[string]any) map[string]any
	norm = func(m map[string]any) map[string]any {
		out := make(map[string]any, len(m))
		for k, v := range m {
			if k == "~" {
				continue
			}
			if long, ok := abbreviations[k]; ok {
				if _, both := m[long]; both {
					continue // both forms: the full key is the one kept
				}
				k = long
			}
			if s, ok := v.(string); ok && base != "" && (strings.HasSuffix(k, "_topic") || k == "topic") {
				if rest, ok := strings.CutPrefix(s, "~"); ok {
					s = base + rest
				} else if rest, ok := strings.CutSuffix(s, "~"); ok {
					s = rest + base
				}
				v = s
			}
			if list, ok := v.([]any); ok && k == "availability" {
				items := make([]any, 0, len(list))
				for _, it := range list {
					if im, ok := it.(map[string]any); ok {
						items = append(items, norm(im))
					} else {
						items = append(items, it)
					}
				}
				v = items
			}
			if list, ok := v.([]map[string]any); ok && k == "availability" {
				items := make([]any, 0, len(list))
				for _, im := range list {
					items = append(items, norm(im))
				}
				v = items
			}
			out[k] = v
		}
		return out
	}
	return norm(raw)
}

// reader reads typed values of a normalized config, keeping the first
// error.
type reader struct {
	m   map[string]any
	err error
}

func (r *reader) fail(format string, a ...any) {
	if r.err == nil {
		r.err = fmt.Errorf(format, a...)
	}
}

func (r *reader) str(key, def string) string {
	v, ok := r.m[key]
	if !ok || v == nil {
		return def
	}
	switch x := v.(type) {
	case string:
		return x
	case bool:
		// YAML and TOML read ON and OFF as text only when quoted; a
		// config that says true means the text Home Assistant would send.
		if x {
			return "True"
		}
		return "False"
	case int64, float64, int:
		f, _ := number(x)
		return strconv.FormatFloat(f, 'f', -1, 64)
	}
	r.fail("%s: %v is not text", key, v)
	return def
}

func (r *reader) topic(key string) string {
	t := r.str(key, "")
	if t != "" && (strings.ContainsAny(t, "+#\x00") || len(t) > 1024) {
		r.fail("%s: %q is not a topic to publish or read (no wildcards)", key, t)
		return ""
	}
	return t
}

func (r *reader) num(key string, def float64) float64 {
	v, ok := r.m[key]
	if !ok {
		return def
	}
	f, ok := number(v)
	if !ok {
		r.fail("%s: %v is not a number", key, v)
		return def
	}
	return f
}

func (r *reader) flag(key string, def bool) bool {
	v, ok := r.m[key]
	if !ok {
		return def
	}
	b, ok := v.(bool)
	if !ok {
		r.fail("%s: %v is not true or false", key, v)
	}
	return b
}

func (r *reader) value(key string) *valueTemplate {
	s := r.str(key, "")
	if s == "" {
		return nil
	}
	t, err := parseValueTemplate(s)
	if err != nil {
		r.fail("%s: %v", key, err)
	}
	return t
}

func (r *reader) command(key string, variables ...string) *commandTemplate {
	s := r.str(key, "")
	if s == "" {
		return nil
	}
	t, err := parseCommandTemplate(s, variables...)
	if err != nil {
		r.fail("%s: %v", key, err)
	}
	return t
}

func (r *reader) list(key string) []string {
	v, ok := r.m[key]
	if !ok {
		return nil
	}
	var out []string
	switch x := v.(type) {
	case []any:
		for _, it := range x {
			s, ok := it.(string)
			if !ok {
				r.fail("%s: %v is not text", key, it)
				return nil
			}
			out = append(out, s)
		}
	case []string:
		out = x
	default:
		r.fail("%s: %v is not a list of text", key, v)
	}
	return out
}

func number(v any) (float64, bool) {
	var f float64
	switch x := v.(type) {
	case float64:
		f = x
	case int64:
		f = float64(x)
	case int:
		f = float64(x)
	default:
		return 0, false
	}
	return f, !math.IsNaN(f) && !math.IsInf(f, 0)
}

// availability is one topic a device's availability is read from.
type availability struct {
	topic, on, off string
	tpl            *valueTemplate
}

// entity is one Home Assistant MQTT entity, as its config describes it.
type entity struct {
	id, comp string
	json     bool // a light of the JSON schema

	cmd, state string
	cmdTpl     *commandTemplate
	stateTpl   *valueTemplate
	plOn       string
	plOff      string
	stOn       string
	stOff      string

	briCmd, briState string
	briCmdTpl        *commandTemplate
	briTpl           *valueTemplate
	briScale         float64
	brightness       bool
	ctCmd, ctState   string
	ctCmdTpl         *commandTemplate
	ctTpl            *valueTemplate
	ctKelvin         bool
	colorTemp        bool

	plLock, plUnlock                          string
	stLocked, stUnlocked, stLocking, stUnlock string
	stOpen                                    string
	stJammed                                  string

	setPos, pos        string
	setPosTpl          *commandTemplate
	posTpl             *valueTemplate
	posOpen, posClosed float64
	stOpening, stClose string
	stMoveEnd          []string

	modeCmd, modeState string
	modeCmdTpl         *commandTemplate
	modeTpl            *valueTemplate
	modes              []string
	tempCmd, tempState string
	tempCmdTpl         *commandTemplate
	tempTpl            *valueTemplate

	avty     []availability
	avtyMode string
	keys     []string
}

// parseEntity reads one entity's config (normalized) for component
// comp.
func parseEntity(id, comp string, cfg map[string]any) (*entity, error) {
	for _, k := range slices.Sorted(maps.Keys(unsupported)) {
		if _, ok := cfg[k]; ok {
			why := unsupported[k]
			return nil, fmt.Errorf("%s: Sortie does not support %s", k, why)
		}
	}
	if opt, _ := cfg["optimistic"].(bool); opt {
		return nil, fmt.Errorf("optimistic: Sortie confirms a command by the state the device reports; an optimistic entity reports none")
	}
	r := &reader{m: cfg}
	e := &entity{id: id, comp: comp}
	e.cmd, e.state = r.topic("command_topic"), r.topic("state_topic")
	e.cmdTpl = r.command("command_template", "value")
	e.stateTpl = r.value("value_template")
	switch comp {
	case "switch":
		e.plOn, e.plOff = r.str("payload_on", "ON"), r.str("payload_off", "OFF")
		e.stOn, e.stOff = r.str("state_on", e.plOn), r.str("state_off", e.plOff)
		e.keys = []string{"power"}
	case "light":
		switch r.str("schema", "default") {
		case "json":
			e.json = true
			e.briScale = r.num("brightness_scale", 255)
			e.brightness = r.flag("brightness", false)
			modes := r.list("supported_color_modes")
			e.colorTemp = slices.Contains(modes, "color_temp") || r.flag("color_temp", false)
			if slices.Contains(modes, "brightness") || len(modes) > 0 && !slices.Contains(modes, "onoff") {
				e.brightness = true // every color mode but onoff dims
			}
		case "default", "basic":
			e.stateTpl = r.value("state_value_template")
			e.briCmd, e.briState = r.topic("brightness_command_topic"), r.topic("brightness_state_topic")
			e.briCmdTpl = r.command("brightness_command_template", "value")
			e.briTpl = r.value("brightness_value_template")
			e.briScale = r.num("brightness_scale", 255)
			e.brightness = e.briCmd != ""
			e.ctCmd, e.ctState = r.topic("color_temp_command_topic"), r.topic("color_temp_state_topic")
			e.ctCmdTpl = r.command("color_temp_command_template", "value")
			e.ctTpl = r.value("color_temp_value_template")
			e.colorTemp = e.ctCmd != ""
			if e.brightness && e.briState == "" || e.colorTemp && e.ctState == "" {
				return nil, fmt.Errorf("a light's brightness and color temperature need their *_state_topic: Sortie confirms a command by the state the device reports")
			}
		default:
			return nil, fmt.Errorf("schema: %q is not supported (default or json)", r.str("schema", ""))
		}
		e.ctKelvin = r.flag("color_temp_kelvin", false)
		e.plOn, e.plOff = r.str("payload_on", "ON"), r.str("payload_off", "OFF")
		e.stOn, e.stOff = e.plOn, e.plOff
		if e.briScale < 100 || e.briScale > 65535 {
			// Below 100 steps most percentages cannot be set, nor their
			// command confirmed.
			return nil, fmt.Errorf("brightness_scale: %v is not 100..65535 (Sortie's brightness is a percentage)", e.briScale)
		}
		e.keys = []string{"power"}
		if e.brightness {
			e.keys = append(e.keys, "brightness")
		}
		if e.colorTemp {
			e.keys = append(e.keys, "color_temp")
		}
	case "lock":
		e.plLock, e.plUnlock = r.str("payload_lock", "LOCK"), r.str("payload_unlock", "UNLOCK")
		e.stLocked, e.stUnlocked = r.str("state_locked", "LOCKED"), r.str("state_unlocked", "UNLOCKED")
		e.stLocking, e.stUnlock = r.str("state_locking", "LOCKING"), r.str("state_unlocking", "UNLOCKING")
		e.stOpen, e.stOpening = r.str("state_open", "OPEN"), r.str("state_opening", "OPENING")
		e.stJammed = r.str("state_jammed", "JAMMED")
		e.keys = []string{"locked"}
	case "cover":
		e.setPos, e.pos = r.topic("set_position_topic"), r.topic("position_topic")
		// position is the target in percent, value the number sent
		// without a template (scaled to position_open/closed).
		e.setPosTpl = r.command("set_position_template", "position", "value")
		e.posTpl = r.value("position_template")
		e.posOpen, e.posClosed = r.num("position_open", 100), r.num("position_closed", 0)
		e.stOpening, e.stClose = r.str("state_opening", "opening"), r.str("state_closing", "closing")
		e.stMoveEnd = []string{r.str("state_open", "open"), r.str("state_closed", "closed"), r.str("state_stopped", "stopped")}
		if e.setPos == "" || e.pos == "" {
			return nil, fmt.Errorf("a cover needs set_position_topic and position_topic: Sortie sets positions and confirms them by the position reported")
		}
		if e.posOpen == e.posClosed {
			return nil, fmt.Errorf("position_open and position_closed are both %v", e.posOpen)
		}
		e.keys = []string{"position"}
	case "climate":
		e.modeCmd, e.modeState = r.topic("mode_command_topic"), r.topic("mode_state_topic")
		e.modeCmdTpl = r.command("mode_command_template", "value")
		e.modeTpl = r.value("mode_state_template")
		e.modes = r.list("modes")
		if _, ok := cfg["modes"]; !ok {
			e.modes = []string{"auto", "off", "cool", "heat", "dry", "fan_only"}
		}
		e.tempCmd, e.tempState = r.topic("temperature_command_topic"), r.topic("temperature_state_topic")
		e.tempCmdTpl = r.command("temperature_command_template", "value")
		e.tempTpl = r.value("temperature_state_template")
		if e.modeCmd != "" {
			if e.modeState == "" {
				return nil, fmt.Errorf("mode_command_topic without mode_state_topic: Sortie confirms a command by the state the device reports")
			}
			e.keys = append(e.keys, "mode")
		}
		if e.tempCmd != "" {
			if e.tempState == "" {
				return nil, fmt.Errorf("temperature_command_topic without temperature_state_topic: Sortie confirms a command by the state the device reports")
			}
			e.keys = append(e.keys, "target")
		}
	default:
		return nil, fmt.Errorf("component %q is not one of %s", comp, strings.Join(Components, ", "))
	}
	if r.err != nil {
		return nil, r.err
	}
	if comp == "switch" || comp == "light" || comp == "lock" {
		if e.cmd == "" {
			return nil, fmt.Errorf("command_topic: missing")
		}
		if e.state == "" {
			return nil, fmt.Errorf("state_topic: missing; Sortie confirms a command by the state the device reports (an entity without one is optimistic)")
		}
	}
	if err := e.parseAvailability(r); err != nil {
		return nil, err
	}
	return e, r.err
}

func (e *entity) parseAvailability(r *reader) error {
	if t := r.topic("availability_topic"); t != "" {
		if _, both := r.m["availability"]; both {
			return fmt.Errorf("availability and availability_topic: a config has one or the other")
		}
		e.avty = append(e.avty, availability{
			topic: t, on: r.str("payload_available", "online"), off: r.str("payload_not_available", "offline"),
			tpl: r.value("availability_template"),
		})
	}
	if v, ok := r.m["availability"]; ok {
		list, ok := v.([]any)
		if !ok {
			return fmt.Errorf("availability: a list of {topic, payload_available, payload_not_available, value_template}")
		}
		for i, it := range list {
			m, ok := it.(map[string]any)
			if !ok {
				return fmt.Errorf("availability[%d]: not a table", i)
			}
			ar := &reader{m: m}
			a := availability{topic: ar.topic("topic"), on: ar.str("payload_available", "online"),
				off: ar.str("payload_not_available", "offline"), tpl: ar.value("value_template")}
			if ar.err != nil {
				return fmt.Errorf("availability[%d]: %w", i, ar.err)
			}
			if a.topic == "" {
				return fmt.Errorf("availability[%d]: topic: missing", i)
			}
			e.avty = append(e.avty, a)
		}
	}
	e.avtyMode = r.str("availability_mode", "latest")
	if !slices.Contains([]string{"latest", "any", "all"}, e.avtyMode) {
		return fmt.Errorf("availability_mode: %q is not latest, any or all", e.avtyMode)
	}
	return nil
}

// topics are the topics the entity's state and availability are read
// from.
func (e *entity) topics() []string {
	var t []string
	for _, s := range []string{e.state, e.briState, e.ctState, e.pos, e.modeState, e.tempState} {
		if s != "" {
			t = append(t, s)
		}
	}
	for _, a := range e.avty {
		t = append(t, a.topic)
	}
	slices.Sort(t)
	return slices.Compact(t)
}

// Settings is what the registry's [protocols.homeassistant] table says.
type Settings struct {
	// Prefix is where discovery configs are published ("homeassistant").
	Prefix string
}

// DefaultPrefix is Home Assistant's discovery prefix.
const DefaultPrefix = "homeassistant"

// ParseSettings reads the registry's [protocols.homeassistant] table.
func ParseSettings(m map[string]any) (Settings, error) {
	s := Settings{Prefix: DefaultPrefix}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		switch k {
		case "discovery_prefix":
			v, ok := m[k].(string)
			if !ok || v == "" || strings.ContainsAny(v, "+#\x00") {
				return s, fmt.Errorf("discovery_prefix: %v is not a topic prefix", m[k])
			}
			s.Prefix = strings.TrimSuffix(v, "/")
		default:
			return s, fmt.Errorf("unknown key %s (homeassistant takes discovery_prefix)", k)
		}
	}
	return s, nil
}
