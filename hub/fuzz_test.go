package hub

import (
	"encoding/json"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/uplink"
)

// FuzzIngest feeds arbitrary batch payloads through the decoder and the
// store: nothing panics, and applying the same batch again stores
// nothing new (idempotence).
func FuzzIngest(f *testing.F) {
	seed := func(es ...uplink.Entry) []byte {
		b, _ := json.Marshal(uplink.Batch{Gateway: "gw", Entries: es})
		return b
	}
	f.Add(seed(entry(1, "m1", 1, driver.StatePending), entry(2, "m1", 3, driver.StateRunning)))
	f.Add(seed(compacted(entry(5, "m2", 9, driver.StateSucceeded)), entry(3, "m2", 2, driver.StateRunning)))
	f.Add(seed(entry(1, "m1", 1, driver.StateFailed), entry(1, "m1", 1, driver.StateFailed)))
	f.Add([]byte(`{"gateway":"gw","entries":[{"seq":1,"event":{"mission_id":"x","seq":18446744073709551615},"mission":{}}]}`))
	f.Add([]byte(`{"gateway":"other","entries":[]}`))
	f.Add([]byte(`{`))
	st := testStore(f)
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := uplink.DecodeBatch(payload)
		if err != nil {
			return
		}
		now := time.Unix(0, 0)
		if _, err := ingest(st, now, "gw", b); err != nil {
			t.Fatalf("ingest: %v", err)
		}
		again, err := ingest(st, now, "gw", b)
		if err != nil {
			t.Fatalf("ingest again: %v", err)
		}
		if again.Stored != 0 || again.Late != 0 || len(again.Gaps) != 0 {
			t.Fatalf("second ingest changed something: %+v", again)
		}
	})
}

// FuzzQuery checks that no query string panics the missions filter.
func FuzzQuery(f *testing.F) {
	for _, s := range []string{"state=RUNNING,failed&limit=5", "since=2025-01-01T00:00:00Z&until=x", "cursor=AAAAAAAAAAAA", "limit=-1", "%zz"} {
		f.Add(s)
	}
	st := testStore(f)
	f.Fuzz(func(t *testing.T, raw string) {
		req := httptest.NewRequest("GET", "/api/missions", nil)
		req.URL.RawQuery = raw
		q, err := parseQuery(req)
		if err != nil {
			return
		}
		if _, _, err := st.Missions(t.Context(), q); err != nil && q.Cursor == "" {
			t.Fatalf("missions(%+v): %v", q, err)
		}
	})
}

// FuzzDecodeBatch checks that the hub's decoder accepts and rejects what
// uplink.DecodeBatch does and yields the same batch, with each raw event
// decoding to the same event.
func FuzzDecodeBatch(f *testing.F) {
	for _, es := range [][]uplink.Entry{
		{entry(1, "m1", 1, driver.StatePending), compacted(entry(2, "m1", 3, driver.StateRunning))},
		{entry(0, "m1", 1, driver.StatePending)},
		nil,
	} {
		b, _ := json.Marshal(uplink.Batch{Gateway: "gw", Entries: es})
		f.Add(b)
	}
	// Protocol 2: the chain fields must survive the hub's own decoder.
	f.Add([]byte(`{"gateway":"gw","after":4,"acked":2,"entries":[{"seq":5,"event":{"mission_id":"m","seq":1}}]}`))
	f.Add([]byte(`{"gateway":"gw","after":4,"acked":2,"outbox":"00c0ffee00c0ffee","entries":[{"seq":5,"event":{"mission_id":"m","seq":1}}]}`))
	f.Add([]byte(`{"gateway":"gw","after":4,"outbox":"a/b","entries":[]}`))
	f.Add([]byte(`{"gateway":"gw","entries":[{"seq":1,"event":null}]}`))
	f.Add([]byte(`{"gateway":"gw","entries":[{"seq":1,"event":{"mission_id":"m","seq":1,"time":"x"}}]}`))
	f.Add([]byte(`{"gateway":"gw","entries":[{"seq":1,"event":{"mission_id":"m","seq":1}}]} {}`))
	// Step tables, whole and of the wrong shape.
	f.Add([]byte(`{"gateway":"gw","entries":[{"seq":1,"event":{"mission_id":"m","seq":1},"mission":{"steps":1,"step_ids":["a"],"step_names":["on lamp"],"step_targets":["lamp"],"step_status":["failed"]}}]}`))
	f.Add([]byte(`{"gateway":"gw","entries":[{"seq":1,"event":{"mission_id":"m","seq":1},"mission":{"step_ids":["a"],"step_names":[],"step_targets":["a","b"]}}]}`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		want, werr := uplink.DecodeBatch(payload)
		got, raws, gerr := decodeBatch(payload)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("uplink err %v, hub err %v", werr, gerr)
		}
		if werr != nil {
			return
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("hub %+v\nuplink %+v", got, want)
		}
		for i, raw := range raws {
			var ev driver.Event
			if err := json.Unmarshal(raw, &ev); err != nil || !reflect.DeepEqual(ev, want.Entries[i].Event) {
				t.Fatalf("raw event %d %s decodes to %+v (%v), want %+v", i, raw, ev, err, want.Entries[i].Event)
			}
		}
	})
}
