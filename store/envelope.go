package store

import (
	"encoding/binary"
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
)

// A mission record is a fixed header followed by the mission:
//
//	[0]      form: formJSON (the mission as JSON) or formArchive (the
//	         mission and its timeline, compressed: see archive.go)
//	[1]      mission encoding schema (driver.SchemaVersion)
//	[2]      state (stateCode)
//	[3:11]   creation sequence, big-endian
//	[11:19]  mission version, big-endian
//	[19:27]  finish time in Unix ns, big-endian; 0 while the mission is live
//	[27:35]  highest event seq recorded, big-endian
//	[35:]    the body
//
// A binary header lets a save check versions, refuse to rewrite history,
// move index entries and keep the per-state counts without decoding the
// body or reading the timeline inside the shared write transaction.
//
// Schema 1 files had a 33-byte header without form and state, starting
// with the mission schema (1); Open migrates them (migrate.go), and
// parseEnvelope still reads them, as a migration interrupted by a crash
// leaves both.
const (
	headerLen   = 35
	headerLenV1 = 33

	formJSON    = 0x10
	formArchive = 0x11
	// formLive is a live mission's record in bbolt: the header alone,
	// its JSON under the same key in the live bucket. Live missions are
	// rewritten at every step and are many times the size of an archive;
	// kept apart, they leave the missions bucket's pages to archives,
	// which fill them.
	formLive = 0x12
)

type envelope struct {
	form     byte
	schema   byte
	state    byte
	order    uint64
	version  uint64
	finished uint64
	seq      uint64
	body     []byte
}

func (e envelope) encode() []byte {
	b := make([]byte, headerLen+len(e.body))
	e.putHeader(b)
	copy(b[headerLen:], e.body)
	return b
}

func (e envelope) putHeader(b []byte) {
	b[0] = e.form
	if b[0] == 0 {
		b[0] = formJSON
	}
	b[1] = e.schema
	b[2] = e.state
	binary.BigEndian.PutUint64(b[3:11], e.order)
	binary.BigEndian.PutUint64(b[11:19], e.version)
	binary.BigEndian.PutUint64(b[19:27], e.finished)
	binary.BigEndian.PutUint64(b[27:35], e.seq)
}

// parseEnvelope reads the header; body aliases b.
func parseEnvelope(b []byte) (envelope, error) {
	if len(b) < 1 {
		return envelope{}, fmt.Errorf("%w: empty record", ErrCorrupt)
	}
	var e envelope
	switch b[0] {
	case formJSON, formArchive, formLive:
		if len(b) < headerLen {
			return envelope{}, fmt.Errorf("%w: record is %d bytes, shorter than its %d-byte header", ErrCorrupt, len(b), headerLen)
		}
		e = envelope{
			form: b[0], schema: b[1], state: b[2],
			order:    binary.BigEndian.Uint64(b[3:11]),
			version:  binary.BigEndian.Uint64(b[11:19]),
			finished: binary.BigEndian.Uint64(b[19:27]),
			seq:      binary.BigEndian.Uint64(b[27:35]),
			body:     b[headerLen:],
		}
	case 1:
		if len(b) < headerLenV1 {
			return envelope{}, fmt.Errorf("%w: record is %d bytes, shorter than its %d-byte header", ErrCorrupt, len(b), headerLenV1)
		}
		e = envelope{
			form: formJSON, schema: b[0], state: stateUnknown,
			order:    binary.BigEndian.Uint64(b[1:9]),
			version:  binary.BigEndian.Uint64(b[9:17]),
			finished: binary.BigEndian.Uint64(b[17:25]),
			seq:      binary.BigEndian.Uint64(b[25:33]),
			body:     b[headerLenV1:],
		}
	default:
		if b[0] > formLive {
			return envelope{}, fmt.Errorf("%w: record form %#x is newer than this build's", ErrSchema, b[0])
		}
		return envelope{}, fmt.Errorf("%w: unknown record form %#x", ErrCorrupt, b[0])
	}
	if e.schema > driver.SchemaVersion {
		return envelope{}, fmt.Errorf("%w: record schema %d is newer than this build's %d", ErrSchema, e.schema, driver.SchemaVersion)
	}
	if e.schema < driver.SchemaVersion {
		return envelope{}, fmt.Errorf("%w: record schema %d was not migrated to %d", ErrCorrupt, e.schema, driver.SchemaVersion)
	}
	return e, nil
}

// record reads a mission's record from bbolt, a live one's JSON from the
// live bucket; the body aliases the transaction's memory. found is false
// when there is no record.
func record(missions, live *bolt.Bucket, id []byte) (e envelope, found bool, err error) {
	rec := missions.Get(id)
	if rec == nil {
		return envelope{}, false, nil
	}
	if e, err = parseEnvelope(rec); err != nil {
		return e, true, err
	}
	if e.form == formLive {
		if e.body = live.Get(id); e.body == nil {
			return e, true, fmt.Errorf("%w: live mission %q has no record in the live bucket", ErrCorrupt, id)
		}
		e.form = formJSON
	}
	return e, true, nil
}

// decodeMission decodes a stored record. It never panics, whatever b holds.
func decodeMission(b []byte) (*driver.Mission, error) {
	e, err := parseEnvelope(b)
	if err != nil {
		return nil, err
	}
	return e.mission()
}

// json returns the mission's JSON, inflating an archive's.
func (e envelope) json() ([]byte, error) {
	body, _, err := e.contents(false)
	return body, err
}

// contents returns the mission's JSON and, with events set, an archive's
// events (nil for other forms), inflating an archive once for both.
func (e envelope) contents(events bool) ([]byte, []eventRec, error) {
	if e.form == formArchive {
		return readArchive(e.body, events)
	}
	return e.body, nil, nil
}

// mission decodes the envelope's body and checks it against the header.
func (e envelope) mission() (*driver.Mission, error) {
	body, err := e.json()
	if err != nil {
		return nil, err
	}
	return e.decode(body)
}

// decode decodes the mission JSON of the envelope, as json or contents
// return it, and checks it against the header.
func (e envelope) decode(body []byte) (*driver.Mission, error) {
	var m driver.Mission
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("%w: mission json: %w", ErrCorrupt, err)
	}
	if m.Version != e.version {
		return nil, fmt.Errorf("%w: mission %q has version %d, its header %d", ErrCorrupt, m.ID, m.Version, e.version)
	}
	return &m, nil
}

// events returns the archived events of an archive record, nil for JSON.
func (e envelope) events() ([]eventRec, error) {
	_, evs, err := e.contents(true)
	return evs, err
}

// The state byte of a record header. Codes are stored: append only.
var stateCodes = [...]driver.State{
	"", // stateUnknown: a v1 record, or a state this build does not know
	driver.StatePending, driver.StateRunning, driver.StatePaused,
	driver.StateStepRunning, driver.StateStepSucceeded, driver.StateStepFailed,
	driver.StateCompensating, driver.StateSucceeded, driver.StateFailed,
	driver.StateCancelled,
}

const stateUnknown = 0

func stateCode(s driver.State) byte {
	for i, c := range stateCodes {
		if c == s {
			return byte(i)
		}
	}
	return stateUnknown
}

func stateOf(code byte) driver.State {
	if int(code) < len(stateCodes) {
		return stateCodes[code]
	}
	return ""
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
