package store

import (
	"encoding/json"
	"testing"

	"github.com/sortie-edge/sortie/driver"
)

// FuzzDecodeMission feeds arbitrary bytes to the record decoder, which
// reads whatever a damaged file holds: it must fail cleanly, never panic,
// and anything it accepts must survive a round trip.
func FuzzDecodeMission(f *testing.F) {
	m := newMission(mid(1))
	body, _ := json.Marshal(m)
	good := envelope{schema: driver.SchemaVersion, order: 1, version: m.Version, body: body}.encode()
	f.Add(good)
	f.Add(good[:headerLen])
	f.Add(good[:headerLen-1])
	f.Add([]byte{})
	f.Add(envelope{schema: driver.SchemaVersion + 1, version: 1, body: body}.encode())
	f.Add(envelope{schema: driver.SchemaVersion, version: 1, body: []byte(`{"version":1,"steps":[{"timeout":"-5s"}]}`)}.encode())
	f.Add(envelope{schema: driver.SchemaVersion, version: 9, body: []byte(`null`)}.encode())
	f.Fuzz(func(t *testing.T, rec []byte) {
		m, err := decodeMission(rec)
		if err != nil {
			return
		}
		h, _ := parseEnvelope(rec)
		body, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("decoded mission does not encode: %v", err)
		}
		again, err := decodeMission(envelope{schema: h.schema, order: h.order, version: h.version, finished: h.finished, body: body}.encode())
		if err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
		sameJSON(t, again, m)
	})
}
