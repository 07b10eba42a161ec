package homeassistant

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Home Assistant's templates are Jinja2. Sortie evaluates a small, safe
// subset, enough for the value templates of Zigbee2MQTT's and
// ESPHome's discovery configs and of most hand-written ones, and says so
// clearly for anything else rather than emulating Jinja:
//
//	{{ value }}                      the payload as text
//	{{ value_json.a.b }}             a member of the JSON payload
//	{{ value_json['a'] }}, ["a"]     the same, for keys that are not names
//	... | lower | upper | int | float | round(n) | default(x)
//	int(d), float(d): d for what is not a number (without it, as in
//	Home Assistant, what is not a number says nothing)
//
// Command templates are text with placeholders of their variables
// ({{ value }}, {{ position }}) and nothing else.
const templateHelp = "Sortie evaluates {{ value }} and {{ value_json.a.b }} (or value_json['a']), with the filters lower, upper, int, float (each with an optional default), round(n) and default(x)"

// valueTemplate is a parsed value template: a path into the payload and
// filters to apply to what it finds.
type valueTemplate struct {
	src     string
	json    bool     // value_json rather than value
	path    []string // members of value_json
	filters []filter
}

type filter struct {
	name string
	arg  string // round's digits, default's text
}

// parseValueTemplate parses src, the whole of a value template.
func parseValueTemplate(src string) (*valueTemplate, error) {
	s := strings.TrimSpace(src)
	inner, ok := strings.CutPrefix(s, "{{")
	if ok {
		inner, ok = strings.CutSuffix(inner, "}}")
	}
	if !ok || strings.Contains(inner, "{{") || strings.Contains(inner, "{%") || strings.Contains(inner, "}}") {
		return nil, fmt.Errorf("template %q: %s, as the whole template", src, templateHelp)
	}
	parts := strings.Split(inner, "|")
	t := &valueTemplate{src: src}
	head := strings.TrimSpace(parts[0])
	switch {
	case head == "value":
	case head == "value_json":
		t.json = true
	case strings.HasPrefix(head, "value_json.") || strings.HasPrefix(head, "value_json["):
		t.json = true
		path, err := parsePath(head[len("value_json"):])
		if err != nil {
			return nil, fmt.Errorf("template %q: %w; %s", src, err, templateHelp)
		}
		t.path = path
	default:
		return nil, fmt.Errorf("template %q: %q is neither value nor value_json; %s", src, head, templateHelp)
	}
	for _, p := range parts[1:] {
		f, err := parseFilter(strings.TrimSpace(p))
		if err != nil {
			return nil, fmt.Errorf("template %q: %w; %s", src, err, templateHelp)
		}
		t.filters = append(t.filters, f)
	}
	return t, nil
}

// parsePath reads .a.b['c']["d"] into its members.
func parsePath(s string) ([]string, error) {
	var path []string
	for s != "" {
		switch s[0] {
		case '.':
			s = s[1:]
			n := 0
			for n < len(s) && (s[n] == '_' || s[n] >= 'a' && s[n] <= 'z' || s[n] >= 'A' && s[n] <= 'Z' || s[n] >= '0' && s[n] <= '9') {
				n++
			}
			if n == 0 {
				return nil, fmt.Errorf("a '.' not followed by a name")
			}
			path = append(path, s[:n])
			s = s[n:]
		case '[':
			if len(s) < 4 || s[1] != '\'' && s[1] != '"' {
				return nil, fmt.Errorf("a '[' not followed by a quoted key")
			}
			end := strings.IndexByte(s[2:], s[1])
			if end < 0 || 2+end+1 >= len(s) || s[2+end+1] != ']' {
				return nil, fmt.Errorf("an unterminated ['key']")
			}
			path = append(path, s[2:2+end])
			s = s[2+end+2:]
		default:
			return nil, fmt.Errorf("unexpected %q", s)
		}
	}
	return path, nil
}

func parseFilter(s string) (filter, error) {
	name, arg, hasArg := strings.Cut(s, "(")
	name = strings.TrimSpace(name)
	if hasArg {
		var ok bool
		arg, ok = strings.CutSuffix(strings.TrimSpace(arg), ")")
		if !ok {
			return filter{}, fmt.Errorf("filter %q: unterminated argument", s)
		}
		arg = strings.TrimSpace(arg)
	}
	switch name {
	case "lower", "upper":
		if hasArg && arg != "" {
			return filter{}, fmt.Errorf("filter %s takes no argument", name)
		}
	case "int", "float":
		// int(0), float(0): the default for what is not a number.
		if arg != "" {
			if _, err := strconv.ParseFloat(arg, 64); err != nil {
				return filter{}, fmt.Errorf("%s(%s): the default must be a number", name, arg)
			}
		}
	case "round":
		if !hasArg || arg == "" {
			arg = "0"
		}
		if n, err := strconv.Atoi(arg); err != nil || n < 0 || n > 6 {
			return filter{}, fmt.Errorf("round(%s): the digits must be 0..6", arg)
		}
	case "default":
		if len(arg) >= 2 && (arg[0] == '\'' || arg[0] == '"') && arg[len(arg)-1] == arg[0] {
			arg = arg[1 : len(arg)-1]
		} else if _, err := strconv.ParseFloat(arg, 64); err != nil {
			return filter{}, fmt.Errorf("default(%s): a quoted text or a number", arg)
		}
	default:
		return filter{}, fmt.Errorf("filter %q is not one Sortie evaluates", name)
	}
	return filter{name: name, arg: arg}, nil
}

// eval renders the template for payload. ok is false when the payload
// does not hold what the template reads (no such member, not JSON) and
// no default is given: the message then says nothing of that value.
func (t *valueTemplate) eval(payload []byte) (string, bool) {
	var out string
	found := true
	switch {
	case t == nil || !t.json:
		out = string(payload)
	default:
		d := json.NewDecoder(bytes.NewReader(payload))
		d.UseNumber()
		var v any
		if err := d.Decode(&v); err != nil {
			found = false
			break
		}
		for _, k := range t.path {
			m, isMap := v.(map[string]any)
			if !isMap {
				found = false
				break
			}
			if v, found = m[k]; !found {
				break
			}
		}
		if found {
			out, found = render(v)
		}
	}
	if t == nil {
		return out, found
	}
	for _, f := range t.filters {
		switch f.name {
		case "default":
			if !found {
				out, found = f.arg, true
			}
		case "lower":
			out = strings.ToLower(out)
		case "upper":
			out = strings.ToUpper(out)
		case "int", "float", "round":
			if !found {
				continue
			}
			n, err := strconv.ParseFloat(strings.TrimSpace(out), 64)
			if err != nil || math.IsNaN(n) || math.IsInf(n, 0) {
				if f.name == "round" || f.arg == "" {
					// Home Assistant's filters fail to render what is not
					// a number when given no default: the message says
					// nothing of the value.
					out, found = "", false
					continue
				}
				n, _ = strconv.ParseFloat(f.arg, 64)
			}
			switch f.name {
			case "int":
				out = strconv.FormatInt(int64(n), 10)
			case "float":
				out = pyFloat(n)
			default:
				// Home Assistant's round: Python's (half to even), an
				// integer at precision 0.
				digits, _ := strconv.Atoi(f.arg)
				p := math.Pow(10, float64(digits))
				if out = pyFloat(math.RoundToEven(n*p) / p); digits == 0 {
					out = strconv.FormatFloat(math.RoundToEven(n), 'f', 0, 64)
				}
			}
		}
	}
	return out, found
}

// pyFloat prints a float as Python does: always with a decimal point.
func pyFloat(n float64) string {
	t := strconv.FormatFloat(n, 'f', -1, 64)
	if !strings.Contains(t, ".") {
		t += ".0"
	}
	return t
}

// render is a JSON value as Jinja prints it: text as itself, numbers as
// written, true and false as Python's True and False.
func render(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case json.Number:
		return x.String(), true
	case bool:
		if x {
			return "True", true
		}
		return "False", true
	case nil:
		return "None", true
	}
	b, _ := json.Marshal(v) // maps and lists: what a template then compares never matches
	return string(b), true
}

// commandTemplate is a command template: text with placeholders of its
// variables.
type commandTemplate struct {
	parts []string // text, then a variable's place, alternately
	vars  []string // the variable of each place
}

// parseCommandTemplate parses src whose only placeholders are of
// variables.
func parseCommandTemplate(src string, variables ...string) (*commandTemplate, error) {
	names := "{{ " + strings.Join(variables, " }}, {{ ") + " }}"
	if strings.Contains(src, "{%") {
		return nil, fmt.Errorf("command template %q: statements ({%% ... %%}) are not evaluated; only %s placeholders in text", src, names)
	}
	t := &commandTemplate{}
	rest := src
	for {
		open := strings.Index(rest, "{{")
		if open < 0 {
			if strings.Contains(rest, "}}") {
				return nil, fmt.Errorf("command template %q: an unmatched }}", src)
			}
			t.parts = append(t.parts, rest)
			return t, nil
		}
		end := strings.Index(rest[open:], "}}")
		if end < 0 {
			return nil, fmt.Errorf("command template %q: an unterminated {{", src)
		}
		v := strings.TrimSpace(rest[open+2 : open+end])
		if !slices.Contains(variables, v) {
			return nil, fmt.Errorf("command template %q: {{ %s }} is not evaluated; only %s placeholders in text", src, v, names)
		}
		t.parts = append(t.parts, rest[:open])
		t.vars = append(t.vars, v)
		rest = rest[open+end+2:]
	}
}

// render puts the variables' values in the template's places; without
// a template the payload is value's.
func (t *commandTemplate) render(values map[string]string) string {
	if t == nil {
		return values["value"]
	}
	var b strings.Builder
	for i, p := range t.parts {
		b.WriteString(p)
		if i < len(t.vars) {
			b.WriteString(values[t.vars[i]])
		}
	}
	return b.String()
}
