package uplink

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/sortie-edge/sortie/bundle"
)

// The decoders never panic, reject with ErrMessage, and accept only
// what their documented checks allow.

func addSeeds(f *testing.F, seeds ...string) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Add([]byte(""))
	f.Add([]byte("null"))
	f.Add([]byte("{}"))
	f.Add([]byte("{} {}"))
	f.Add([]byte(`{"a":`))
	f.Add(make([]byte, MaxMessage+1))
}

func checkErr(t *testing.T, err error) {
	if err != nil && !errors.Is(err, ErrMessage) {
		t.Fatalf("error %v does not wrap ErrMessage", err)
	}
}

func FuzzDecodeBatch(f *testing.F) {
	addSeeds(f,
		`{"gateway":"gw-01","entries":[{"seq":1,"event":{"mission_id":"m1","seq":1,"type":"created","input":"","from":"","to":"PENDING","step":-1,"time":"2025-03-01T12:00:00Z"},"mission":{"scene":"go_home","state":"PENDING","priority":0,"step":0,"steps":2,"created":"2025-03-01T12:00:00Z","updated":"2025-03-01T12:00:00Z"}}]}`,
		`{"gateway":"gw-01","entries":[{"seq":9,"event":{"mission_id":"m1","seq":4},"mission":{},"compacted":true}]}`,
		`{"gateway":"gw/01","entries":[]}`,
		`{"gateway":"gw-01","entries":[{"seq":0,"event":{"mission_id":"m1","seq":1}}]}`,
		`{"gateway":"gw-01","entries":[{"seq":1,"event":{"mission_id":"","seq":1}}]}`,
		`{"gateway":"gw-01","after":3,"acked":3,"outbox":"00c0ffee00c0ffee","entries":[]}`,
		`{"gateway":"gw-01","after":3,"outbox":"a b","entries":[]}`,
		`{"gateway":"gw-01","entries":[{"seq":1,"event":{"mission_id":"m1","seq":1},"mission":{"steps":2,"step_ids":["a","b"],"step_names":["turn_on lamp","x"],"step_targets":["lamp","door"],"step_status":["succeeded","failed"]}}]}`,
		`{"gateway":"gw-01","entries":[{"seq":1,"event":{"mission_id":"m1","seq":1},"mission":{"steps":2,"step_ids":["a"],"step_names":["turn_on lamp","x"],"step_targets":null,"step_status":[1]}}]}`,
	)
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := DecodeBatch(b)
		checkErr(t, err)
		if err != nil {
			return
		}
		for _, e := range v.Entries {
			if e.Seq == 0 || e.Event.Seq == 0 || e.Event.MissionID == "" {
				t.Fatalf("accepted entry %+v", e)
			}
			// A step table's columns can be indexed by the IDs'.
			s, n := e.Mission, len(e.Mission.StepIDs)
			if s.StepNames != nil && len(s.StepNames) != n || s.StepTargets != nil && len(s.StepTargets) != n || s.StepStatus != nil && len(s.StepStatus) != n {
				t.Fatalf("accepted a step table of %d IDs, %d names, %d targets, %d statuses", n, len(s.StepNames), len(s.StepTargets), len(s.StepStatus))
			}
		}
		// What was accepted survives a round trip.
		again, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeBatch(again); err != nil {
			t.Fatalf("re-encoded batch rejected: %v", err)
		}
	})
}

func FuzzDecodeTraceBatch(f *testing.F) {
	addSeeds(f,
		`{"gateway":"gw-01","traces":[{"seq":1,"request_id":"r-1","at":"2026-12-02T07:00:00Z","via":"mqtt","scene":"go_home","outcome":"rejected","reason":"already_running","message":"scene go_home is already running"}]}`,
		`{"gateway":"gw-01","traces":[{"seq":2,"request_id":"r 1","outcome":"accepted"}]}`,
		`{"gateway":"gw-01","traces":[{"seq":0,"request_id":"r","outcome":"accepted"}]}`,
		`{"gateway":"gw-01","traces":[{"seq":3,"request_id":"r","outcome":"maybe"}]}`,
	)
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := DecodeTraceBatch(b)
		checkErr(t, err)
		if err != nil {
			return
		}
		for _, r := range v.Traces {
			if r.Seq == 0 || r.RequestID == "" || r.Outcome == "" {
				t.Fatalf("accepted record %+v", r)
			}
		}
		again, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeTraceBatch(again); err != nil {
			t.Fatalf("re-encoded batch rejected: %v", err)
		}
	})
}

func FuzzDecodeControl(f *testing.F) {
	addSeeds(f,
		`{"id":"c1","action":"trigger","scene":"go_home","params":{"x":1},"request_id":"r1"}`,
		`{"id":"c2","action":"cancel","mission_id":"m1"}`,
		`{"id":"c3","action":"pause"}`,
		`{"id":"c4","action":"explode","mission_id":"m1"}`,
		`{"id":"","action":"retry","mission_id":"m1"}`,
		`{"id":"c5","action":"trigger","scene":"a/b"}`,
		`{"id":"c6","action":"bundle","bundle":{"hash":"`+bundle.HashOf([]byte(`{"format":1}`))+`","version":1,"bundle":{"format":1}}}`,
	)
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeControl(b)
		checkErr(t, err)
		id := ControlID(b)
		if err != nil {
			return
		}
		if id != c.ID {
			t.Fatalf("ControlID %q, the decoded control's %q", id, c.ID)
		}
		switch {
		case c.ID == "":
			t.Fatalf("accepted control without id: %+v", c)
		case c.Action == ActionTrigger && c.Scene == "":
			t.Fatalf("accepted trigger without scene: %+v", c)
		case c.Action == ActionBundle && (c.Bundle == nil || bundle.HashOf(c.Bundle.Bundle) != c.Bundle.Hash):
			t.Fatalf("accepted a bundle offer whose bytes are not its hash: %+v", c)
		case c.Action != ActionTrigger && c.Action != ActionBundle && c.MissionID == "":
			t.Fatalf("accepted %s without mission: %+v", c.Action, c)
		}
	})
}

func FuzzDecodeAck(f *testing.F) {
	addSeeds(f, `{"upto":42}`, `{"upto":3,"outbox":"00c0ffee00c0ffee","traces":2}`, `{"upto":-1}`, `{"upto":18446744073709551615}`, `{"upto":18446744073709551616}`, `{"upto":"1"}`)
	f.Fuzz(func(t *testing.T, b []byte) {
		_, err := DecodeAck(b)
		checkErr(t, err)
	})
}

func FuzzDecodeStatus(f *testing.F) {
	addSeeds(f,
		`{"gateway":"gw-01","state":"online","version":"1.2.3","started":"2025-03-01T12:00:00Z","time":"2025-03-01T12:00:01Z"}`,
		`{"gateway":"gw-01","state":"offline"}`,
		`{"gateway":"gw-01","state":"asleep"}`,
		`{"gateway":"gw-01","state":"online","started":"yesterday"}`,
	)
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodeStatus(b)
		checkErr(t, err)
		if err == nil && s.State != StateOnline && s.State != StateOffline {
			t.Fatalf("accepted state %q", s.State)
		}
	})
}

func FuzzDecodeHeartbeat(f *testing.F) {
	addSeeds(f,
		`{"gateway":"gw-01","version":"1.2.3","uptime_seconds":12.5,"backlog":3,"active_missions":1,"devices":[{"id":"lamp-1","type":"light","online":true,"state":{"on":true}}],"time":"2025-03-01T12:00:00Z"}`,
		`{"gateway":"gw-01","devices":null}`,
		`{"uptime_seconds":"long"}`,
	)
	f.Fuzz(func(t *testing.T, b []byte) {
		_, err := DecodeHeartbeat(b)
		checkErr(t, err)
	})
}

func FuzzDecodeControlResult(f *testing.F) {
	addSeeds(f,
		`{"id":"c1","ok":true,"mission_id":"m1","state":"PENDING"}`,
		`{"id":"c2","ok":false,"error":"no such mission","code":"not_found"}`,
		`{"ok":true}`,
	)
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeControlResult(b)
		checkErr(t, err)
		if err == nil && r.ID == "" {
			t.Fatal("accepted result without id")
		}
	})
}

func TestATraceRecordTheHubCannotTakeIsDroppedNotTheBatch(t *testing.T) {
	v, err := DecodeTraceBatch([]byte(`{"gateway":"gw","traces":[{"seq":1,"request_id":"r","outcome":"accepted"},{"seq":2,"request_id":"r","outcome":"from_the_future"},{"seq":3,"request_id":"a b","outcome":"accepted"}]}`))
	if err != nil || len(v.Traces) != 1 || v.Upto != 3 || v.Dropped != 2 {
		t.Fatalf("batch = %+v, %v; want one record kept, two dropped, upto 3", v, err)
	}
}
