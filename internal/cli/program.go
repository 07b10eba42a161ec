package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// Program is a command-line program described by its commands: Main
// dispatches a command line by them, and the program's usage, each
// command's -h and the shell completion (Completion) are all written
// from the same table, so none of them can name a command, an argument
// or a flag the others do not.
//
// A Program is read-only once built; Main may run concurrently.
type Program struct {
	// Name is the program as typed ("agent").
	Name string
	// Intro heads the usage, Outro ends it.
	Intro, Outro string
	// Default is the command run when the first argument is a flag:
	// "agent -config F" is "agent run -config F".
	Default string
	// NoArgs is the command run without arguments; empty, the program
	// prints its usage and exits ExitUsage.
	NoArgs string
	// Commands in the order the usage lists them. Main adds "help" and
	// "completion".
	Commands []*Command
	// FlagValues says how to complete the value of a flag, by the flag's
	// name, in every command (a command's own FlagValues come first).
	FlagValues map[string]Values
	// Pass names the flags that a Dynamic completion is given as they
	// are on the command line being completed (say, how to reach a
	// running agent).
	Pass []string
}

// Command is one command of a Program.
type Command struct {
	// Name is the word that selects it ("devices"; "list" under
	// "missions").
	Name string
	// Args follows the command in its usage: its arguments and chief
	// flags ("SCENE [key=value ...] [-wait]").
	Args string
	// Summary is its line in the program's usage.
	Summary string
	// Help is printed by its -h between the usage line and the flags;
	// Summary when empty.
	Help string
	// Group, on the first command of a group, heads the group in the
	// program's usage.
	Group string
	// ArgValues says how to complete each argument, by position.
	ArgValues []Values
	// FlagValues says how to complete the value of its flags, by name.
	FlagValues map[string]Values
	// Subs are its subcommands ("missions list"): Main runs the one
	// named by the first argument. A command has Subs or Run.
	Subs []*Command
	// Hidden commands are run but neither listed nor completed.
	Hidden bool
	// Run runs the command with the arguments after its name. It makes
	// its flags with Env.FlagSet and parses them with Parse, before it
	// does anything else: Completion learns its flags by running it with
	// -h.
	Run func(ctx context.Context, e *Env, args []string) error
}

// Values says how a shell completes a value: Files, Dirs, Words or
// Dynamic; empty, not at all.
type Values string

const (
	// Files completes file names.
	Files Values = "files"
	// Dirs completes directory names.
	Dirs Values = "dirs"
)

// Words completes one of words.
func Words(words ...string) Values { return Values("words " + strings.Join(words, " ")) }

// Dynamic completes the lines that "PROGRAM __complete KIND" prints,
// given the Program's Pass flags from the command line. The program
// implements that (hidden) command; it should print nothing, quickly,
// when it cannot tell.
func Dynamic(kind string) Values { return Values("dynamic " + kind) }

// CompleteCommand is the hidden command a Dynamic completion runs.
const CompleteCommand = "__complete"

// IO is where a command reads and writes.
type IO struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
}

// Env is what a command runs with.
type Env struct {
	IO
	prog *Program
	path string // "missions list"
	cmd  *Command
}

// Path is the command's name with its parents' ("missions list").
func (e *Env) Path() string { return e.path }

// FlagSet returns a new flag set for the command, named after it, whose
// usage (on -h, see Parse) is the command's: its usage line, its help
// and its flags.
func (e *Env) FlagSet() *flag.FlagSet {
	fs := flag.NewFlagSet(e.path, flag.ContinueOnError)
	fs.SetOutput(e.Stderr)
	head := e.prog.synopsis(e.path, e.cmd)
	help := e.cmd.Help
	if help == "" {
		help = e.cmd.Summary
	}
	fs.Usage = func() {
		_, _ = fmt.Fprintf(fs.Output(), "%s\n\n%s\n", head, help) // usage to the terminal; nothing to do if it fails
		n := 0
		fs.VisitAll(func(*flag.Flag) { n++ })
		if n > 0 {
			_, _ = fmt.Fprint(fs.Output(), "\nflags:\n") // as above
			fs.PrintDefaults()
		}
	}
	return fs
}

// HelpError is a request for a command's help (-h, -help, --help):
// Main prints Text on stdout and exits 0. It is a flag.ErrHelp.
type HelpError struct {
	// Text is the command's usage, help and flags.
	Text string
	// Flags is the command's flag set.
	Flags *flag.FlagSet
}

func (e *HelpError) Error() string { return flag.ErrHelp.Error() }

func (e *HelpError) Unwrap() error { return flag.ErrHelp }

// Parse parses args with fs, flags and arguments in any order
// ("missions show ID -v"), and returns the arguments; "--" ends the
// flags. -h returns a *HelpError, a bad flag a *UsageError, each with
// fs's usage; fs prints nothing itself.
func Parse(fs *flag.FlagSet, args []string) ([]string, error) {
	out := fs.Output()
	fs.SetOutput(io.Discard)
	defer fs.SetOutput(out)
	usage := func() string {
		var b strings.Builder
		fs.SetOutput(&b)
		if fs.Usage != nil {
			fs.Usage()
		} else {
			_, _ = fmt.Fprintf(&b, "usage of %s:\n", fs.Name()) // to a strings.Builder: cannot fail
			fs.PrintDefaults()
		}
		fs.SetOutput(io.Discard)
		return b.String()
	}
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, &HelpError{Text: usage(), Flags: fs}
			}
			return nil, &UsageError{Msg: fmt.Sprintf("%s: %v", fs.Name(), err), Usage: usage()}
		}
		args = fs.Args()
		switch {
		case len(args) == 0:
			return pos, nil
		case args[0] == "--":
			return append(pos, args[1:]...), nil
		}
		pos, args = append(pos, args[0]), args[1:]
	}
}

// isHelp says whether arg asks for help.
func isHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help" || arg == "help"
}

// commands are the program's commands with the built-in ones.
func (p *Program) commands() []*Command {
	return append(slices.Clip(p.Commands),
		&Command{Name: "completion", Args: "bash|zsh", Summary: "print a bash or zsh completion script",
			Help:      "Prints a script that completes the commands, their flags and values in\nthe shell (bash or zsh). See the README, \"Shell completion\".",
			ArgValues: []Values{Words("bash", "zsh")}, Run: p.cmdCompletion},
		&Command{Name: "help", Args: "[COMMAND]", Summary: "print the usage of the program, or of a command",
			Help: "Prints the program's usage or, given a command, the command's (as its -h does).", Run: p.cmdHelp},
	)
}

// find returns the command of a name among cmds, nil if none.
func find(cmds []*Command, name string) *Command {
	for _, c := range cmds {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// Main runs the command line args (without the program's name) and
// returns the exit code: 0 for success and for help, ExitUsage for a
// bad command line (its message and the command's usage on stderr), an
// ExitError's code, 1 for any other error.
func (p *Program) Main(ctx context.Context, args []string, io IO) int {
	name := p.Default
	switch {
	case len(args) == 0 && p.NoArgs == "":
		_, _ = fmt.Fprint(io.Stderr, p.Usage()) // the exit code says it already; nowhere else to report it
		return ExitUsage
	case len(args) == 0:
		name = p.NoArgs
	case isHelp(args[0]):
		name, args = "help", args[1:]
	case !strings.HasPrefix(args[0], "-"):
		name, args = args[0], args[1:]
	}
	cmd := find(p.commands(), name)
	if cmd == nil {
		return p.exit(io, &UsageError{Msg: fmt.Sprintf("unknown command %q", name), Usage: p.Usage()}, "")
	}
	path := name
	for len(cmd.Subs) > 0 {
		if len(args) > 0 && isHelp(args[0]) {
			return p.exit(io, &HelpError{Text: p.cmdUsage(path, cmd)}, path)
		}
		if len(args) == 0 || strings.HasPrefix(args[0], "-") {
			return p.exit(io, &UsageError{Msg: path + " needs one of: " + names(cmd.Subs)}, path)
		}
		sub := find(cmd.Subs, args[0])
		if sub == nil {
			return p.exit(io, &UsageError{Msg: fmt.Sprintf("%s: unknown %q (one of: %s)", path, args[0], names(cmd.Subs))}, path)
		}
		cmd, path, args = sub, path+" "+sub.Name, args[1:]
	}
	return p.exit(io, cmd.Run(ctx, &Env{IO: io, prog: p, path: path, cmd: cmd}, args), path)
}

// exit prints err and returns the exit code (Main).
func (p *Program) exit(io IO, err error, path string) int {
	var he *HelpError
	var ue *UsageError
	var xe *ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &he):
		_, _ = fmt.Fprint(io.Stdout, he.Text) // asked for; nothing to do if the terminal is gone
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &xe):
		_, _ = fmt.Fprintf(io.Stderr, "%s: %v\n", p.Name, err) // as below
		return xe.Code
	case errors.As(err, &ue):
		usage := ue.Usage
		if usage == "" {
			usage = p.Usage()
			if c := p.lookup(path); c != nil {
				usage = p.cmdUsage(path, c)
				if len(c.Subs) == 0 {
					usage += fmt.Sprintf("Run \"%s %s -h\" for its flags.\n", p.Name, path)
				}
			}
		}
		_, _ = fmt.Fprintf(io.Stderr, "%s: %v\n\n%s", p.Name, err, usage) // stderr is where errors go; nowhere else to report it
		return ExitUsage
	default:
		_, _ = fmt.Fprintf(io.Stderr, "%s: %v\n", p.Name, err) // as above
		return 1
	}
}

// lookup returns the command at path ("missions list"), nil if none.
func (p *Program) lookup(path string) *Command {
	cmds := p.commands()
	var c *Command
	for name := range strings.FieldsSeq(path) {
		if c = find(cmds, name); c == nil {
			return nil
		}
		cmds = c.Subs
	}
	return c
}

// names lists the visible commands of cmds.
func names(cmds []*Command) string {
	var s []string
	for _, c := range cmds {
		if !c.Hidden {
			s = append(s, c.Name)
		}
	}
	return strings.Join(s, ", ")
}

// summaryColumn is where the summaries start in a usage.
const summaryColumn = 41

// line writes a command's line in a usage: "  agent PATH ARGS  summary".
func (p *Program) line(b *strings.Builder, path string, c *Command) {
	s := "  " + p.Name + " " + path
	if c.Args != "" {
		s += " " + c.Args
	}
	if c.Summary == "" {
		b.WriteString(s + "\n")
		return
	}
	if len(s) >= summaryColumn-1 {
		b.WriteString(s + "\n")
		s = ""
	}
	b.WriteString(s + strings.Repeat(" ", summaryColumn-len(s)) + c.Summary + "\n")
}

// Usage is the program's usage: every visible command with its
// arguments and summary.
func (p *Program) Usage() string {
	var b strings.Builder
	b.WriteString(p.Intro + "\n\nUsage:\n")
	for _, c := range p.commands() {
		if c.Hidden {
			continue
		}
		if c.Group != "" {
			b.WriteString("\n" + c.Group + "\n")
		}
		if len(c.Subs) == 0 {
			p.line(&b, c.Name, c)
		}
		for _, s := range c.Subs {
			if !s.Hidden {
				p.line(&b, c.Name+" "+s.Name, s)
			}
		}
	}
	if p.Outro != "" {
		b.WriteString("\n" + p.Outro + "\n")
	}
	return b.String()
}

// synopsis is a command's usage line ("usage: agent devices [-json]");
// a command with subcommands has one line for each.
func (p *Program) synopsis(path string, c *Command) string {
	if len(c.Subs) == 0 {
		return strings.TrimRight("usage: "+p.Name+" "+path+" "+c.Args, " ")
	}
	var b strings.Builder
	b.WriteString("usage:\n")
	for _, s := range c.Subs {
		if !s.Hidden {
			p.line(&b, path+" "+s.Name, s)
		}
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// cmdUsage is a command's usage without its flags: its usage line, and
// its help (a command with subcommands).
func (p *Program) cmdUsage(path string, c *Command) string {
	s := p.synopsis(path, c) + "\n"
	if len(c.Subs) > 0 && c.Help != "" {
		s += "\n" + c.Help + "\n"
	}
	return s
}

// cmdHelp is "help [COMMAND ...]": the program's usage, or the
// command's own help.
func (p *Program) cmdHelp(ctx context.Context, e *Env, args []string) error {
	pos, err := Parse(e.FlagSet(), args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		_, err := fmt.Fprint(e.Stdout, p.Usage())
		return err
	}
	c := p.lookup(strings.Join(pos, " "))
	if c == nil {
		return &UsageError{Msg: fmt.Sprintf("help: unknown command %q", strings.Join(pos, " "))}
	}
	if len(c.Subs) > 0 {
		return &HelpError{Text: p.cmdUsage(strings.Join(pos, " "), c)}
	}
	return c.Run(ctx, &Env{IO: e.IO, prog: p, path: strings.Join(pos, " "), cmd: c}, []string{"-h"})
}

// cmdCompletion is "completion bash|zsh".
func (p *Program) cmdCompletion(ctx context.Context, e *Env, args []string) error {
	pos, err := Parse(e.FlagSet(), args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return &UsageError{Msg: "completion takes one shell: bash or zsh"}
	}
	return p.Completion(ctx, e.Stdout, pos[0])
}
