package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// Completion writes the completion script of shell ("bash" or "zsh")
// for the program: its commands, subcommands and each command's flags,
// the values its Commands say how to complete, and for Dynamic ones a
// call of the program itself ("PROGRAM __complete KIND", with the Pass
// flags from the command line). The script's functions are named
// _sortie_PROGRAM.
//
// Each command's flags are those its flag set defines: Completion runs
// every command with -h and reads them from the *HelpError.
func (p *Program) Completion(ctx context.Context, w io.Writer, shell string) error {
	var tmpl, list, none string
	var g gen
	switch shell {
	case "bash":
		tmpl, g, list, none = bashScript, bashGen{}, "REPLY", "REPLY="
	case "zsh":
		tmpl, g, list, none = zshScript, zshGen{}, "reply", "reply=()"
	default:
		return &UsageError{Msg: fmt.Sprintf("completion: no script for shell %q (bash or zsh)", shell)}
	}
	nodes, err := p.nodes(ctx)
	if err != nil {
		return err
	}
	var script, subs, flags, valued, values strings.Builder
	for _, n := range nodes {
		if len(n.subs) > 0 {
			g.subs(&subs, n)
			continue
		}
		g.flags(&flags, n)
		var names []string
		for _, f := range n.flags {
			if !isBool(f) {
				names = append(names, f.Name)
			}
			if v := n.flagValues(p, f.Name); v != "" {
				caseLine(&values, n.path+" -"+f.Name, quote(string(v)), "REPLY=")
			}
		}
		if len(names) > 0 {
			caseLine(&valued, n.path, quote(strings.Join(names, " ")), "REPLY=")
		}
		for i, v := range n.cmd.ArgValues {
			if v != "" {
				caseLine(&values, fmt.Sprintf("%s #%d", n.path, i), quote(string(v)), "REPLY=")
			}
		}
	}
	pass := "(__none__) ;;"
	if len(p.Pass) > 0 {
		pass = "(" + strings.Join(p.Pass, "|") + `) pass+=("-$1" "$2") ;;`
	}
	_, err = strings.NewReplacer(
		"@TABLES@", tables,
	).WriteString(&script, tmpl)
	if err != nil {
		return err
	}
	_, err = strings.NewReplacer(
		"@LIST@", list, "@NONE@", none, "@FN@", "_sortie_"+p.Name, "@PROG@", p.Name, "@DEFAULT@", p.Default, "@COMPLETE@", CompleteCommand,
		"@SUBS@", subs.String(), "@FLAGS@", flags.String(), "@VALUED@", valued.String(),
		"@VALUES@", values.String(), "@PASS@", pass,
	).WriteString(w, script.String())
	return err
}

// node is a command as completion sees it: its subcommands or its flags.
type node struct {
	path  string // "" for the program
	cmd   *Command
	subs  []*Command
	flags []*flag.Flag
}

// flagValues says how to complete the value of the node's flag.
func (n node) flagValues(p *Program, name string) Values {
	if v, ok := n.cmd.FlagValues[name]; ok {
		return v
	}
	return p.FlagValues[name]
}

// nodes lists the program and its visible commands, depth first.
func (p *Program) nodes(ctx context.Context) ([]node, error) {
	var out []node
	var walk func(path string, c *Command, cmds []*Command) error
	walk = func(path string, c *Command, cmds []*Command) error {
		if cmds == nil {
			flags, err := p.flagsOf(ctx, path, c)
			out = append(out, node{path: path, cmd: c, flags: flags})
			return err
		}
		n := node{path: path, cmd: c}
		for _, s := range cmds {
			if !s.Hidden {
				n.subs = append(n.subs, s)
			}
		}
		out = append(out, n)
		for _, s := range n.subs {
			if err := walk(strings.TrimSpace(path+" "+s.Name), s, s.Subs); err != nil {
				return err
			}
		}
		return nil
	}
	return out, walk("", &Command{}, p.commands())
}

// flagsOf runs the command with -h and returns the flags it defined.
func (p *Program) flagsOf(ctx context.Context, path string, c *Command) ([]*flag.Flag, error) {
	quiet := IO{Stdin: strings.NewReader(""), Stdout: io.Discard, Stderr: io.Discard}
	err := c.Run(ctx, &Env{IO: quiet, prog: p, path: path, cmd: c}, []string{"-h"})
	var he *HelpError
	if !errors.As(err, &he) || he.Flags == nil {
		msg := fmt.Sprintf("completion: %s %s -h did not return its flags (does it parse them with cli.Parse?)", p.Name, path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", msg, err)
		}
		return nil, errors.New(msg)
	}
	var flags []*flag.Flag
	he.Flags.VisitAll(func(f *flag.Flag) { flags = append(flags, f) })
	return flags, nil
}

// isBool says whether a flag takes no value.
func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// gen writes a shell's case arms.
type gen interface {
	subs(b *strings.Builder, n node)
	flags(b *strings.Builder, n node)
}

// caseLine writes one arm of a case statement: (key) set value ;;
func caseLine(b *strings.Builder, key, value, set string) {
	fmt.Fprintf(b, "\t(%s) %s%s ;;\n", quote(key), set, value)
}

// quote quotes s for either shell.
func quote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

type bashGen struct{}

func (bashGen) subs(b *strings.Builder, n node) {
	var s []string
	for _, c := range n.subs {
		s = append(s, c.Name)
	}
	caseLine(b, n.path, quote(strings.Join(s, " ")), "REPLY=")
}

func (bashGen) flags(b *strings.Builder, n node) {
	var s []string
	for _, f := range n.flags {
		s = append(s, "-"+f.Name)
	}
	if len(s) > 0 {
		caseLine(b, n.path, quote(strings.Join(s, " ")), "REPLY=")
	}
}

type zshGen struct{}

// described is "name:what it does" for zsh's _describe.
func described(name, what string) string {
	what, _, _ = strings.Cut(what, "\n")
	return quote(strings.ReplaceAll(name, ":", `\:`) + ":" + what)
}

func (zshGen) subs(b *strings.Builder, n node) {
	var s []string
	for _, c := range n.subs {
		s = append(s, described(c.Name, c.Summary))
	}
	caseLine(b, n.path, "("+strings.Join(s, " ")+")", "reply=")
}

func (zshGen) flags(b *strings.Builder, n node) {
	var s []string
	for _, f := range n.flags {
		_, usage := flag.UnquoteUsage(f)
		s = append(s, described("-"+f.Name, usage))
	}
	if len(s) > 0 {
		caseLine(b, n.path, "("+strings.Join(s, " ")+")", "reply=")
	}
}

// tables are the command table in either shell: case statements that
// answer in REPLY, or (zsh) the lists with descriptions in reply.
const tables = `# @FN@_subs NODE: the subcommands of NODE ("" is @PROG@ itself), in @LIST@.
@FN@_subs() {
	case $1 in
@SUBS@	(*) @NONE@ ;;
	esac
}

# @FN@_flags NODE: the flags of command NODE, in @LIST@.
@FN@_flags() {
	case $1 in
@FLAGS@	(*) @NONE@ ;;
	esac
}

# @FN@_valued NODE: those of its flags that take a value, in REPLY.
@FN@_valued() {
	case $1 in
@VALUED@	(*) REPLY= ;;
	esac
}

# @FN@_values "NODE -FLAG" or "NODE #N": how to complete the flag's
# value or the Nth argument (files, dirs, words W..., dynamic KIND), in
# REPLY.
@FN@_values() {
	case $1 in
@VALUES@	(*) REPLY= ;;
	esac
}

# @FN@_pass FLAG VALUE: keeps the flags a dynamic completion needs.
@FN@_pass() {
	case $1 in
	@PASS@
	esac
}

# @FN@_flag WORD: a flag on the command line before the cursor (the
# default command's when it comes first): kept if a dynamic completion
# needs it, and if its value is the next word, want is its name.
@FN@_flag() {
	local name=${1#-}
	name=${name#-}
	[[ -z $node ]] && node=@DEFAULT@
	if [[ $name == *=* ]]; then
		@FN@_pass "${name%%=*}" "${name#*=}"
	else
		@FN@_valued "$node"
		[[ " $REPLY " == *" $name "* ]] && want=$name
	fi
}

`

// bashScript walks the words before the cursor to find the command (and
// subcommand), the arguments so far, the flag awaiting a value and the
// Pass flags given, then completes the word at the cursor: a flag's
// value, a flag, a subcommand or an argument.
const bashScript = `# bash completion for @PROG@, written by "@PROG@ completion bash".
#   @PROG@ completion bash > /usr/share/bash-completion/completions/@PROG@
# or, in ~/.bashrc:
#   source <(@PROG@ completion bash)

@TABLES@@FN@() {
	local cur=${COMP_WORDS[COMP_CWORD]} prog=${COMP_WORDS[0]}
	local node= want= dashdash= w REPLY
	local -i i pos=0
	local -a pass=()
	[[ $prog == "~/"* ]] && prog=$HOME/${prog#"~/"}
	for ((i = 1; i < COMP_CWORD; i++)); do
		w=${COMP_WORDS[i]}
		if [[ -n $want ]]; then
			# "-flag=value" reaches here as -flag, =, value.
			[[ $w == = ]] && continue
			@FN@_pass "$want" "$w"
			want=
		elif [[ -z $dashdash && $w == -- ]]; then
			dashdash=1
		elif [[ -z $dashdash && $w == -?* ]]; then
			@FN@_flag "$w"
		elif [[ $w == = ]]; then
			want=- # the value of a flag that needs none: skipped
		else
			@FN@_subs "$node"
			if ((pos == 0)) && [[ " $REPLY " == *" $w "* ]]; then
				node=${node:+$node }$w
			else
				pos+=1
			fi
		fi
	done
	[[ $cur == = ]] && cur=
	COMPREPLY=()
	if [[ -n $want ]]; then
		[[ $want == - ]] && return 0
		@FN@_values "$node -$want"
	elif [[ -z $dashdash && $cur == -* ]]; then
		[[ -z $node ]] && node=@DEFAULT@
		@FN@_flags "$node"
		[[ $cur == --* ]] && REPLY=${REPLY//' -'/' --'} REPLY=-$REPLY
		mapfile -t COMPREPLY < <(compgen -W "$REPLY" -- "$cur")
		return 0
	else
		@FN@_subs "$node"
		if ((pos == 0)) && [[ -n $REPLY ]]; then
			mapfile -t COMPREPLY < <(compgen -W "$REPLY" -- "$cur")
			return 0
		fi
		@FN@_values "$node #$pos"
		if [[ -z $REPLY ]]; then
			@FN@_flags "$node"
			mapfile -t COMPREPLY < <(compgen -W "$REPLY" -- "$cur")
			return 0
		fi
	fi
	case $REPLY in
	(files)
		compopt -o filenames 2>/dev/null
		mapfile -t COMPREPLY < <(compgen -f -- "$cur") ;;
	(dirs)
		compopt -o filenames 2>/dev/null
		mapfile -t COMPREPLY < <(compgen -d -- "$cur") ;;
	("words "*)
		mapfile -t COMPREPLY < <(compgen -W "${REPLY#words }" -- "$cur") ;;
	("dynamic "*)
		mapfile -t COMPREPLY < <(compgen -W "$("$prog" @COMPLETE@ "${REPLY#dynamic }" "${pass[@]}" 2>/dev/null)" -- "$cur") ;;
	esac
	return 0
}

complete -F @FN@ @PROG@
`

// zshScript is bashScript's walk in zsh, with descriptions.
const zshScript = `#compdef @PROG@
# zsh completion for @PROG@, written by "@PROG@ completion zsh".
#   @PROG@ completion zsh > "${fpath[1]}/@FN@"
# or, in ~/.zshrc after compinit:
#   source <(@PROG@ completion zsh)

@TABLES@@FN@() {
	local cur=$words[CURRENT] prog=$words[1] node= want= dashdash= w REPLY
	local -i i pos=0
	local -a pass reply
	[[ $prog == "~/"* ]] && prog=$HOME/${prog#"~/"}
	for ((i = 2; i < CURRENT; i++)); do
		w=$words[i]
		if [[ -n $want ]]; then
			@FN@_pass $want $w
			want=
		elif [[ -z $dashdash && $w == -- ]]; then
			dashdash=1
		elif [[ -z $dashdash && $w == -?* ]]; then
			@FN@_flag "$w"
		else
			@FN@_subs $node
			if ((pos == 0 && ${reply[(I)${(b)w}:*]})); then
				node=${node:+$node }$w
			else
				pos+=1
			fi
		fi
	done
	if [[ -z $want && -z $dashdash && $cur == -*=* ]]; then
		[[ -z $node ]] && node=@DEFAULT@
		want=${cur%%=*}
		want=${want#-}
		want=${want#-}
		compset -P '*='
	fi
	if [[ -n $want ]]; then
		@FN@_values "$node -$want"
	elif [[ -z $dashdash && $cur == -* ]]; then
		[[ -z $node ]] && node=@DEFAULT@
		@FN@_flags $node
		[[ $cur == --* ]] && reply=(-$^reply)
		_describe -t flags flag reply
		return
	else
		@FN@_subs $node
		if ((pos == 0 && $#reply)); then
			_describe -t commands command reply
			return
		fi
		@FN@_values "$node #$pos"
		if [[ -z $REPLY ]]; then
			@FN@_flags $node
			_describe -t flags flag reply
			return
		fi
	fi
	case $REPLY in
	(files) _files ;;
	(dirs) _files -/ ;;
	("words "*) compadd -- ${=REPLY#words } ;;
	("dynamic "*) compadd -- ${(f)"$($prog @COMPLETE@ ${REPLY#dynamic } $pass 2>/dev/null)"} ;;
	esac
}

if [[ $funcstack[1] == @FN@ ]]; then
	@FN@ "$@"
else
	compdef @FN@ @PROG@
fi
`
