package hub

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/uplink"
)

// wireEvent decodes a driver.Event and keeps its JSON as received.
type wireEvent struct {
	ev  driver.Event
	raw json.RawMessage
	// again is set when the key came twice: the event is then the merge
	// of both, which raw does not show.
	again bool
}

// UnmarshalJSON decodes at once, so that a bad event fails the batch
// exactly as it does in uplink.DecodeBatch.
func (w *wireEvent) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	if err := json.Unmarshal(b, &w.ev); err != nil {
		return err
	}
	w.again = w.raw != nil
	w.raw = append(w.raw[:0], b...)
	return nil
}

// wireEntry is uplink.Entry with the event kept as received as well.
type wireEntry struct {
	Seq       uint64         `json:"seq"`
	Event     wireEvent      `json:"event"`
	Mission   driver.Summary `json:"mission"`
	Compacted bool           `json:"compacted,omitempty"`
}

type wireBatch struct {
	Gateway string      `json:"gateway"`
	Entries []wireEntry `json:"entries"`
	After   *uint64     `json:"after,omitempty"`
	Acked   uint64      `json:"acked,omitempty"`
	Outbox  string      `json:"outbox,omitempty"`
}

// decodeBatch is uplink.DecodeBatch that also returns each event's JSON
// as received, so the store keeps it without re-encoding it:
// at 20 events a batch that halves the ingest loop's work. It accepts
// and rejects exactly what uplink.DecodeBatch does (FuzzDecodeBatch).
func decodeBatch(b []byte) (uplink.Batch, []json.RawMessage, error) {
	if len(b) > uplink.MaxMessage {
		return uplink.Batch{}, nil, fmt.Errorf("%w: %d bytes (max %d)", uplink.ErrMessage, len(b), uplink.MaxMessage)
	}
	var w wireBatch
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&w); err != nil {
		return uplink.Batch{}, nil, fmt.Errorf("%w: %w", uplink.ErrMessage, err)
	}
	if dec.More() {
		return uplink.Batch{}, nil, fmt.Errorf("%w: trailing data", uplink.ErrMessage)
	}
	out := uplink.Batch{Gateway: w.Gateway, After: w.After, Acked: w.Acked, Outbox: w.Outbox}
	if w.Entries != nil {
		out.Entries = make([]uplink.Entry, len(w.Entries))
	}
	raws := make([]json.RawMessage, len(w.Entries))
	for i, e := range w.Entries {
		out.Entries[i] = uplink.Entry{Seq: e.Seq, Event: e.Event.ev, Mission: e.Mission, Compacted: e.Compacted}
		raws[i] = e.Event.raw
		if e.Event.again || raws[i] == nil {
			raws[i], _ = json.Marshal(&e.Event.ev) // a driver.Event always encodes
		}
	}
	if err := driver.ValidateID("gateway", out.Gateway); err != nil {
		return uplink.Batch{}, nil, fmt.Errorf("%w: %w", uplink.ErrMessage, err)
	}
	if err := uplink.ValidateOutbox(out.Outbox); err != nil {
		return uplink.Batch{}, nil, err
	}
	for i, e := range out.Entries {
		if e.Seq == 0 || e.Event.Seq == 0 {
			return uplink.Batch{}, nil, fmt.Errorf("%w: entry %d has no sequence number", uplink.ErrMessage, i)
		}
		if err := driver.ValidateID("mission id", e.Event.MissionID); err != nil {
			return uplink.Batch{}, nil, fmt.Errorf("%w: entry %d: %w", uplink.ErrMessage, i, err)
		}
		uplink.CheckStepTable(&out.Entries[i].Mission)
	}
	return out, raws, nil
}
