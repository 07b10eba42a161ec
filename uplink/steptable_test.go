package uplink

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/sortie-edge/sortie/driver"
)

// TestStepTableDecodesFromEitherAgent decodes a batch from an agent
// before step tables (IDs on every summary, no names or targets) and one
// from an agent with them: both are taken, each summary as it came.
func TestStepTableDecodesFromEitherAgent(t *testing.T) {
	for name, c := range map[string]struct {
		mission           string
		ids, names, targs []string
	}{
		"before step tables": {`{"steps":2,"step_ids":["a","b"]}`, []string{"a", "b"}, nil, nil},
		"with a table": {`{"steps":2,"step_ids":["a","b"],"step_names":["turn_on lamp level=3","lock door"],"step_targets":["lamp","door"]}`,
			[]string{"a", "b"}, []string{"turn_on lamp level=3", "lock door"}, []string{"lamp", "door"}},
		"an entry without the table": {`{"steps":2}`, nil, nil, nil},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := DecodeBatch([]byte(`{"gateway":"gw","entries":[{"seq":1,"event":{"mission_id":"m","seq":1},"mission":` + c.mission + `}]}`))
			if err != nil {
				t.Fatal(err)
			}
			s := b.Entries[0].Mission
			if !reflect.DeepEqual(s.StepIDs, c.ids) || !reflect.DeepEqual(s.StepNames, c.names) || !reflect.DeepEqual(s.StepTargets, c.targs) {
				t.Errorf("table = %q %q %q, want %q %q %q", s.StepIDs, s.StepNames, s.StepTargets, c.ids, c.names, c.targs)
			}
		})
	}
}

// TestStepTableOfTheWrongShapeIsDroppedNotTheBatch: a column whose
// length is not the IDs' is dropped, an overlong name is cut, and the
// entry is kept; what an older hub reads of a new summary (its own
// fields) is unchanged by the table.
func TestStepTableOfTheWrongShapeIsDroppedNotTheBatch(t *testing.T) {
	long := strings.Repeat("é", 300)
	sum := driver.Summary{Scene: "s", Steps: 2, StepIDs: []string{"a", "b"}, StepNames: []string{"x", long}, StepTargets: []string{"lamp"},
		StepStatus: []driver.StepStatus{driver.StepSucceeded, driver.StepFailed, driver.StepPending}}
	p, err := json.Marshal(Batch{Gateway: "gw", Entries: []Entry{{Seq: 1, Event: driver.Event{MissionID: "m", Seq: 1}, Mission: sum}}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := DecodeBatch(p)
	if err != nil {
		t.Fatal(err)
	}
	s := b.Entries[0].Mission
	if s.StepTargets != nil || s.StepStatus != nil || len(s.StepNames) != 2 {
		t.Fatalf("targets %q, statuses %q, names %d: want the short columns dropped, the names kept", s.StepTargets, s.StepStatus, len(s.StepNames))
	}
	if n := s.StepNames[1]; len(n) > maxStepText || !strings.HasPrefix(long, n) || !strings.HasSuffix(n, "é") {
		t.Errorf("a %d-byte name became %d bytes (%q): want it cut at %d on a rune's edge", len(long), len(n), n, maxStepText)
	}
	// An older hub's Summary: the same struct without the table's
	// columns, which encoding/json skips.
	var old struct {
		Scene   string   `json:"scene"`
		Steps   int      `json:"steps"`
		StepIDs []string `json:"step_ids"`
	}
	raw, _ := json.Marshal(sum)
	if err := json.Unmarshal(raw, &old); err != nil || old.Steps != 2 || len(old.StepIDs) != 2 {
		t.Errorf("an older reader gets %+v (%v)", old, err)
	}
}
