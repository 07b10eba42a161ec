package wire

import (
	"strconv"

	"github.com/sortie-edge/sortie/internal/jsonenc"
)

// The messages of every step, a command one way and an ack and a state
// report the other, are encoded without reflection: on a gateway's small
// core json.Marshal of their maps and times was a measurable part of a
// step's latency. Each AppendJSON writes the bytes json.Marshal writes
// (TestAppendJSONMatchesMarshal, FuzzAppendJSON).

// AppendJSON appends c's JSON encoding to dst.
func (c *Command) AppendJSON(dst []byte) ([]byte, error) {
	var err error
	dst = append(dst, `{"id":`...)
	dst = jsonenc.AppendString(dst, c.ID)
	dst = append(dst, `,"action":`...)
	dst = jsonenc.AppendString(dst, c.Action)
	if len(c.Params) > 0 {
		dst = append(dst, `,"params":`...)
		if dst, err = jsonenc.AppendValue(dst, c.Params); err != nil {
			return nil, err
		}
	}
	dst = append(dst, `,"attempt":`...)
	dst = strconv.AppendInt(dst, int64(c.Attempt), 10)
	dst = append(dst, `,"expires":`...)
	if dst, err = jsonenc.AppendTime(dst, c.Expires); err != nil {
		return nil, err
	}
	if c.TraceID != "" {
		dst = append(dst, `,"trace_id":`...)
		dst = jsonenc.AppendString(dst, c.TraceID)
	}
	return append(dst, '}'), nil
}

// AppendJSON appends a's JSON encoding to dst.
func (a *Ack) AppendJSON(dst []byte) ([]byte, error) {
	var err error
	dst = append(dst, `{"id":`...)
	dst = jsonenc.AppendString(dst, a.ID)
	dst = append(dst, `,"ok":`...)
	dst = strconv.AppendBool(dst, a.OK)
	if a.Error != nil {
		dst = append(dst, `,"error":{"code":`...)
		dst = jsonenc.AppendString(dst, a.Error.Code)
		if a.Error.Message != "" {
			dst = append(dst, `,"message":`...)
			dst = jsonenc.AppendString(dst, a.Error.Message)
		}
		dst = append(dst, '}')
	}
	if len(a.State) > 0 {
		dst = append(dst, `,"state":`...)
		if dst, err = jsonenc.AppendValue(dst, a.State); err != nil {
			return nil, err
		}
	}
	if len(a.Prior) > 0 {
		dst = append(dst, `,"prior":`...)
		if dst, err = jsonenc.AppendValue(dst, a.Prior); err != nil {
			return nil, err
		}
	}
	return append(dst, '}'), nil
}

// AppendJSON appends s's JSON encoding to dst.
func (s *StateReport) AppendJSON(dst []byte) ([]byte, error) {
	var err error
	dst = append(dst, `{"state":`...)
	if s.State == nil {
		dst = append(dst, "null"...)
	} else if dst, err = jsonenc.AppendValue(dst, s.State); err != nil {
		return nil, err
	}
	if !s.Time.IsZero() {
		dst = append(dst, `,"ts":`...)
		if dst, err = jsonenc.AppendTime(dst, s.Time); err != nil {
			return nil, err
		}
	}
	return append(dst, '}'), nil
}
