package scenes

import (
	"strings"
	"testing"

	"github.com/sortie-edge/sortie/driver"
)

func TestParallelGroupBuildsOneBranchPerDevice(t *testing.T) {
	src := `
[[scene]]
name = "s"
policy = "best_effort"
[[scene.step]]
device = "front-door"
action = "lock"
[[scene.step]]
id = "lights"
devices = ["living-light", "kitchen-light", "bedroom-light"]
action = "turn_off"
compensate = "restore"
quorum = 2
[[scene.step]]
id = "evening"
policy = "all"
action = "turn_on"
[[scene.step.parallel]]
device = "living-light"
params = { brightness = 30 }
[[scene.step.parallel]]
device = "living-ac"
action = "turn_off"
`
	c, err := Parse([]byte(src), "x.toml", registry(t))
	if err != nil {
		t.Fatal(err)
	}
	spec, err := c.Build("s", nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range spec.Steps {
		g := "-"
		if s.Group != nil {
			g = s.Group.ID + "/" + string(s.Group.Policy)
			if s.Group.Quorum > 0 {
				g += "/" + string(rune('0'+s.Group.Quorum))
			}
		}
		got = append(got, s.ID+" "+s.Name+" "+g)
	}
	want := []string{
		"1-front-door lock front-door -",
		"lights.living-light turn_off living-light lights/quorum/2",
		"lights.kitchen-light turn_off kitchen-light lights/quorum/2",
		"lights.bedroom-light turn_off bedroom-light lights/quorum/2",
		"evening.living-light turn_on living-light brightness=30 evening/",
		"evening.living-ac turn_off living-ac evening/",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("steps:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !spec.Steps[0].ContinueOnError {
		t.Error("a single step of a best_effort scene does not continue on error")
	}
	if spec.Steps[1].Compensate == nil || spec.Steps[1].Compensate.Kind != RestoreKind {
		t.Errorf("branch did not take the group's compensate: %+v", spec.Steps[1].Compensate)
	}
	if p := commandOf(t, spec.Steps[4].Params)["params"].(map[string]any); p["brightness"] != float64(30) {
		t.Errorf("branch params %v, want its own brightness", p)
	}
	m := &driver.Mission{Type: spec.Type, Steps: spec.Steps}
	if err := m.Validate(); err != nil {
		t.Fatalf("the driver rejects the built mission: %v", err)
	}
	if info, _ := c.Scene("s"); info.Steps != 6 {
		t.Errorf("info.Steps = %d, want 6 (each branch a step)", info.Steps)
	}
}

func TestParallelGroupErrors(t *testing.T) {
	const head = "[[scene]]\nname = \"s\"\n"
	tests := []struct {
		name string
		src  string
		want FieldError // Msg is a substring
	}{
		{"empty devices", head + "[[scene.step]]\ndevices = []\naction = \"turn_off\"\n",
			FieldError{Field: "devices", Msg: "is empty"}},
		{"both forms", head + "[[scene.step]]\ndevices = [\"living-light\"]\naction = \"turn_off\"\n[[scene.step.parallel]]\ndevice = \"kitchen-light\"\n",
			FieldError{Field: "parallel", Msg: "not both"}},
		{"device twice", head + "[[scene.step]]\ndevices = [\"living-light\", \"living-light\"]\naction = \"turn_off\"\n",
			FieldError{Msg: "in the group twice"}},
		{"delay branch", head + "[[scene.step]]\nid = \"g\"\n[[scene.step.parallel]]\ndelay = \"1s\"\n",
			FieldError{Field: "parallel[0]", Msg: "a branch is a device step"}},
		{"quorum too big", head + "[[scene.step]]\ndevices = [\"living-light\", \"kitchen-light\"]\naction = \"turn_off\"\nquorum = 3\n",
			FieldError{Field: "quorum", Msg: "outside 1..2"}},
		{"quorum policy without quorum", head + "[[scene.step]]\ndevices = [\"living-light\"]\naction = \"turn_off\"\npolicy = \"quorum\"\n",
			FieldError{Field: "quorum", Msg: "missing"}},
		{"quorum with policy all", head + "[[scene.step]]\ndevices = [\"living-light\"]\naction = \"turn_off\"\npolicy = \"all\"\nquorum = 1\n",
			FieldError{Field: "quorum", Msg: "set but policy"}},
		{"scene quorum", head + "policy = \"quorum\"\n[[scene.step]]\ndelay = \"1s\"\n",
			FieldError{Field: "policy", Msg: "a quorum is a group's"}},
		{"bad shared action said once", head + "[[scene.step]]\ndevices = [\"living-light\", \"kitchen-light\"]\naction = \"explode\"\n",
			FieldError{Field: "action", Msg: `no action "explode"`}},
		{"duplicate group ids", head + "[[scene.step]]\nid = \"g\"\ndevices = [\"living-light\"]\naction = \"turn_off\"\n[[scene.step]]\nid = \"g\"\ndevices = [\"kitchen-light\"]\naction = \"turn_off\"\n",
			FieldError{Field: "step", Msg: "two parallel groups have id"}},
		{"unknown group key", head + "[[scene.step]]\ndevices = [\"living-light\"]\naction = \"turn_off\"\ncolour = 1\n",
			FieldError{Field: "colour", Msg: "unknown key"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			errs := loadErrors(t, tc.src)
			found := 0
			for _, e := range errs {
				if e.Field == tc.want.Field && strings.Contains(e.Msg, tc.want.Msg) {
					found++
				}
			}
			if found != 1 {
				t.Fatalf("errors %v: want exactly one at %q containing %q", errs, tc.want.Field, tc.want.Msg)
			}
		})
	}
}
