package wire

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

// encodeSamples are messages of every shape the protocol carries, with
// the values that json.Marshal escapes or formats in its own way.
func encodeSamples(t *testing.T) (cmds []Command, acks []Ack, states []StateReport) {
	t.Helper()
	var vals []map[string]any
	for _, doc := range []string{
		`{}`, `{"power":"on","brightness":100,"color_temp":4000}`,
		`{"target":24.5,"mode":"cool","list":[1,"two",null,true,{"x":[]}],"none":null}`,
		`{"html":"<a&b>","u":"\u2028\u00e9","big":1e22,"small":1e-7,"neg":-0}`,
	} {
		for _, useNumber := range []bool{false, true} {
			var m map[string]any
			dec := json.NewDecoder(bytes.NewReader([]byte(doc)))
			if useNumber {
				dec.UseNumber()
			}
			if err := dec.Decode(&m); err != nil {
				t.Fatal(err)
			}
			vals = append(vals, m)
		}
	}
	vals = append(vals, nil, map[string]any{"int": 7, "int64": int64(-3), "float": 0.25})
	times := []time.Time{{}, time.Date(2026, 12, 1, 3, 4, 5, 678, time.UTC), time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("", -(5*3600+1800)))}
	strs := []string{"", "living-light", `q"uote\ <tag>&`, "caf\u00e9 \u2028", "bad \xff utf8"}
	for i, v := range vals {
		s := strs[i%len(strs)]
		ts := times[i%len(times)]
		cmds = append(cmds, Command{ID: "m-0-" + s, Action: s + "set", Params: v, Attempt: i - 1, Expires: ts, TraceID: s})
		acks = append(acks,
			Ack{ID: s, OK: true, State: v, Prior: vals[(i+1)%len(vals)]},
			Ack{ID: s, Error: &AckError{Code: "jammed", Message: s}, State: v},
			Ack{ID: s, Error: &AckError{}})
		states = append(states, StateReport{State: v, Time: ts})
	}
	return cmds, acks, states
}

func TestAppendJSONMatchesMarshal(t *testing.T) {
	cmds, acks, states := encodeSamples(t)
	for _, c := range cmds {
		same(t, &c, c.AppendJSON)
	}
	for _, a := range acks {
		same(t, &a, a.AppendJSON)
	}
	for _, s := range states {
		same(t, &s, s.AppendJSON)
	}
}

func same(t *testing.T, v any, encode func([]byte) ([]byte, error)) {
	t.Helper()
	want, werr := json.Marshal(v)
	got, gerr := encode([]byte("prefix"))
	if werr != nil || gerr != nil {
		t.Fatalf("%+v: json.Marshal error %v, AppendJSON error %v", v, werr, gerr)
	}
	if !bytes.Equal(got, append([]byte("prefix"), want...)) {
		t.Fatalf("%+v encodes differently:\nAppendJSON   %s\njson.Marshal prefix%s", v, got, want)
	}
}

func TestAppendJSONRefusesWhatMarshalRefuses(t *testing.T) {
	nan := 0.0
	nan /= nan
	c := Command{ID: "x", Action: "set", Params: map[string]any{"x": nan}}
	if _, err := c.AppendJSON(nil); err == nil {
		t.Error("a NaN param encoded")
	}
	c = Command{ID: "x", Action: "set", Expires: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}
	if _, err := c.AppendJSON(nil); err == nil {
		t.Error("year 10000 encoded")
	}
}

// FuzzAppendJSON: whatever a device or the agent decoded, re-encoding it
// gives json.Marshal's bytes.
func FuzzAppendJSON(f *testing.F) {
	f.Add([]byte(`{"id":"a","action":"set","params":{"x":1.5,"y":["<"]},"attempt":2,"expires":"2026-12-01T00:00:00Z"}`))
	f.Add([]byte(`{"id":"a","ok":true,"state":{"power":"on"},"prior":{"power":"off"}}`))
	f.Add([]byte(`{"id":"a","ok":false,"error":{"code":"jammed","message":"\u2028"}}`))
	f.Add([]byte(`{"state":{"brightness":40},"ts":"2026-12-01T00:00:00.5+01:00"}`))
	f.Fuzz(func(t *testing.T, doc []byte) {
		if c, err := DecodeCommand(doc); err == nil {
			same(t, &c, c.AppendJSON)
		}
		if a, err := DecodeAck(doc); err == nil {
			same(t, &a, a.AppendJSON)
		}
		if s, err := DecodeState(doc); err == nil {
			same(t, &s, s.AppendJSON)
		}
	})
}
