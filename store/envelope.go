package store

import (
	"encoding/binary"
	"encoding/json"
	"fmt"

	"github.com/sortie-edge/sortie/driver"
)

// The envelope is a fixed header followed by the mission JSON:
//
//	[0]      record schema (driver.SchemaVersion)
//	[1:9]    creation sequence, big-endian
//	[9:17]   mission version, big-endian
//	[17:25]  finish time in Unix ns, big-endian; 0 while the mission is live
//	[25:33]  highest event seq recorded, big-endian
//	[33:]    the mission as JSON
//
// A binary header lets a save check versions, refuse to rewrite history
// and move index entries without decoding JSON or reading the timeline
// inside the shared write transaction.
const headerLen = 33

type envelope struct {
	schema   byte
	order    uint64
	version  uint64
	finished uint64
	seq      uint64
	body     []byte
}

func (e envelope) encode() []byte {
	b := make([]byte, headerLen+len(e.body))
	b[0] = e.schema
	binary.BigEndian.PutUint64(b[1:9], e.order)
	binary.BigEndian.PutUint64(b[9:17], e.version)
	binary.BigEndian.PutUint64(b[17:25], e.finished)
	binary.BigEndian.PutUint64(b[25:33], e.seq)
	copy(b[headerLen:], e.body)
	return b
}

// parseEnvelope reads the header; body aliases b.
func parseEnvelope(b []byte) (envelope, error) {
	if len(b) < headerLen {
		return envelope{}, fmt.Errorf("%w: record is %d bytes, shorter than its %d-byte header", ErrCorrupt, len(b), headerLen)
	}
	e := envelope{
		schema:   b[0],
		order:    binary.BigEndian.Uint64(b[1:9]),
		version:  binary.BigEndian.Uint64(b[9:17]),
		finished: binary.BigEndian.Uint64(b[17:25]),
		seq:      binary.BigEndian.Uint64(b[25:33]),
		body:     b[headerLen:],
	}
	switch {
	case e.schema > driver.SchemaVersion:
		return envelope{}, fmt.Errorf("%w: record schema %d is newer than this build's %d", ErrSchema, e.schema, driver.SchemaVersion)
	case e.schema < driver.SchemaVersion:
		// Layout migrations in Open rewrite old records, so one here
		// means the file was changed behind the store's back.
		return envelope{}, fmt.Errorf("%w: record schema %d was not migrated to %d", ErrCorrupt, e.schema, driver.SchemaVersion)
	}
	return e, nil
}

// decodeMission decodes a stored record. It never panics, whatever b holds.
func decodeMission(b []byte) (*driver.Mission, error) {
	e, err := parseEnvelope(b)
	if err != nil {
		return nil, err
	}
	return e.mission()
}

// mission decodes the envelope's body and checks it against the header.
func (e envelope) mission() (*driver.Mission, error) {
	var m driver.Mission
	if err := json.Unmarshal(e.body, &m); err != nil {
		return nil, fmt.Errorf("%w: mission json: %w", ErrCorrupt, err)
	}
	if m.Version != e.version {
		return nil, fmt.Errorf("%w: mission %q has version %d, its header %d", ErrCorrupt, m.ID, m.Version, e.version)
	}
	return &m, nil
}

// finishedAt is the finish time recorded for m, in Unix ns: 0 while the
// mission is live, and never 0 once it is terminal (a missing or early
// Finished falls back to Updated, then to 1) so the header tells the two
// apart.
func finishedAt(m *driver.Mission) uint64 {
	if !m.State.Terminal() {
		return 0
	}
	t := m.Meta.Finished
	if t.IsZero() {
		t = m.Meta.Updated
	}
	if t.IsZero() || t.UnixNano() <= 0 {
		return 1
	}
	return uint64(t.UnixNano())
}
