package cli

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
)

// Params reads a command's key=value arguments (a scene's parameters)
// into JSON-ready values: a number or boolean when the value looks like
// one, a string otherwise ("..." forces a string). An argument without
// "=", or with an empty key, is a usage error.
func Params(args []string) (map[string]any, error) {
	params := map[string]any{}
	for _, kv := range args {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, &UsageError{Msg: fmt.Sprintf("parameter %q is not key=value", kv)}
		}
		params[k] = paramValue(v)
	}
	return params, nil
}

// jsonNumber matches JSON's number grammar: such values are sent as
// numbers, exactly as typed.
var jsonNumber = regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$`)

// paramValue reads one parameter's value.
func paramValue(v string) any {
	switch {
	case v == "true":
		return true
	case v == "false":
		return false
	case jsonNumber.MatchString(v):
		return json.Number(v)
	case len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"':
		return v[1 : len(v)-1]
	}
	return v
}
