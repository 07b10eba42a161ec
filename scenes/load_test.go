package scenes

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
)

const shippedScenes = "../configs/scenes"

func registry(tb testing.TB) *devices.Registry {
	tb.Helper()
	reg, err := devices.LoadRegistry("../configs/devices.toml")
	if err != nil {
		tb.Fatal(err)
	}
	return reg
}

func shipped(tb testing.TB) *Catalog {
	tb.Helper()
	c, err := Load(shippedScenes, registry(tb))
	if err != nil {
		tb.Fatalf("load shipped scenes:\n%v", err)
	}
	return c
}

// loadErrors parses src and returns its problems; it fails if there are
// none or if the error is not a *LoadError.
func loadErrors(t *testing.T, src string) []FieldError {
	t.Helper()
	_, err := Parse([]byte(src), "x.toml", registry(t))
	var le *LoadError
	if !errors.As(err, &le) {
		t.Fatalf("Parse: got %v, want a *LoadError", err)
	}
	if !errors.Is(err, ErrInvalidScene) {
		t.Errorf("errors.Is(err, ErrInvalidScene) = false")
	}
	return le.Errors
}

func TestShippedScenes(t *testing.T) {
	c := shipped(t)
	want := []string{"all_off", "go_home", "good_night", "leave_home", "movie_night"}
	if got := c.Names(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("Names() = %v, want %v", got, want)
	}
	for _, name := range want {
		t.Run(name, func(t *testing.T) {
			info, ok := c.Scene(name)
			if !ok || info.Name != name || info.Steps == 0 || info.Description == "" || !info.Mode.valid() {
				t.Fatalf("Scene(%q) = %+v, %v", name, info, ok)
			}
			spec, err := c.Build(name, nil)
			if err != nil {
				t.Fatalf("Build: %v", err)
			}
			// The driver must accept what Build produces.
			m := &driver.Mission{Type: spec.Type, Steps: spec.Steps}
			if err := m.Validate(); err != nil {
				t.Fatalf("mission from %s does not validate: %v", name, err)
			}
			if len(spec.Steps) != info.Steps || spec.Timeout != info.Deadline || spec.Priority != info.Priority {
				t.Errorf("spec %+v does not match info %+v", spec, info)
			}
		})
	}
	if info, _ := c.Scene("good_night"); info.Mode != ModeSingle {
		t.Errorf("good_night mode = %q, want single", info.Mode)
	}
}

// TestShippedScenesCommentEveryKey checks the promise that every key of
// the format is explained in at least one shipped file.
func TestShippedScenesCommentEveryKey(t *testing.T) {
	keys := []string{"name", "description", "priority", "deadline", "mode", "id", "device", "action", "params",
		"from", "default", "timeout", "retry", "max_attempts", "initial_backoff", "multiplier", "max_backoff",
		"jitter", "max_elapsed", "verify", "verify_timeout", "ack_timeout", "compensate", "on_error",
		"policy", "devices", "parallel", "quorum", "on_conflict"}
	var comments strings.Builder
	for _, f := range []string{"go_home.toml", "leave_home.toml", "movie_night.toml", "all_off.toml"} {
		b, err := os.ReadFile(filepath.Join(shippedScenes, f))
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(string(b)) {
			if strings.HasPrefix(strings.TrimSpace(line), "#") {
				comments.WriteString(line)
			}
		}
	}
	for _, k := range append(keys, "delay", "wait_for", "state") {
		if !strings.Contains(comments.String(), k) {
			t.Errorf("no comment mentions %q", k)
		}
	}
}

func TestLoadDirectory(t *testing.T) {
	reg := registry(t)
	t.Run("duplicate names across files", func(t *testing.T) {
		dir := t.TempDir()
		scene := "[[scene]]\nname = \"a\"\n[[scene.step]]\ndelay = \"1s\"\n"
		for _, f := range []string{"1.toml", "2.toml"} {
			if err := os.WriteFile(filepath.Join(dir, f), []byte(scene), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		// Not a scene file: ignored.
		if err := os.WriteFile(filepath.Join(dir, "README"), []byte("junk"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := Load(dir, reg)
		var le *LoadError
		if !errors.As(err, &le) || len(le.Errors) != 1 {
			t.Fatalf("got %v, want one error", err)
		}
		fe := le.Errors[0]
		if fe.File != filepath.Join(dir, "2.toml") || fe.Scene != "a" || fe.Field != "name" || !strings.Contains(fe.Msg, "1.toml") {
			t.Errorf("got %+v", fe)
		}
	})
	t.Run("empty directory", func(t *testing.T) {
		_, err := Load(t.TempDir(), reg)
		if !errors.Is(err, ErrInvalidScene) {
			t.Fatalf("got %v, want ErrInvalidScene", err)
		}
	})
	t.Run("missing directory", func(t *testing.T) {
		_, err := Load(filepath.Join(t.TempDir(), "nope"), reg)
		if err == nil || errors.Is(err, ErrInvalidScene) || !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("got %v, want a not-exist I/O error", err)
		}
	})
	t.Run("errors from every file", func(t *testing.T) {
		dir := t.TempDir()
		for f, src := range map[string]string{
			"a.toml": "[[scene]]\nname = \"a\"\n[[scene.step]]\ndelay = \"soon\"\n",
			"b.toml": "[[scene]]\nname = \"b\"\npriority = 101\n[[scene.step]]\ndelay = \"1s\"\n",
		} {
			if err := os.WriteFile(filepath.Join(dir, f), []byte(src), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		_, err := Load(dir, reg)
		var le *LoadError
		if !errors.As(err, &le) || len(le.Errors) != 2 {
			t.Fatalf("got %v, want two errors", err)
		}
		if lines := strings.Split(err.Error(), "\n"); len(lines) != 2 ||
			!strings.Contains(lines[0], "a.toml: scene \"a\": step 1 (delay): delay: \"soon\" is not a duration") ||
			!strings.Contains(lines[1], "b.toml: scene \"b\": priority: 101 is outside 0..100") {
			t.Errorf("message:\n%s", err)
		}
	})
}

func TestParseDefaults(t *testing.T) {
	c, err := Parse([]byte(`
[[scene]]
name = "s"
[[scene.step]]
device = "front-door"
action = "lock"
[[scene.step]]
delay = "1s"
[[scene.step]]
wait_for = { device = "front-door", state = { locked = true } }
`), "s.toml", registry(t))
	if err != nil {
		t.Fatal(err)
	}
	info, _ := c.Scene("s")
	if info.Priority != DefaultPriority || info.Deadline != DefaultDeadline || info.Mode != DefaultMode || info.Steps != 3 || info.File != "s.toml" {
		t.Errorf("info = %+v", info)
	}
	spec, err := c.Build("s", nil)
	if err != nil {
		t.Fatal(err)
	}
	short, err := Parse([]byte("[[scene]]\nname = \"t\"\ndeadline = \"10s\"\n[[scene.step]]\nwait_for = { device = \"front-door\", state = { locked = true } }\n"), "t.toml", registry(t))
	if err != nil {
		t.Fatal(err)
	}
	if spec, _ := short.Build("t", nil); string(spec.Steps[0].Params) != `{"device":"front-door","state":{"locked":true},"timeout":"10s"}` {
		t.Errorf("default wait timeout not cut to the deadline: %s", spec.Steps[0].Params)
	}
	wantIDs := []string{"1-front-door", "2-delay", "3-wait-front-door"}
	for i, st := range spec.Steps {
		if st.ID != wantIDs[i] {
			t.Errorf("step %d id = %q, want %q", i, st.ID, wantIDs[i])
		}
	}
	if got := string(spec.Steps[2].Params); got != `{"device":"front-door","state":{"locked":true},"timeout":"30s"}` {
		t.Errorf("wait params = %s", got)
	}
}

func TestParseErrors(t *testing.T) {
	const head = "[[scene]]\nname = \"s\"\n"
	tests := []struct {
		name string
		src  string
		want []FieldError // Msg is a substring
	}{
		{"toml syntax", "[[scene]\nname=", []FieldError{{File: "x.toml", Msg: "line 2"}}},
		{"unknown top-level key", "colour = 1\n" + head + "[[scene.step]]\ndelay = \"1s\"\n",
			[]FieldError{{Field: "colour", Msg: "unknown key"}}},
		{"no scenes", "", []FieldError{{Msg: "no [[scene]] tables"}}},
		{"unknown scene key", head + "colour = 1\n[[scene.step]]\ndelay = \"1s\"\n",
			[]FieldError{{Scene: "s", Field: "colour", Msg: "unknown key"}}},
		{"unknown step key", head + "[[scene.step]]\ndevice = \"front-door\"\naction = \"lock\"\ncolour = \"red\"\n",
			[]FieldError{{Scene: "s", Step: 1, StepName: "front-door", Field: "colour", Msg: "unknown key"}}},
		{"missing name", "[[scene]]\n[[scene.step]]\ndelay = \"1s\"\n",
			[]FieldError{{Scene: "#1", Field: "name", Msg: "missing"}}},
		{"bad name", "[[scene]]\nname = \"a/b\"\n[[scene.step]]\ndelay = \"1s\"\n",
			[]FieldError{{Scene: "#1", Field: "name", Msg: `contains '/'`}}},
		{"no steps", head, []FieldError{{Scene: "s", Field: "step", Msg: "at least one"}}},
		{"bad mode", head + "mode = \"sometimes\"\n[[scene.step]]\ndelay = \"1s\"\n",
			[]FieldError{{Scene: "s", Field: "mode", Msg: "not one of single"}}},
		{"bad priority type", head + "priority = \"high\"\n[[scene.step]]\ndelay = \"1s\"\n",
			[]FieldError{{Scene: "s", Field: "priority", Msg: "not an integer"}}},
		{"bad deadline", head + "deadline = \"-1m\"\n[[scene.step]]\ndelay = \"1s\"\n",
			[]FieldError{{Scene: "s", Field: "deadline", Msg: "must be positive"}}},
		{"delays beyond deadline", head + "deadline = \"1s\"\n[[scene.step]]\ndelay = \"2s\"\n",
			[]FieldError{{Scene: "s", Field: "deadline", Msg: "shorter than the scene's delays"}}},
		{"unknown device", head + "[[scene.step]]\ndevice = \"garage\"\naction = \"open\"\n",
			[]FieldError{{Scene: "s", Step: 1, StepName: "garage", Field: "device", Msg: `unknown device "garage"`}}},
		{"unknown action", head + "[[scene.step]]\ndevice = \"front-door\"\naction = \"open\"\n",
			[]FieldError{{Scene: "s", Step: 1, StepName: "front-door", Field: "action", Msg: `a lock has no action "open"`}}},
		{"missing action", head + "[[scene.step]]\ndevice = \"front-door\"\n",
			[]FieldError{{Scene: "s", Step: 1, Field: "action", Msg: "missing"}}},
		{"out of range param", head + "[[scene.step]]\ndevice = \"living-light\"\naction = \"turn_on\"\n[[scene.step]]\ndevice = \"living-ac\"\naction = \"set\"\nparams = { target = 35 }\n",
			[]FieldError{{Scene: "s", Step: 2, StepName: "living-ac", Field: "params.target", Msg: "35 is above max 30"}}},
		{"unknown param", head + "[[scene.step]]\ndevice = \"living-light\"\naction = \"turn_on\"\nparams = { colour = \"red\" }\n",
			[]FieldError{{Step: 1, Field: "params.colour", Msg: "unknown param"}}},
		{"wrong param type", head + "[[scene.step]]\ndevice = \"living-light\"\naction = \"turn_on\"\nparams = { brightness = \"max\" }\n",
			[]FieldError{{Step: 1, Field: "params.brightness", Msg: "not a number"}}},
		{"missing required param", head + "[[scene.step]]\ndevice = \"bedroom-curtain\"\naction = \"set_position\"\n",
			[]FieldError{{Step: 1, Field: "params.position", Msg: "missing required param"}}},
		{"bad default", head + "[[scene.step]]\ndevice = \"living-ac\"\naction = \"set\"\nparams = { target = { from = \"t\", default = 99 } }\n",
			[]FieldError{{Step: 1, Field: "params.target.default", Msg: "99 is above max 30"}}},
		{"bad from", head + "[[scene.step]]\ndevice = \"living-ac\"\naction = \"set\"\nparams = { target = { from = \"a b\" } }\n",
			[]FieldError{{Step: 1, Field: "params.target.from", Msg: "not a parameter name"}}},
		{"param table key", head + "[[scene.step]]\ndevice = \"living-ac\"\naction = \"set\"\nparams = { target = { from = \"t\", dflt = 2 } }\n",
			[]FieldError{{Step: 1, Field: "params.target.dflt", Msg: "unknown key"}}},
		{"bad duration", head + "[[scene.step]]\ndevice = \"front-door\"\naction = \"lock\"\ntimeout = \"5 seconds\"\n",
			[]FieldError{{Step: 1, Field: "timeout", Msg: "not a duration"}}},
		{"bad retry jitter", head + "[[scene.step]]\ndevice = \"front-door\"\naction = \"lock\"\nretry = { jitter = 2 }\n",
			[]FieldError{{Step: 1, Field: "retry.jitter", Msg: "between 0 and 1"}}},
		{"bad retry backoffs", head + "[[scene.step]]\ndevice = \"front-door\"\naction = \"lock\"\nretry = { initial_backoff = \"10s\", max_backoff = \"1s\" }\n",
			[]FieldError{{Step: 1, Field: "retry.initial_backoff", Msg: "must not exceed"}}},
		{"every bad retry key", head + "[[scene.step]]\ndevice = \"front-door\"\naction = \"lock\"\nretry = { initial_backoff = \"3s\", max_backoff = \"1s\", multiplier = 0.5, jitter = 2 }\n",
			[]FieldError{{Step: 1, Field: "retry.multiplier", Msg: "at least 1"}, {Step: 1, Field: "retry.jitter", Msg: "between 0 and 1"}, {Step: 1, Field: "retry.initial_backoff", Msg: "must not exceed"}}},
		{"bad retry attempts", head + "[[scene.step]]\ndevice = \"front-door\"\naction = \"lock\"\nretry = { max_attempts = 0 }\n",
			[]FieldError{{Step: 1, Field: "retry.max_attempts", Msg: "at least 1"}}},
		{"unknown retry key", head + "[[scene.step]]\ndevice = \"front-door\"\naction = \"lock\"\nretry = { attempts = 3 }\n",
			[]FieldError{{Step: 1, Field: "retry.attempts", Msg: "unknown key"}}},
		{"delay and device", head + "[[scene.step]]\ndevice = \"front-door\"\naction = \"lock\"\ndelay = \"1s\"\n",
			[]FieldError{{Step: 1, Msg: "not device and delay"}}},
		{"empty step", head + "[[scene.step]]\non_error = \"continue\"\n",
			[]FieldError{{Step: 1, Msg: "a step needs"}}},
		{"device key on delay", head + "[[scene.step]]\ndelay = \"1s\"\ntimeout = \"2s\"\n",
			[]FieldError{{Step: 1, StepName: "delay", Field: "timeout", Msg: "only device steps"}}},
		{"bad on_error", head + "[[scene.step]]\ndelay = \"1s\"\non_error = \"ignore\"\n",
			[]FieldError{{Step: 1, Field: "on_error", Msg: `"ignore"`}}},
		{"bad compensate", head + "[[scene.step]]\ndevice = \"front-door\"\naction = \"lock\"\ncompensate = \"undo\"\n",
			[]FieldError{{Step: 1, Field: "compensate", Msg: `"undo" is not "restore"`}}},
		{"bad compensate action", head + "[[scene.step]]\ndevice = \"front-door\"\naction = \"lock\"\ncompensate = { action = \"open\" }\n",
			[]FieldError{{Step: 1, Field: "compensate.action", Msg: "no action"}}},
		{"bad compensate param", head + "[[scene.step]]\ndevice = \"living-light\"\naction = \"turn_on\"\ncompensate = { action = \"set\", params = { brightness = 101 } }\n",
			[]FieldError{{Step: 1, Field: "compensate.params.brightness", Msg: "above max 100"}}},
		{"verify_timeout without verify", head + "[[scene.step]]\ndevice = \"front-door\"\naction = \"lock\"\nverify_timeout = \"2s\"\n",
			[]FieldError{{Step: 1, Field: "verify_timeout", Msg: "without verify"}}},
		{"duplicate step ids", head + "[[scene.step]]\nid = \"x\"\ndelay = \"1s\"\n[[scene.step]]\nid = \"x\"\ndelay = \"1s\"\n",
			[]FieldError{{Step: 2, StepName: "x", Field: "id", Msg: "also step 1"}}},
		{"bad step id", head + "[[scene.step]]\nid = \"a#b\"\ndelay = \"1s\"\n",
			[]FieldError{{Step: 1, Field: "id", Msg: `contains '#'`}}},
		{"wait_for unknown state key", head + "[[scene.step]]\nwait_for = { device = \"front-door\", state = { open = true } }\n",
			[]FieldError{{Step: 1, StepName: "wait_for front-door", Field: "wait_for.state.open", Msg: "not a state key of a lock"}}},
		{"wait_for bad state value", head + "[[scene.step]]\nwait_for = { device = \"front-door\", state = { locked = \"yes\" } }\n",
			[]FieldError{{Step: 1, Field: "wait_for.state.locked", Msg: "not a bool"}}},
		{"wait_for no state", head + "[[scene.step]]\nwait_for = { device = \"front-door\" }\n",
			[]FieldError{{Step: 1, Field: "wait_for.state", Msg: "missing"}}},
		{"wait_for unknown device", head + "[[scene.step]]\nwait_for = { device = \"gate\", state = { locked = true } }\n",
			[]FieldError{{Step: 1, Field: "wait_for.device", Msg: "unknown device"}}},
		{"ack_timeout beyond timeout", head + "[[scene.step]]\ndevice = \"front-door\"\naction = \"lock\"\ntimeout = \"1s\"\nack_timeout = \"2s\"\n",
			[]FieldError{{Step: 1, Field: "ack_timeout", Msg: "longer than the step's timeout 1s"}}},
		{"verify_timeout beyond timeout", head + "[[scene.step]]\ndevice = \"front-door\"\naction = \"lock\"\ntimeout = \"1s\"\nverify = true\nverify_timeout = \"2s\"\n",
			[]FieldError{{Step: 1, Field: "verify_timeout", Msg: "longer than the step's timeout 1s"}}},
		{"wait_for timeout beyond deadline", head + "deadline = \"10s\"\n[[scene.step]]\nwait_for = { device = \"front-door\", state = { locked = true }, timeout = \"1m\" }\n",
			[]FieldError{{Step: 1, StepName: "wait_for front-door", Field: "wait_for.timeout", Msg: "longer than the scene's deadline 10s"}}},
		{"duplicate scene in file", head + "[[scene.step]]\ndelay = \"1s\"\n" + head + "[[scene.step]]\ndelay = \"1s\"\n",
			[]FieldError{{Scene: "s", Field: "name", Msg: "duplicate scene name"}}},
		{"every error reported", head + "mode = \"x\"\n[[scene.step]]\ndevice = \"garage\"\naction = \"a\"\n[[scene.step]]\ndelay = \"x\"\n[[scene.step]]\ndevice = \"living-ac\"\naction = \"set\"\nparams = { target = 99, fan = \"max\" }\n",
			[]FieldError{
				{Scene: "s", Field: "mode"},
				{Step: 1, Field: "device"},
				{Step: 2, Field: "delay"},
				{Step: 3, Field: "params.fan", Msg: "not one of auto"},
				{Step: 3, Field: "params.target", Msg: "above max 30"},
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := loadErrors(t, tc.src)
			if len(got) != len(tc.want) {
				t.Fatalf("got %d errors, want %d:\n%v", len(got), len(tc.want), &LoadError{Errors: got})
			}
			for i, w := range tc.want {
				g := got[i]
				if g.File != "x.toml" ||
					(w.Scene != "" && g.Scene != w.Scene) ||
					g.Step != w.Step ||
					(w.StepName != "" && g.StepName != w.StepName) ||
					g.Field != w.Field ||
					!strings.Contains(g.Msg, w.Msg) {
					t.Errorf("error %d = %#v\nwant       %#v", i, g, w)
				}
			}
		})
	}
}

func TestFieldErrorMessage(t *testing.T) {
	fe := FieldError{File: "configs/scenes/go_home.toml", Scene: "go_home", Step: 2, StepName: "living-ac",
		Field: "params.target", Msg: "35 is above max 30"}
	want := `configs/scenes/go_home.toml: scene "go_home": step 2 (living-ac): params.target: 35 is above max 30`
	if got := fe.Error(); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if got := (FieldError{File: "f", Msg: "m"}).Error(); got != "f: m" {
		t.Errorf("got %q", got)
	}
}

func TestNilRegistry(t *testing.T) {
	if _, err := Parse(nil, "x", nil); err == nil {
		t.Error("Parse with nil registry succeeded")
	}
	if _, err := Load(t.TempDir(), nil); err == nil {
		t.Error("Load with nil registry succeeded")
	}
}

func TestFileTooLarge(t *testing.T) {
	errs := loadErrors(t, strings.Repeat("#", MaxFileSize+1))
	if len(errs) != 1 || !strings.Contains(errs[0].Msg, "max") {
		t.Fatalf("got %v", errs)
	}
}
