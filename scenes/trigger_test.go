package scenes

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func TestDecodeTrigger(t *testing.T) {
	good := []struct {
		name string
		in   string
		want Trigger
	}{
		{"full", `{"scene":"go_home","request_id":"r-123","source":"alexa","params":{"temperature":23}}`,
			Trigger{Scene: "go_home", RequestID: "r-123", Source: "alexa", Params: map[string]any{"temperature": int64(23)}}},
		{"minimal", `{"scene":"go_home","request_id":"r"}`, Trigger{Scene: "go_home", RequestID: "r"}},
		{"scalars", `{"scene":"s","request_id":"r","params":{"a":1.5,"b":true,"c":"x","d":-2,"e":2.0}}`,
			Trigger{Scene: "s", RequestID: "r", Params: map[string]any{"a": 1.5, "b": true, "c": "x", "d": int64(-2), "e": int64(2)}}},
		{"empty params", `{"scene":"s","request_id":"r","params":{}}`, Trigger{Scene: "s", RequestID: "r"}},
		{"null params", `{"scene":"s","request_id":"r","params":null}`, Trigger{Scene: "s", RequestID: "r"}},
		{"whitespace", " \n{\"scene\":\"s\",\"request_id\":\"r\"}\n ", Trigger{Scene: "s", RequestID: "r"}},
	}
	for _, tc := range good {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeTrigger([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %#v\nwant %#v", got, tc.want)
			}
		})
	}

	manyParams := make(map[string]int)
	for i := range MaxTriggerParams + 1 {
		manyParams[fmt.Sprintf("p%d", i)] = i
	}
	many, _ := json.Marshal(map[string]any{"scene": "s", "request_id": "r", "params": manyParams})
	bad := []struct {
		name   string
		in     string
		reason string
	}{
		{"empty", ``, ReasonBadJSON},
		{"not json", `scene=go_home`, ReasonBadJSON},
		{"truncated", `{"scene":"go_home"`, ReasonBadJSON},
		{"array", `[1,2]`, ReasonBadJSON},
		{"string", `"go_home"`, ReasonBadJSON},
		{"null", `null`, ReasonMissingField},
		{"trailing data", `{"scene":"s","request_id":"r"} {}`, ReasonBadJSON},
		{"too large", `{"scene":"s","request_id":"r","source":"` + strings.Repeat("a", MaxTriggerSize) + `"}`, ReasonTooLarge},
		{"missing scene", `{"request_id":"r"}`, ReasonMissingField},
		{"empty scene", `{"scene":"","request_id":"r"}`, ReasonMissingField},
		{"missing request_id", `{"scene":"s"}`, ReasonMissingField},
		{"unknown field", `{"scene":"s","request_id":"r","requestid":"x"}`, ReasonInvalidField},
		{"scene not a string", `{"scene":5,"request_id":"r"}`, ReasonInvalidField},
		{"scene with slash", `{"scene":"a/b","request_id":"r"}`, ReasonInvalidField},
		{"scene with wildcard", `{"scene":"a+","request_id":"r"}`, ReasonInvalidField},
		{"request_id with hash", `{"scene":"s","request_id":"r#1"}`, ReasonInvalidField},
		{"request_id control char", `{"scene":"s","request_id":"r\u0001"}`, ReasonInvalidField},
		{"request_id too long", `{"scene":"s","request_id":"` + strings.Repeat("r", 200) + `"}`, ReasonInvalidField},
		{"bad source", `{"scene":"s","request_id":"r","source":"a b"}`, ReasonInvalidField},
		{"params not an object", `{"scene":"s","request_id":"r","params":[1]}`, ReasonInvalidField},
		{"nested param", `{"scene":"s","request_id":"r","params":{"a":{"b":1}}}`, ReasonInvalidParam},
		{"array param", `{"scene":"s","request_id":"r","params":{"a":[1]}}`, ReasonInvalidParam},
		{"null param", `{"scene":"s","request_id":"r","params":{"a":null}}`, ReasonInvalidParam},
		{"huge number", `{"scene":"s","request_id":"r","params":{"a":1e400}}`, ReasonInvalidParam},
		{"bad param name", `{"scene":"s","request_id":"r","params":{"a b":1}}`, ReasonInvalidParam},
		{"long string param", `{"scene":"s","request_id":"r","params":{"a":"` + strings.Repeat("x", MaxParamString+1) + `"}}`, ReasonInvalidParam},
		{"too many params", string(many), ReasonInvalidParam},
		{"invalid utf8", "{\"scene\":\"s\xff\",\"request_id\":\"r\"}", ReasonInvalidField},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeTrigger([]byte(tc.in))
			var te *TriggerError
			if !errors.As(err, &te) {
				t.Fatalf("got %v, want a *TriggerError", err)
			}
			if te.Reason != tc.reason || te.Msg == "" {
				t.Errorf("got %s (%s), want %s", te.Reason, te.Msg, tc.reason)
			}
		})
	}
}

// TestTriggerToMission is the path the agent takes: decode, build.
func TestTriggerToMission(t *testing.T) {
	c := shipped(t)
	for _, tc := range []struct {
		in     string
		reason string
	}{
		{`{"scene":"go_home","request_id":"r-1","params":{"temperature":23}}`, ""},
		{`{"scene":"go_home","request_id":"r-2","params":{"temperature":40}}`, ReasonInvalidParam},
		{`{"scene":"go_hom","request_id":"r-3"}`, ReasonUnknownScene},
	} {
		tr, err := DecodeTrigger([]byte(tc.in))
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Build(tr.Scene, tr.Params)
		reply := Reply{RequestID: tr.RequestID, Status: StatusAccepted, Scene: tr.Scene}
		if err != nil {
			reply = Rejection(tr.RequestID, tr.Scene, err, "internal")
		}
		if reply.Reason != tc.reason || (tc.reason != "") != (reply.Status == StatusRejected) {
			t.Errorf("%s: reply %+v, want reason %q", tc.in, reply, tc.reason)
		}
	}
}

func TestReplyJSON(t *testing.T) {
	r := Rejection("r-1", "go_home", errors.New("queue full"), "busy")
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), `{"request_id":"r-1","status":"rejected","scene":"go_home","reason":"busy","message":"queue full"}`; got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	ok := Reply{RequestID: "r", Status: StatusAccepted, MissionID: "m1", Scene: "s", State: "PENDING", Duplicate: true}
	b, _ = json.Marshal(ok)
	if got, want := string(b), `{"request_id":"r","status":"accepted","mission_id":"m1","scene":"s","state":"PENDING","duplicate":true}`; got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestABadNotAfterIsAnInvalidField(t *testing.T) {
	for _, in := range []string{`"yesterday"`, `5`, `"2026-13-01T00:00:00Z"`} {
		_, err := DecodeTrigger([]byte(`{"scene":"go_home","request_id":"r","not_after":` + in + `}`))
		var te *TriggerError
		if !errors.As(err, &te) || te.Reason != ReasonInvalidField || !strings.Contains(te.Msg, "not_after") {
			t.Errorf("not_after %s: %v, want invalid_field naming not_after", in, err)
		}
	}
}

func TestATriggerWithAKeyGivenTwiceIsRefused(t *testing.T) {
	for _, in := range []string{
		`{"scene":"go_home","scene":"all_off","request_id":"r"}`,
		`{"scene":"go_home","request_id":"r","params":{"temperature":20,"temperature":30}}`,
	} {
		_, err := DecodeTrigger([]byte(in))
		var te *TriggerError
		if !errors.As(err, &te) || te.Reason != ReasonInvalidField || !strings.Contains(te.Msg, "twice") {
			t.Errorf("%s: %v, want invalid_field naming the key", in, err)
		}
	}
	// The same key in two objects is fine.
	if _, err := DecodeTrigger([]byte(`{"scene":"go_home","request_id":"r","params":{"scene":"x"}}`)); err != nil {
		var te *TriggerError
		if !errors.As(err, &te) || strings.Contains(te.Msg, "twice") {
			t.Errorf("a key in two objects taken for a duplicate: %v", err)
		}
	}
}

func TestIDsWithFormatCharactersAreRefused(t *testing.T) {
	for _, id := range []string{"r\u202e1", "r\u200b1", "r\ufeff"} {
		_, err := DecodeTrigger([]byte(`{"scene":"go_home","request_id":"` + id + `"}`))
		var te *TriggerError
		if !errors.As(err, &te) || te.Reason != ReasonInvalidField {
			t.Errorf("request_id %s: %v, want invalid_field", id, err)
		}
	}
}
