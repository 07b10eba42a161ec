// Package conf holds what the agent's and the hub's configuration loaders
// share: strict TOML decoding over defaults, errors that name the file and
// field, and paths relative to the config file.
package conf

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/BurntSushi/toml"
)

// Error names the file and field of a bad setting.
type Error struct {
	File  string
	Field string
	Msg   string
}

func (e *Error) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("%s: %s", e.File, e.Msg)
	}
	return fmt.Sprintf("%s: %s: %s", e.File, e.Field, e.Msg)
}

// Decode reads the TOML file at path into v, which holds the defaults,
// and rejects unknown keys: a misspelt key must not silently leave a
// default in place.
func Decode(path string, v any) error {
	md, err := toml.DecodeFile(path, v)
	if err != nil {
		var perr toml.ParseError
		if errors.As(err, &perr) {
			return &Error{File: path, Msg: fmt.Sprintf("line %d: %s", perr.Position.Line, perr.Message)}
		}
		if e := bracketsError(path, err); e != nil {
			return e
		}
		return &Error{File: path, Msg: err.Error()}
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		msg := "unknown key"
		if len(keys) > 1 {
			msg += " (all unknown: " + strings.Join(keys, ", ") + ")"
		}
		return &Error{File: path, Field: keys[0], Msg: msg}
	}
	return nil
}

// The TOML library's messages for a table given where a list of tables
// is due, and for a list of tables given where one table is due.
var (
	tableForList = regexp.MustCompile(`line (\d+) \(last key "([^"]+)"\): incompatible types: TOML value has type map\[.*; destination has type slice`)
	listForTable = regexp.MustCompile(`line (\d+) \(last key "([^"]+)"\): type mismatch for .*: expected table but found \[\]map\[`)
)

// bracketsError explains the type mismatch that [x] for [[x]], or the
// reverse, causes, in the terms of the file rather than of Go types.
func bracketsError(path string, err error) *Error {
	if m := tableForList.FindStringSubmatch(err.Error()); m != nil {
		return &Error{File: path, Field: m[2], Msg: fmt.Sprintf("line %s: a list: write [[%s]] (double brackets) before each entry, not [%s]", m[1], m[2], m[2])}
	}
	if m := listForTable.FindStringSubmatch(err.Error()); m != nil {
		return &Error{File: path, Field: m[2], Msg: fmt.Sprintf("line %s: a single table: write [%s] (single brackets), once, not [[%s]]", m[1], m[2], m[2])}
	}
	return nil
}

// Resolve makes p relative to dir unless it is empty or absolute.
func Resolve(dir, p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(dir, p)
}
