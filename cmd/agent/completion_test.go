package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestCompletionScriptsParse: "agent completion" and "hub completion"
// print scripts that bash -n and zsh -n accept.
func TestCompletionScriptsParse(t *testing.T) {
	for _, bin := range []string{agentBin, hubBin} {
		for _, shell := range []string{"bash", "zsh"} {
			t.Run(filepath.Base(bin)+" "+shell, func(t *testing.T) {
				sh := needTool(t, shell, shell)
				file := completionScript(t, bin, shell)
				if out, err := exec.Command(sh, "-n", file).CombinedOutput(); err != nil {
					t.Errorf("%s -n: %v\n%s", shell, err, out)
				}
			})
		}
	}
}

// TestCompletionOffersCommandsFlagsAndTheAgentsValues sources the
// scripts in bash and zsh and calls their function for a command line,
// as the shell does at a TAB: they offer the commands, subcommands and
// flags of the command typed, the values of a flag, and the scenes and
// missions of a running agent, asked with the -addr and -token typed.
func TestCompletionOffersCommandsFlagsAndTheAgentsValues(t *testing.T) {
	const token = "complete-s3cret"
	f := newCLIFixture(t, token)
	id := f.submit(t, "many", "complete-1")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "backup.db"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		words []string // the command line; the last word is the one at the cursor
		want  []string
	}{
		{"commands", []string{agentBin, ""}, []string{"apply", "backup", "compact", "completion", "config", "devices", "help", "missions", "passwd", "restore", "run", "scenes", "schedules", "trigger", "validate", "version", "why"}},
		{"a command by its start", []string{agentBin, "mi"}, []string{"missions"}},
		{"subcommands", []string{agentBin, "missions", ""}, []string{"cancel", "list", "pause", "priority", "resume", "retry", "show", "watch"}},
		{"a subcommand's flags", []string{agentBin, "missions", "show", "-"}, []string{"-addr", "-config", "-json", "-token", "-v"}},
		{"flags written --", []string{agentBin, "missions", "list", "--s"}, []string{"--scene", "--since", "--state"}},
		{"a command's flags, nothing else to offer", []string{agentBin, "devices", "-json", ""}, []string{"-addr", "-config", "-json", "-token"}},
		{"a flag's values", []string{agentBin, "run", "-log-level", ""}, []string{"debug", "error", "info", "warn"}},
		{"the default command's flags", []string{agentBin, "-config", "agent.toml", "-log-format", ""}, []string{"json", "text"}},
		{"the shells", []string{agentBin, "completion", ""}, []string{"bash", "zsh"}},
		{"files", []string{agentBin, "restore", "-data", dir, ""}, []string{"backup.db"}},
		{"the agent's scenes", []string{agentBin, "trigger", "-addr", f.url, "-token", token, ""}, []string{"cool", "many", "solo"}},
		{"the agent's missions", []string{agentBin, "missions", "show", "-token", token, "-addr", f.url, ""}, []string{id}},
		{"no agent, no values", []string{agentBin, "trigger", "-addr", "127.0.0.1:1", ""}, nil},
		{"the hub's commands", []string{hubBin, ""}, []string{"bundle", "completion", "fleet", "group", "help", "nats-user", "passwd", "rollout", "run", "tag", "validate", "version"}},
		{"the hub's default command's flags", []string{hubBin, "-log-format", ""}, []string{"json", "text"}},
		{"the hub's rollout commands", []string{hubBin, "rollout", ""}, []string{"abort", "pause", "resume", "start", "status"}},
	} {
		for _, shell := range []string{"bash", "zsh"} {
			t.Run(shell+" "+c.name, func(t *testing.T) {
				sh := needTool(t, shell, shell)
				got := complete(t, sh, shell, completionScript(t, c.words[0], shell), dir, c.words)
				if !slices.Equal(got, c.want) {
					t.Errorf("%q: offered %q, want %q", c.words[1:], got, c.want)
				}
			})
		}
	}
}

// completionScript writes bin's completion script for shell to a file.
func completionScript(t *testing.T, bin, shell string) string {
	t.Helper()
	out, err := exec.Command(bin, "completion", shell).Output()
	if err != nil {
		t.Fatalf("%s completion %s: %v", bin, shell, err)
	}
	file := filepath.Join(t.TempDir(), shell)
	if err := os.WriteFile(file, out, 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// zshStubs stand in for zsh's completion system, outside an interactive
// shell: each prints the candidates it is given, one a line.
const zshStubs = `compdef() { :; }
compset() { :; }
_describe() { local x; for x in "${(@P)${@[-1]}}"; do print -r -- "${x%%:*}"; done; }
compadd() { while [[ $1 != -- ]]; do shift; done; shift; print -rl -- "$@"; }
_files() { print -rl -- *(N); }
`

// complete runs the completion function of script (bin's, for shell)
// for words in dir, and returns the candidates it offers for the last
// word, sorted. zsh's stubs offer them all; those not starting with the
// word are dropped, as zsh would.
func complete(t *testing.T, sh, shell, script, dir string, words []string) []string {
	t.Helper()
	quoted := make([]string, len(words))
	for i, w := range words {
		quoted[i] = "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
	}
	fn := "_sortie_" + filepath.Base(words[0])
	var prog string
	var cmd *exec.Cmd
	if shell == "bash" {
		prog = "source " + script + "\nCOMP_WORDS=(" + strings.Join(quoted, " ") + ")\nCOMP_CWORD=" + strconv.Itoa(len(words)-1) +
			"\n" + fn + "\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n"
		cmd = exec.Command(sh, "--norc", "--noprofile", "-c", prog)
	} else {
		prog = zshStubs + "source " + script + "\nwords=(" + strings.Join(quoted, " ") + ")\nCURRENT=" + strconv.Itoa(len(words)) + "\n" + fn + "\n"
		cmd = exec.Command(sh, "-f", "-c", prog)
	}
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", shell, err, out)
	}
	var got []string
	for _, l := range strings.Split(string(out), "\n") {
		if l != "" && strings.HasPrefix(l, words[len(words)-1]) {
			got = append(got, l)
		}
	}
	slices.Sort(got)
	return got
}
