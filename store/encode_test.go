package store

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/randfill"
)

// filler fills missions and events; a driver.Duration is a step timeout
// or a backoff, up to hours, not the kind's nanoseconds.
func filler(r *rand.Rand) randfill.Filler {
	return randfill.Filler{R: r, Types: map[reflect.Type]func(*rand.Rand, reflect.Value){
		reflect.TypeFor[driver.Duration](): func(r *rand.Rand, v reflect.Value) { v.SetInt(r.Int64N(int64(3 * time.Hour))) },
	}}
}

func TestAppendMissionMatchesMarshal(t *testing.T) {
	matchesMarshal(t, 7, func(m *driver.Mission, dst []byte) ([]byte, error) { return appendMission(dst, m) })
}

func TestAppendEventMatchesMarshal(t *testing.T) {
	matchesMarshal(t, 11, func(ev *driver.Event, dst []byte) ([]byte, error) { return appendEvent(dst, ev) })
}

// matchesMarshal compares encode with json.Marshal over 3,000 randomly
// filled values of T.
func matchesMarshal[T any](t *testing.T, stream uint64, encode func(*T, []byte) ([]byte, error)) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	f := filler(rand.New(rand.NewPCG(seed, stream)))
	for i := range 3000 {
		var v T
		f.Fill(reflect.ValueOf(&v).Elem())
		want, werr := json.Marshal(&v)
		got, gerr := encode(&v, nil)
		if (werr != nil) != (gerr != nil) {
			t.Fatalf("value %d (seed %d): json.Marshal error %v, encoder error %v", i, seed, werr, gerr)
		}
		if werr == nil && !bytes.Equal(got, want) {
			t.Fatalf("value %d (seed %d) encodes differently:\nencoder      %s\njson.Marshal %s", i, seed, got, want)
		}
	}
}

func TestAppendMissionErrors(t *testing.T) {
	nan := 0.0
	nan /= nan
	for name, m := range map[string]*driver.Mission{
		"invalid params":  {Steps: []driver.Step{{ID: "a", Params: json.RawMessage(`{"a":`)}}},
		"year 10000":      {Due: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
		"NaN in context":  {Context: driver.Context{Values: map[string]any{"x": nan}}},
		"channel in ctx":  {Context: driver.Context{Values: map[string]any{"x": make(chan int)}}},
		"zone hour of 24": {Due: time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("", 24*3600))},
	} {
		_, werr := json.Marshal(m)
		_, gerr := appendMission(nil, m)
		if werr == nil || gerr == nil {
			t.Errorf("%s: json.Marshal error %v, appendMission error %v; want both to fail", name, werr, gerr)
		}
	}
}

// FuzzAppendMissionValues: any JSON a trigger or a device might send,
// once decoded into a mission's context and a step's outputs, encodes as
// json.Marshal encodes it.
func FuzzAppendMissionValues(f *testing.F) {
	for _, s := range randfill.Values {
		f.Add([]byte(s), false)
	}
	f.Add([]byte(`{"a":"\u0000\ud800","b":1E400}`), true)
	f.Fuzz(func(t *testing.T, doc []byte, useNumber bool) {
		var v map[string]any
		dec := json.NewDecoder(bytes.NewReader(doc))
		if useNumber {
			dec.UseNumber()
		}
		if dec.Decode(&v) != nil {
			return
		}
		m := driver.Mission{Context: driver.Context{Values: v}, Results: []driver.StepResult{{Outputs: v}}}
		want, werr := json.Marshal(&m)
		got, gerr := appendMission(nil, &m)
		if (werr != nil) != (gerr != nil) || werr == nil && !bytes.Equal(got, want) {
			t.Fatalf("appendMission %s (%v)\njson.Marshal  %s (%v)", got, gerr, want, werr)
		}
	})
}

func BenchmarkAppendMission(b *testing.B) {
	f := filler(rand.New(rand.NewPCG(1, 2)))
	var m driver.Mission
	for m.Steps == nil || m.Results == nil || m.Context.Values == nil {
		f.Fill(reflect.ValueOf(&m).Elem())
	}
	buf, _ := appendMission(nil, &m)
	b.Run("json.Marshal", func(b *testing.B) {
		for range b.N {
			_, _ = json.Marshal(&m) // measured, not used
		}
	})
	b.Run("appendMission", func(b *testing.B) {
		for range b.N {
			buf, _ = appendMission(buf[:0], &m)
		}
	})
}
