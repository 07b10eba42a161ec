package store

import (
	"maps"
	"slices"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/jsonenc"
)

// A commit encodes the whole mission and each of its new events, and
// with json.Marshal reflection over their maps, times and nested structs
// was the largest CPU cost of a step. appendMission and appendEvent write
// the bytes json.Marshal writes without it; TestAppendMissionMatchesMarshal
// and TestAppendEventMatchesMarshal fill every field at random, including
// ones added to driver's types later, and keep the two identical.

// enc adds the optional members of missions and events to the general
// encoder.
type enc struct{ jsonenc.Encoder }

func (e *enc) optStr(key, v string) {
	if v != "" {
		e.Raw(key)
		e.String(v)
	}
}

func (e *enc) optInt(key string, v int) {
	if v != 0 {
		e.Raw(key)
		e.Int(int64(v))
	}
}

func (e *enc) optDur(key string, d driver.Duration) {
	if d != 0 {
		e.Raw(key)
		e.String(time.Duration(d).String())
	}
}

func (e *enc) optTime(key string, t time.Time) {
	if !t.IsZero() {
		e.Raw(key)
		e.Time(t)
	}
}

// appendMission appends m's JSON encoding to dst.
func appendMission(dst []byte, m *driver.Mission) ([]byte, error) {
	e := enc{jsonenc.New(dst)}
	e.Raw(`{"id":`)
	e.String(m.ID)
	e.Raw(`,"type":`)
	e.String(m.Type)
	e.Raw(`,"priority":`)
	e.Int(int64(m.Priority))
	e.Raw(`,"context":{"schema":`)
	e.Int(int64(m.Context.Schema))
	if len(m.Context.Values) > 0 {
		e.Raw(`,"values":`)
		e.Object(m.Context.Values)
	}
	e.Raw(`},"steps":`)
	if m.Steps == nil {
		e.Raw("null")
	} else {
		e.Raw("[")
		for i := range m.Steps {
			if i > 0 {
				e.Raw(",")
			}
			e.step(&m.Steps[i])
		}
		e.Raw("]")
	}
	e.Raw(`,"state":`)
	e.String(string(m.State))
	p := &m.Progress
	e.Raw(`,"progress":{"step":`)
	e.Int(int64(p.Step))
	e.Raw(`,"attempt":`)
	e.Int(int64(p.Attempt))
	e.Raw(`,"undo":`)
	e.Int(int64(p.Undo))
	if p.Cause != "" {
		e.Raw(`,"cause":`)
		e.String(string(p.Cause))
	}
	if p.Gen != 0 {
		e.Raw(`,"gen":`)
		e.Int(int64(p.Gen))
	}
	e.Raw(`},"results":`)
	e.results(m.Results)
	if len(m.Undo) > 0 {
		e.Raw(`,"undo":`)
		e.results(m.Undo)
	}
	e.optStr(`,"error":`, m.Error)
	e.optStr(`,"reason":`, m.Reason)
	e.Raw(`,"meta":`)
	e.meta(&m.Meta)
	e.Raw(`,"version":`)
	e.Uint(m.Version)
	e.Raw(`,"seq":`)
	e.Uint(m.Seq)
	e.Raw(`,"lease":{`)
	start := e.Len()
	if m.Lease.Owner != "" {
		e.Member(start, `"owner":`)
		e.String(m.Lease.Owner)
	}
	if !m.Lease.Expires.IsZero() {
		e.Member(start, `"expires":`)
		e.Time(m.Lease.Expires)
	}
	e.Raw(`},"due":`)
	e.Time(m.Due)
	e.Raw(`,"control":{`)
	c := &m.Control
	start = e.Len()
	field := func(key string) { e.Member(start, key) }
	if c.Pause {
		field(`"pause":true`)
	}
	if c.Cancel {
		field(`"cancel":true`)
	}
	if c.CancelReason != "" {
		field(`"cancel_reason":`)
		e.String(c.CancelReason)
	}
	if c.Wait {
		field(`"wait":true`)
	}
	if c.WaitFor != "" {
		field(`"wait_for":`)
		e.String(c.WaitFor)
	}
	e.Raw("}}")
	return e.Bytes()
}

// appendEvent appends ev's JSON encoding to dst.
func appendEvent(dst []byte, ev *driver.Event) ([]byte, error) {
	e := enc{jsonenc.New(dst)}
	e.Raw(`{"mission_id":`)
	e.String(ev.MissionID)
	e.Raw(`,"seq":`)
	e.Uint(ev.Seq)
	e.Raw(`,"type":`)
	e.String(ev.Type)
	e.optStr(`,"trace_id":`, ev.TraceID)
	e.Raw(`,"input":`)
	e.String(string(ev.Input))
	e.Raw(`,"from":`)
	e.String(string(ev.From))
	e.Raw(`,"to":`)
	e.String(string(ev.To))
	e.Raw(`,"step":`)
	e.Int(int64(ev.Step))
	e.optStr(`,"step_id":`, ev.StepID)
	e.optInt(`,"attempt":`, ev.Attempt)
	e.optStr(`,"error":`, ev.Error)
	e.optStr(`,"code":`, ev.Code)
	e.Raw(`,"time":`)
	e.Time(ev.Time)
	e.optStr(`,"detail":`, ev.Detail)
	e.optDur(`,"backoff":`, ev.Backoff)
	e.optStr(`,"group":`, ev.Group)
	e.Raw("}")
	return e.Bytes()
}

func (e *enc) step(s *driver.Step) {
	e.Raw(`{"id":`)
	e.String(s.ID)
	e.Raw(`,"kind":`)
	e.String(s.Kind)
	e.optStr(`,"name":`, s.Name)
	e.optStr(`,"target":`, s.Target)
	if len(s.Params) > 0 {
		e.Raw(`,"params":`)
		e.RawMessage(s.Params)
	}
	e.optDur(`,"timeout":`, s.Timeout)
	e.Raw(`,"retry":`)
	e.retry(&s.Retry)
	if c := s.Compensate; c != nil {
		e.Raw(`,"compensate":{"kind":`)
		e.String(c.Kind)
		if len(c.Params) > 0 {
			e.Raw(`,"params":`)
			e.RawMessage(c.Params)
		}
		e.optDur(`,"timeout":`, c.Timeout)
		e.Raw(`,"retry":`)
		e.retry(&c.Retry)
		e.Raw("}")
	}
	if s.ContinueOnError {
		e.Raw(`,"continue_on_error":true`)
	}
	if g := s.Group; g != nil {
		e.Raw(`,"group":{"id":`)
		e.String(g.ID)
		e.optStr(`,"policy":`, string(g.Policy))
		e.optInt(`,"quorum":`, g.Quorum)
		e.Raw("}")
	}
	e.Raw("}")
}

func (e *enc) retry(p *driver.RetryPolicy) {
	e.Raw("{")
	start := e.Len()
	key := func(k string) { e.Member(start, k) }
	if p.MaxAttempts != 0 {
		key(`"max_attempts":`)
		e.Int(int64(p.MaxAttempts))
	}
	if p.InitialBackoff != 0 {
		key(`"initial_backoff":`)
		e.String(p.InitialBackoff.String())
	}
	if p.Multiplier != 0 {
		key(`"multiplier":`)
		e.Float(p.Multiplier)
	}
	if p.MaxBackoff != 0 {
		key(`"max_backoff":`)
		e.String(p.MaxBackoff.String())
	}
	if p.Jitter != 0 {
		key(`"jitter":`)
		e.Float(p.Jitter)
	}
	if p.MaxElapsed != 0 {
		key(`"max_elapsed":`)
		e.String(p.MaxElapsed.String())
	}
	e.Raw("}")
}

func (e *enc) results(rs []driver.StepResult) {
	if rs == nil {
		e.Raw("null")
		return
	}
	e.Raw("[")
	for i := range rs {
		if i > 0 {
			e.Raw(",")
		}
		r := &rs[i]
		e.Raw(`{"status":`)
		e.String(string(r.Status))
		e.Raw(`,"attempts":`)
		e.Int(int64(r.Attempts))
		e.optInt(`,"waits":`, r.Waits)
		if len(r.Outputs) > 0 {
			e.Raw(`,"outputs":`)
			e.Object(r.Outputs)
		}
		e.optStr(`,"error":`, r.Error)
		e.optStr(`,"code":`, r.Code)
		e.optTime(`,"started":`, r.Started)
		e.optTime(`,"finished":`, r.Finished)
		e.optDur(`,"duration":`, r.Duration)
		e.optInt(`,"late_acks":`, r.LateAcks)
		e.optTime(`,"due":`, r.Due)
		e.optStr(`,"wait_for":`, r.WaitFor)
		e.Raw("}")
	}
	e.Raw("]")
}

func (e *enc) meta(md *driver.Metadata) {
	e.Raw(`{"created":`)
	e.Time(md.Created)
	e.optTime(`,"started":`, md.Started)
	e.Raw(`,"updated":`)
	e.Time(md.Updated)
	e.optTime(`,"finished":`, md.Finished)
	e.Raw(`,"trace_id":`)
	e.String(md.TraceID)
	e.optStr(`,"request_key":`, md.RequestKey)
	e.optStr(`,"source":`, md.Source)
	e.optTime(`,"deadline":`, md.Deadline)
	e.optDur(`,"budget":`, md.Budget)
	if len(md.Labels) > 0 {
		e.Raw(`,"labels":{`)
		for i, k := range slices.Sorted(maps.Keys(md.Labels)) {
			if i > 0 {
				e.Raw(",")
			}
			e.String(k)
			e.Raw(":")
			e.String(md.Labels[k])
		}
		e.Raw("}")
	}
	e.Raw("}")
}
