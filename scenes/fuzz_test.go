package scenes

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func FuzzDecodeTrigger(f *testing.F) {
	for _, s := range []string{
		`{"scene":"go_home","request_id":"r-123","source":"alexa","params":{"temperature":23}}`,
		`{"scene":"s","request_id":"r","params":{"a":1.5,"b":true,"c":"x"}}`,
		`{"scene":"a/b","request_id":"r"}`,
		`{"scene":"s","request_id":"r","params":{"a":{"b":1}}}`,
		`{"scene":"s","request_id":"r","params":{"a":1e400}}`,
		`{"scene":"s","request_id":"r"} {}`,
		`null`, ``, `[`,
	} {
		f.Add([]byte(s))
	}
	reg := registry(f)
	c, err := Load(shippedScenes, reg)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		tr, err := DecodeTrigger(b)
		if err != nil {
			var te *TriggerError
			if !errors.As(err, &te) || te.Reason == "" {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if tr.Scene == "" || tr.RequestID == "" || len(tr.Params) > MaxTriggerParams {
			t.Fatalf("accepted invalid trigger %+v", tr)
		}
		// Whatever passes decoding must be built or rejected cleanly.
		if _, err := c.Build(tr.Scene, tr.Params); err != nil {
			var te *TriggerError
			if !errors.As(err, &te) {
				t.Fatalf("Build: untyped error %v", err)
			}
		}
	})
}

func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join(shippedScenes, "*.toml"))
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("[[scene]]\nname = \"s\"\n[[scene.step]]\ndelay = \"1s\"\n"))
	f.Add([]byte("[[scene]]\nname = \"s\"\n[[scene.step]]\nwait_for = { device = \"front-door\", state = { locked = 1 } }\n"))
	f.Add([]byte("[[scene]]\nname = \"s\"\nstep = [1, 2]\n"))
	f.Add([]byte("scene = 3"))
	reg := registry(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Parse(b, "fuzz.toml", reg)
		if err != nil {
			var le *LoadError
			if !errors.As(err, &le) || len(le.Errors) == 0 {
				t.Fatalf("got %v, want a non-empty *LoadError", err)
			}
			for _, fe := range le.Errors {
				if fe.File != "fuzz.toml" || fe.Msg == "" {
					t.Fatalf("bad field error %#v", fe)
				}
			}
			return
		}
		// A scene that loads builds with its defaults, or names a
		// missing parameter.
		for _, name := range c.Names() {
			if _, err := c.Build(name, nil); err != nil {
				var te *TriggerError
				if !errors.As(err, &te) || te.Reason != ReasonInvalidParam {
					t.Fatalf("Build(%q): %v", name, err)
				}
			}
		}
	})
}
