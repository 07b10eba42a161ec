package wire

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// quickCommon are messages as devices and the agent send them.
var quickCommon = []string{
	`{"id":"m-0-1","action":"set","params":{"target":24,"mode":"cool"},"attempt":1,"expires":"2026-12-01T03:04:05.678Z","trace_id":"t1"}`,
	`{"id":"m-0-1","ok":true,"state":{"power":"on","brightness":100,"list":[1,"a",null,true,false,{"x":[]}],"o":{}},"prior":{"power":"off"}}`,
	`{"id":"m-0-1","ok":false,"error":{"code":"jammed","message":"lock jammed"},"state":{"locked":false}}`,
	`{"state":{"position":40,"moving":false},"ts":"2026-12-01T03:04:05+01:00"}`,
	" \n{ \"id\" : \"a\" , \"ok\" : true } \t",
	`{}`, `{"state":{}}`, `{"id":"a","ok":true,"error":{}}`, `{"params":{"a":-0.5e-3,"b":0,"c":1E+2}}`,
}

// quickMisses are near misses that quick must leave to encoding/json.
var quickMisses = []string{
	`{"ID":"a","ok":true}`, `{"id":"a","id":"b","ok":true}`, `{"id":"a","ok":true,"extra":1}`,
	`{"id":"a\"b","ok":true}`, `{"id":"caf\u00e9","ok":true}`, "{\"id\":\"bad \xff\",\"ok\":true}",
	`{"id":"a","ok":null}`, `{"id":"a","ok":true,"state":null}`, `{"id":"a","ok":true,"error":null}`,
	`{"state":{"a":1,"a":2}}`, `{"attempt":1.5}`, `{"attempt":1e2}`, `{"attempt":99999999999999999999}`,
	`{"expires":"yesterday"}`, `{"expires":null}`, `{"id":"a","ok":true}}`, `{"id":"a","ok":true} x`,
	`{"id":"a","ok":true,}`, `{"id":1}`, `[]`, ``, `{"state":{"n":01}}`, `{"state":{"n":-}}`,
	`{"state":` + strings.Repeat(`[`, 40) + strings.Repeat(`]`, 40) + `}`,
	`{"id":"a","ok":tru}`, `{"state":{"s":"tab	in string"}}`, `{"error":{"code":"x","Code":"y"}}`,
}

func TestQuickMatchesJSON(t *testing.T) {
	for _, s := range quickCommon {
		if checkQuick(t, []byte(s)) == 0 {
			t.Errorf("no quick decoder read %s", s)
		}
	}
	for _, s := range quickMisses {
		if n := checkQuick(t, []byte(s)); n > 0 {
			t.Errorf("a quick decoder read %q, which is encoding/json's to judge", s)
		}
	}
}

// TestQuickReadsWhatIsSent: what this package encodes, quick decodes.
func TestQuickReadsWhatIsSent(t *testing.T) {
	cmds, acks, states := encodeSamples(t)
	exp := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	cmds = append(cmds, Command{ID: "m-0-2", Action: "set", Params: map[string]any{"target": 22}, Attempt: 1, Expires: exp})
	b, _ := cmds[len(cmds)-1].AppendJSON(nil)
	if _, ok := quickCommand(b); !ok {
		t.Errorf("quick gave up on the agent's command %s", b)
	}
	a := Ack{ID: "m-0-2", OK: true, State: map[string]any{"power": "on", "brightness": 40}, Prior: map[string]any{"power": "off"}}
	if b, _ = a.AppendJSON(nil); !isQuick(quickAck(b)) {
		t.Errorf("quick gave up on an ack %s", b)
	}
	st := StateReport{State: map[string]any{"power": "on"}, Time: exp}
	if b, _ = st.AppendJSON(nil); !isQuick(quickState(b)) {
		t.Errorf("quick gave up on a state report %s", b)
	}
	for _, c := range cmds {
		b, _ := c.AppendJSON(nil)
		checkQuick(t, b)
	}
	for _, a := range acks {
		b, _ := a.AppendJSON(nil)
		checkQuick(t, b)
	}
	for _, s := range states {
		b, _ := s.AppendJSON(nil)
		checkQuick(t, b)
	}
}

func isQuick[T any](_ T, ok bool) bool { return ok }

// checkQuick compares each quick decoder that accepts b with
// encoding/json's decoding of it, and returns how many accepted.
func checkQuick(t *testing.T, b []byte) int {
	t.Helper()
	n := 0
	if got, ok := quickCommand(b); ok {
		n++
		var want Command
		if err := decodeStrict(b, &want); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("command %q: quick %#v, encoding/json %#v (%v)", b, got, want, err)
		}
	}
	if got, ok := quickAck(b); ok {
		n++
		var want Ack
		if err := decodeStrict(b, &want); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("ack %q: quick %#v, encoding/json %#v (%v)", b, got, want, err)
		}
	}
	if got, ok := quickState(b); ok {
		n++
		var want StateReport
		if err := decodeStrict(b, &want); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("state %q: quick %#v, encoding/json %#v (%v)", b, got, want, err)
		}
	}
	return n
}

// FuzzQuickMatchesJSON: on any bytes, a quick decoder either gives up or
// decodes exactly what encoding/json decodes.
func FuzzQuickMatchesJSON(f *testing.F) {
	for _, s := range append(quickCommon, quickMisses...) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkQuick(t, b) })
}
