package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// toy is a small program: a default command, a command with
// subcommands, and errors on demand.
func toy() *Program {
	run := func(_ context.Context, e *Env, args []string) error {
		fs := e.FlagSet()
		fs.Bool("json", false, "print JSON")
		fs.String("addr", "", "where the service is")
		pos, err := Parse(fs, args)
		switch {
		case err != nil:
			return err
		case len(pos) > 1:
			return &UsageError{Msg: "too many arguments"}
		case len(pos) == 1 && pos[0] == "fail":
			return errors.New("disk on fire")
		case len(pos) == 1 && pos[0] == "lose":
			return &ExitError{Code: 3, Err: errors.New("mission ended FAILED")}
		}
		_, err = fmt.Fprintf(e.Stdout, "ran %s %q\n", e.Path(), pos)
		return err
	}
	return &Program{
		Name: "toy", Intro: "Toy - a program for tests.", Default: "go",
		Commands: []*Command{
			{Name: "go", Args: "[THING] [-json]", Summary: "go somewhere", Run: run},
			{Name: "box", Summary: "boxes", Help: "Boxes, opened and shut.", Subs: []*Command{
				{Name: "open", Args: "ID", Summary: "open a box", Run: run},
				{Name: "shut", Args: "ID", Summary: "shut a box", Run: run},
			}},
		},
	}
}

func TestMainMapsCommandLinesToCodesAndMessages(t *testing.T) {
	for _, c := range []struct {
		name           string
		args           []string
		code           int
		stdout, stderr string // contained; "" is empty
	}{
		{"a command", []string{"go", "x", "-json"}, 0, `ran go ["x"]`, ""},
		{"flags first run the default", []string{"-json", "x"}, 0, `ran go ["x"]`, ""},
		{"a subcommand", []string{"box", "open", "7"}, 0, `ran box open ["7"]`, ""},
		{"the program's help", []string{"--help"}, 0, "  toy box open ID                        open a box\n", ""},
		{"a command's help", []string{"go", "-h"}, 0, "usage: toy go [THING] [-json]\n\ngo somewhere\n\nflags:\n  -addr string\n", ""},
		{"help on a command", []string{"help", "box", "shut"}, 0, "usage: toy box shut ID\n", ""},
		{"a group's help", []string{"box", "-help"}, 0, "usage:\n  toy box open ID", ""},
		{"no arguments", nil, ExitUsage, "", "Usage:\n"},
		{"unknown command", []string{"fly"}, ExitUsage, "", "toy: unknown command \"fly\"\n\nToy - a program"},
		{"a group without its subcommand", []string{"box"}, ExitUsage, "", "toy: box needs one of: open, shut\n\nusage:\n  toy box open ID"},
		{"an unknown subcommand", []string{"box", "lift"}, ExitUsage, "", "toy: box: unknown \"lift\" (one of: open, shut)"},
		{"a bad flag: once, with the flags", []string{"go", "-x"}, ExitUsage, "", "toy: go: flag provided but not defined: -x\n\nusage: toy go [THING] [-json]\n\ngo somewhere\n\nflags:\n"},
		{"a bad argument: the command's usage", []string{"go", "a", "b"}, ExitUsage, "", "toy: too many arguments\n\nusage: toy go [THING] [-json]\nRun \"toy go -h\" for its flags.\n"},
		{"a failure", []string{"go", "fail"}, 1, "", "toy: disk on fire\n"},
		{"an exit code", []string{"go", "lose"}, 3, "", "toy: mission ended FAILED\n"},
		{"no script for this shell", []string{"completion", "fish"}, ExitUsage, "", `no script for shell "fish"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out, errb strings.Builder
			code := toy().Main(context.Background(), c.args, IO{Stdout: &out, Stderr: &errb})
			ok := func(got, want string) bool {
				return want == "" && got == "" || want != "" && strings.Contains(got, want)
			}
			if code != c.code || !ok(out.String(), c.stdout) || !ok(errb.String(), c.stderr) || strings.Count(errb.String(), "not defined") > 1 {
				t.Errorf("toy %q: exit %d, want %d\nstdout:\n%s\nwant it to hold:\n%s\nstderr:\n%s\nwant it to hold:\n%s", c.args, code, c.code, out.String(), c.stdout, errb.String(), c.stderr)
			}
		})
	}
}

// TestCompletionLearnsEachCommandsFlagsFromItsFlagSet: the script names
// the flags the command's flag set defines, and a command that does not
// parse its flags with Parse is an error, not a script without them.
func TestCompletionLearnsEachCommandsFlagsFromItsFlagSet(t *testing.T) {
	var b strings.Builder
	if err := toy().Completion(context.Background(), &b, "bash"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"('box open') REPLY='-addr -json' ;;", "('box') REPLY='open shut' ;;", "('go') REPLY='addr' ;;", "complete -F _sortie_toy toy"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the script has no %q:\n%s", want, b.String())
		}
	}
	p := toy()
	p.Commands = append(p.Commands, &Command{Name: "odd", Run: func(context.Context, *Env, []string) error { return nil }})
	if err := p.Completion(context.Background(), &b, "zsh"); err == nil || !strings.Contains(err.Error(), "toy odd -h") {
		t.Errorf("a command that ignores -h: %v, want an error naming it", err)
	}
}

func TestParamValue(t *testing.T) {
	cases := []struct {
		in   string
		want any
	}{
		{"23", json.Number("23")},
		{"-1.5", json.Number("-1.5")},
		{"1e3", json.Number("1e3")},
		{"true", true},
		{"false", false},
		{"hello", "hello"},
		{`"42"`, "42"},
		{"007", "007"},
		{"NaN", "NaN"},
		{"", ""},
		{"1.", "1."},
	}
	for _, c := range cases {
		if got := paramValue(c.in); got != c.want {
			t.Errorf("paramValue(%q) = %#v, want %#v", c.in, got, c.want)
		}
	}
}
