package driver

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// filler sets every field reachable from a value to a random value of
// the kinds missions hold, zero values included, so that a field added
// to Mission later is exercised without this test knowing its name.
type filler struct{ r *rand.Rand }

var (
	timeType  = reflect.TypeFor[time.Time]()
	rawType   = reflect.TypeFor[json.RawMessage]()
	durType   = reflect.TypeFor[Duration]()
	valueType = reflect.TypeFor[map[string]any]()
)

var sampleStrings = []string{
	"", "go_home", "living-light", `quote " backslash \ slash /`, "<b>&amp;</b>",
	"tab\tnewline\ncr\rbell\a\b\f\x00\x1f", "caf\u00e9 \u2028 \u2029 \U0001F600", "bad \xff\xfe utf8",
	"µs", "01a22ee711d60001cc5a9029-0-2",
}

var sampleRaw = []string{
	`{"device":"living-light","action":"turn_on"}`, `{ "a" : [1, 2.5, "x y"] }`, `"<tag>&"`,
	`null`, `{"s":"\u2028"}`, "[\n1,\n2\n]", `{"n":-0.5e-3}`,
}

// sampleValues are JSON documents decoded into the shapes handlers and
// devices produce.
var sampleValues = []string{
	`{}`, `{"power":"on","brightness":100,"color_temp":4000}`,
	`{"prior_state":{"fan":"auto","target":24.5,"list":[1,"two",null,true,{"x":[]}]},"ok":false,"none":null}`,
	`{"big":1e22,"small":1e-7,"neg":-0,"frac":0.1,"int":9007199254740993,"html":"<&>"}`,
	`{"nested":{"deeper":{"deepest":[[[]]]}},"empty":{},"u":"\u2028\u00e9"}`,
}

func (f filler) fill(v reflect.Value) {
	if f.r.IntN(5) == 0 {
		v.SetZero()
		return
	}
	switch v.Type() {
	case timeType:
		zones := []*time.Location{time.UTC, time.FixedZone("", 2*3600), time.FixedZone("", -(5*3600 + 30*60)), time.FixedZone("", 45)}
		t := time.Unix(f.r.Int64N(4e9), f.r.Int64N(1e9)).In(zones[f.r.IntN(len(zones))])
		v.Set(reflect.ValueOf(t))
		return
	case rawType:
		v.Set(reflect.ValueOf(json.RawMessage(sampleRaw[f.r.IntN(len(sampleRaw))])))
		return
	case durType:
		v.SetInt(f.r.Int64N(int64(3 * time.Hour)))
		return
	case valueType:
		var m map[string]any
		dec := json.NewDecoder(bytes.NewReader([]byte(sampleValues[f.r.IntN(len(sampleValues))])))
		if f.r.IntN(2) == 0 {
			dec.UseNumber()
		}
		if err := dec.Decode(&m); err != nil {
			panic(err)
		}
		if f.r.IntN(3) == 0 {
			m["int"], m["int64"], m["float"] = f.r.IntN(1000), int64(-7), f.r.Float64()*1e6
		}
		v.Set(reflect.ValueOf(m))
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				f.fill(v.Field(i))
			}
		}
	case reflect.String:
		v.SetString(sampleStrings[f.r.IntN(len(sampleStrings))])
	case reflect.Int, reflect.Int64, reflect.Int32:
		v.SetInt(f.r.Int64N(2000) - 1000)
	case reflect.Uint64, reflect.Uint, reflect.Uint32:
		v.SetUint(f.r.Uint64N(1 << 40))
	case reflect.Float64:
		v.SetFloat([]float64{0, 1.5, 2, 0.1, 1e-7, 3e21, -12.25}[f.r.IntN(7)])
	case reflect.Bool:
		v.SetBool(f.r.IntN(2) == 0)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		f.fill(p.Elem())
		v.Set(p)
	case reflect.Slice:
		n := f.r.IntN(4)
		s := reflect.MakeSlice(v.Type(), n, n)
		for i := range n {
			f.fill(s.Index(i))
		}
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		for range f.r.IntN(4) {
			k := reflect.New(v.Type().Key()).Elem()
			f.fill(k)
			e := reflect.New(v.Type().Elem()).Elem()
			f.fill(e)
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	default:
		panic("filler: unhandled kind " + v.Kind().String() + " of " + v.Type().String())
	}
}

func TestAppendJSONMatchesMarshal(t *testing.T) {
	matchesMarshal(t, 7, (*Mission).AppendJSON)
}

func TestEventAppendJSONMatchesMarshal(t *testing.T) {
	matchesMarshal(t, 11, (*Event).AppendJSON)
}

// matchesMarshal compares encode with json.Marshal over 3,000 randomly
// filled values of T.
func matchesMarshal[T any](t *testing.T, stream uint64, encode func(*T, []byte) ([]byte, error)) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	f := filler{rand.New(rand.NewPCG(seed, stream))}
	for i := range 3000 {
		var v T
		f.fill(reflect.ValueOf(&v).Elem())
		want, werr := json.Marshal(&v)
		got, gerr := encode(&v, nil)
		if (werr != nil) != (gerr != nil) {
			t.Fatalf("value %d (seed %d): json.Marshal error %v, AppendJSON error %v", i, seed, werr, gerr)
		}
		if werr == nil && !bytes.Equal(got, want) {
			t.Fatalf("value %d (seed %d) encodes differently:\nAppendJSON   %s\njson.Marshal %s", i, seed, got, want)
		}
	}
}

func TestAppendJSONErrors(t *testing.T) {
	for name, m := range map[string]*Mission{
		"invalid params":  {Steps: []Step{{ID: "a", Params: json.RawMessage(`{"a":`)}}},
		"year 10000":      {Due: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
		"NaN in context":  {Context: Context{Values: map[string]any{"x": nanValue()}}},
		"channel in ctx":  {Context: Context{Values: map[string]any{"x": make(chan int)}}},
		"zone hour of 24": {Due: time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("", 24*3600))},
	} {
		_, werr := json.Marshal(m)
		_, gerr := m.AppendJSON(nil)
		if werr == nil || gerr == nil {
			t.Errorf("%s: json.Marshal error %v, AppendJSON error %v; want both to fail", name, werr, gerr)
		}
	}
}

func nanValue() float64 { z := 0.0; return z / z }

// FuzzAppendJSONValues: any JSON a trigger or a device might send, once
// decoded into a mission's context, encodes as json.Marshal encodes it.
func FuzzAppendJSONValues(f *testing.F) {
	for _, s := range sampleValues {
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
		m := Mission{Context: Context{Values: v}, Results: []StepResult{{Outputs: v}}}
		want, werr := json.Marshal(&m)
		got, gerr := m.AppendJSON(nil)
		if (werr != nil) != (gerr != nil) || werr == nil && !bytes.Equal(got, want) {
			t.Fatalf("AppendJSON %s (%v)\njson.Marshal %s (%v)", got, gerr, want, werr)
		}
	})
}

func BenchmarkAppendJSON(b *testing.B) {
	f := filler{rand.New(rand.NewPCG(1, 2))}
	var m Mission
	for m.Steps == nil || m.Results == nil || m.Context.Values == nil {
		f.fill(reflect.ValueOf(&m).Elem())
	}
	buf, _ := m.AppendJSON(nil)
	b.Run("json.Marshal", func(b *testing.B) {
		for range b.N {
			json.Marshal(&m)
		}
	})
	b.Run("AppendJSON", func(b *testing.B) {
		for range b.N {
			buf, _ = m.AppendJSON(buf[:0])
		}
	})
}

// TestTxnCopyLeavesOriginal: what a transaction does to its copy (add
// context keys, replace outputs, change results, steps, labels, control)
// never shows in the committed snapshot it was copied from.
func TestTxnCopyLeavesOriginal(t *testing.T) {
	f := filler{rand.New(rand.NewPCG(3, 4))}
	for range 200 {
		var m Mission
		f.fill(reflect.ValueOf(&m).Elem())
		before, err := json.Marshal(&m)
		if err != nil {
			continue // a filler value json cannot encode (e.g. year 10000)
		}
		c := m.txnCopy()
		if c.Context.Values == nil {
			c.Context.Values = map[string]any{}
		}
		c.Context.Values["added"] = map[string]any{"x": 1}
		for i := range c.Results {
			c.Results[i].Status = StepCompensated
			c.Results[i].Outputs = map[string]any{"replaced": true}
		}
		for i := range c.Undo {
			c.Undo[i].Attempts++
		}
		for i := range c.Steps {
			c.Steps[i].ID += "-changed"
		}
		if c.Meta.Labels == nil {
			c.Meta.Labels = map[string]string{}
		}
		c.Meta.Labels["added"] = "yes"
		c.Control.Cancel, c.Version, c.Progress.Step = true, c.Version+1, c.Progress.Step+1
		after, _ := json.Marshal(&m)
		if !bytes.Equal(before, after) {
			t.Fatalf("the snapshot changed with its copy:\nbefore %s\nafter  %s", before, after)
		}
	}
}
