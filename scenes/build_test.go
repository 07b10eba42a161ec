package scenes

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/driver"
)

// commandOf decodes a device.command step's params.
func commandOf(t *testing.T, raw json.RawMessage) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("params %s: %v", raw, err)
	}
	return m
}

func TestBuildGoHome(t *testing.T) {
	c := shipped(t)
	tests := []struct {
		name    string
		trigger map[string]any
		target  float64
	}{
		{"default", nil, 24},
		{"override", map[string]any{"temperature": 22}, 22},
		{"override float integral", map[string]any{"temperature": 21.0}, 21},
		{"override json.Number", map[string]any{"temperature": json.Number("27")}, 27},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec, err := c.Build("go_home", tc.trigger)
			if err != nil {
				t.Fatal(err)
			}
			if spec.Type != "go_home" || spec.Priority != 60 || spec.Timeout != 2*time.Minute || len(spec.Steps) != 3 {
				t.Fatalf("spec = %+v", spec)
			}
			ac := spec.Steps[1]
			if ac.ID != "2-living-ac" || ac.Kind != CommandKind {
				t.Fatalf("step = %+v", ac)
			}
			cmd := commandOf(t, ac.Params)
			params := cmd["params"].(map[string]any)
			if cmd["device"] != "living-ac" || cmd["action"] != "set" || params["target"] != tc.target || params["mode"] != "cool" {
				t.Errorf("ac command = %v", cmd)
			}
			if _, ok := cmd["verify"]; ok {
				t.Errorf("unset verify is present: %s", ac.Params)
			}
			if ac.Compensate == nil || ac.Compensate.Kind != RestoreKind || string(ac.Compensate.Params) != `{"device":"living-ac"}` {
				t.Errorf("compensation = %+v", ac.Compensate)
			}
			if tc.trigger != nil && spec.Values["temperature"] == nil {
				t.Errorf("trigger params not in Values: %v", spec.Values)
			}
		})
	}
}

func TestBuildStepShapes(t *testing.T) {
	c := shipped(t)
	spec, err := c.Build("go_home", nil)
	if err != nil {
		t.Fatal(err)
	}
	light := spec.Steps[0]
	if got, want := string(light.Params), `{"device":"living-light","action":"turn_on","params":{"brightness":80},"verify":true,"verify_timeout":"5s","ack_timeout":"2s"}`; got != want {
		t.Errorf("light params\ngot  %s\nwant %s", got, want)
	}
	wantRetry := driver.RetryPolicy{MaxAttempts: 4, InitialBackoff: driver.Duration(250 * time.Millisecond), Multiplier: 2,
		MaxBackoff: driver.Duration(2 * time.Second), Jitter: 0.2, MaxElapsed: driver.Duration(20 * time.Second)}
	if light.Retry != wantRetry || light.Timeout != driver.Duration(10*time.Second) || light.ContinueOnError {
		t.Errorf("light step = %+v", light)
	}
	if light.Compensate.Retry != wantRetry || light.Compensate.Timeout != light.Timeout {
		t.Errorf("compensation = %+v", light.Compensate)
	}
	if !spec.Steps[2].ContinueOnError {
		t.Error("speaker step: on_error = continue not mapped")
	}

	movie, err := c.Build("movie_night", map[string]any{"volume": 25})
	if err != nil {
		t.Fatal(err)
	}
	byID := stepsByID(movie)
	curtain := byID["3-bedroom-curtain"]
	if curtain.Compensate == nil || curtain.Compensate.Kind != CommandKind ||
		string(curtain.Compensate.Params) != `{"device":"bedroom-curtain","action":"open"}` {
		t.Errorf("explicit compensation = %+v", curtain.Compensate)
	}
	if d := byID["curtain-settles"]; d.Kind != DelayKind || string(d.Params) != `{"duration":"2s"}` || d.Compensate != nil {
		t.Errorf("delay step = %+v", d)
	}
	if sp := commandOf(t, byID["5-living-speaker"].Params)["params"].(map[string]any); sp["volume"] != 25.0 {
		t.Errorf("speaker params = %v", sp)
	}

	leave, err := c.Build("leave_home", nil)
	if err != nil {
		t.Fatal(err)
	}
	wait := leave.Steps[len(leave.Steps)-1]
	if wait.ID != "door-locked" || wait.Kind != WaitKind ||
		string(wait.Params) != `{"device":"front-door","state":{"locked":true},"timeout":"30s"}` {
		t.Errorf("wait step = %+v (%s)", wait, wait.Params)
	}
}

func TestBuildRejects(t *testing.T) {
	c := shipped(t)
	req, err := Parse([]byte(`
[[scene]]
name = "heat"
[[scene.step]]
device = "living-ac"
action = "set"
params = { target = { from = "temperature" } }
`), "heat.toml", registry(t))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		cat     *Catalog
		scene   string
		trigger map[string]any
		reason  string
		msg     string
	}{
		{"unknown scene", c, "party", nil, ReasonUnknownScene, `no scene "party"`},
		{"wrong type", c, "go_home", map[string]any{"temperature": "warm"}, ReasonInvalidParam, `param "temperature": "warm" is not a number`},
		{"out of range", c, "go_home", map[string]any{"temperature": 40}, ReasonInvalidParam, `param "temperature": 40 is above max 30`},
		{"not an integer", c, "go_home", map[string]any{"temperature": 22.5}, ReasonInvalidParam, "not an integer"},
		{"unknown param", c, "go_home", map[string]any{"temprature": 22}, ReasonInvalidParam, `param "temprature": scene go_home takes temperature`},
		{"param of a scene without params", c, "good_night", map[string]any{"x": 1}, ReasonInvalidParam, "takes no params"},
		{"nested value", c, "go_home", map[string]any{"temperature": map[string]any{}}, ReasonInvalidParam, "not a string, number or bool"},
		{"missing without default", req, "heat", nil, ReasonInvalidParam, `param "temperature": missing (no default)`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.cat.Build(tc.scene, tc.trigger)
			var te *TriggerError
			if !errors.As(err, &te) || !errors.Is(err, ErrTrigger) {
				t.Fatalf("got %v, want a *TriggerError", err)
			}
			if te.Reason != tc.reason || !strings.Contains(te.Msg, tc.msg) {
				t.Errorf("got %s: %s\nwant %s: ...%s...", te.Reason, te.Msg, tc.reason, tc.msg)
			}
		})
	}
	if _, err := req.Build("heat", map[string]any{"temperature": 20}); err != nil {
		t.Errorf("required param given: %v", err)
	}
	info, _ := req.Scene("heat")
	if len(info.Params) != 1 || !info.Params[0].Required || info.Params[0].Name != "temperature" {
		t.Errorf("params = %+v", info.Params)
	}
}

// TestBuildDoesNotShare checks that specs are independent: the agent may
// keep or change one without changing the next.
func TestBuildDoesNotShare(t *testing.T) {
	c := shipped(t)
	trig := map[string]any{"temperature": 22}
	a, err := c.Build("go_home", trig)
	if err != nil {
		t.Fatal(err)
	}
	a.Values["temperature"] = 99
	a.Steps[0].ID = "changed"
	b, _ := c.Build("go_home", trig)
	if b.Values["temperature"] != int64(22) || b.Steps[0].ID == "changed" || trig["temperature"] != 22 {
		t.Errorf("specs share state: %v %q %v", b.Values, b.Steps[0].ID, trig)
	}
}

func TestNamesIsACopy(t *testing.T) {
	c := shipped(t)
	n := c.Names()
	n[0] = "x"
	if c.Names()[0] == "x" {
		t.Error("Names returns the catalog's slice")
	}
	if _, ok := c.Scene("x"); ok {
		t.Error("Scene of an unknown name")
	}
}

// TestBuildNamesStepsByCommandAndTarget: a device step's Name is its
// action, device and resolved parameters (sorted, cut at 80 bytes) and
// its Target the device, which the hub shows; a delay targets nothing.
func TestBuildNamesStepsByCommandAndTarget(t *testing.T) {
	c := shipped(t)
	movie, err := c.Build("movie_night", map[string]any{"volume": 25})
	if err != nil {
		t.Fatal(err)
	}
	byID := stepsByID(movie)
	if sp := byID["5-living-speaker"]; !strings.Contains(sp.Name, " living-speaker ") || sp.Target != "living-speaker" || !strings.Contains(sp.Name, "volume=25") {
		t.Errorf("speaker step: name %q, target %q; want its action, device and volume=25, on living-speaker", sp.Name, sp.Target)
	}
	if d := byID["curtain-settles"]; d.Target != "" || d.Name != "delay 2s" {
		t.Errorf("delay step: name %q, target %q", d.Name, d.Target)
	}
	all := func(string) bool { return true }
	long := commandName("set", "living-ac", map[string]any{"mode": strings.Repeat("é", 60), "target": 21}, all)
	if len(long) > maxName || !strings.HasPrefix(long, "set living-ac mode=é") || !strings.HasSuffix(long, "…") {
		t.Errorf("a long command's name = %q (%d bytes), want it cut at %d with an ellipsis", long, len(long), maxName)
	}
	if got := commandName("set", "living-ac", map[string]any{"target": 21, "mode": "cool"}, all); got != "set living-ac mode=cool target=21" {
		t.Errorf("name = %q, want the parameters sorted", got)
	}
}

// TestBuildNamesHideSecretsAndFreeText: a step's name, which goes to the
// hub, shows the values of bounded parameters (int, number, bool, enum)
// and of strings the registry marks show, and hides those of other
// strings and of parameters the registry marks secret, constant or from
// the trigger; the command itself keeps them.
func TestBuildNamesHideSecretsAndFreeText(t *testing.T) {
	c := letIn(t, `{ code = { from = "code" }, pin = 4321, hold = { from = "hold", default = 5 }, mode = "once", label = "front" }`)
	spec, err := c.Build("let_in", map[string]any{"code": "0451", "hold": 30})
	if err != nil {
		t.Fatal(err)
	}
	st := spec.Steps[0]
	if want := "unlock front-door code=*** hold=30 label=front mode=once pin=***"; st.Name != want {
		t.Errorf("name = %q, want %q", st.Name, want)
	}
	if p := commandOf(t, st.Params)["params"].(map[string]any); p["code"] != "0451" || p["pin"] != 4321.0 {
		t.Errorf("the command's params = %v, want the code and the pin as given", p)
	}
}

// letIn is a catalog of one scene, let_in, unlocking a keypad lock with
// params (a TOML inline table): the lock's unlock takes a code (a
// string), a pin (a secret int up to 999999), a hold (an int up to 60),
// a mode (an enum) and a label (a string shown).
func letIn(t *testing.T, params string) *Catalog {
	t.Helper()
	reg, err := devices.ParseRegistry([]byte(`
[types.keypad_lock.actions.unlock]
params.code = { type = "string", max_len = 12 }
params.pin = { type = "int", min = 0, max = 999999, secret = true }
params.hold = { type = "int", min = 0, max = 60 }
params.mode = { type = "enum", values = ["once", "latch"] }
params.label = { type = "string", show = true }
[types.keypad_lock.actions.set]
params.locked = { type = "bool" }
[[devices]]
id = "front-door"
type = "keypad_lock"
`), "secrets.toml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse([]byte(`
[[scene]]
name = "let_in"
[[scene.step]]
device = "front-door"
action = "unlock"
params = `+params+`
`), "secrets.toml", reg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// stepsByID indexes a built scene's steps by their IDs.
func stepsByID(spec driver.Spec) map[string]driver.Step {
	byID := map[string]driver.Step{}
	for _, s := range spec.Steps {
		byID[s.ID] = s
	}
	return byID
}

// TestRefusedTriggerReasonsQuoteNoHiddenValue: a trigger refused for a
// parameter's value says why without quoting a value its step name
// would hide; a bounded value it would show is quoted.
func TestRefusedTriggerReasonsQuoteNoHiddenValue(t *testing.T) {
	c := letIn(t, `{ pin = { from = "pin" }, hold = { from = "hold", default = 5 } }`)
	if _, err := c.Build("let_in", map[string]any{"pin": 2718281}); err == nil || strings.Contains(err.Error(), "2718281") || !strings.Contains(err.Error(), "above max 999999") {
		t.Errorf("a pin above max: %v, want the reason without the value", err)
	}
	if _, err := c.Build("let_in", map[string]any{"pin": 1, "hold": 99}); err == nil || !strings.Contains(err.Error(), "99 is above max 60") {
		t.Errorf("a hold above max: %v, want the reason with the value", err)
	}
}
