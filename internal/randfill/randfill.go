package randfill

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"time"
)

// Strings are the strings a filled value gets: the ones json.Marshal
// escapes or replaces in its own way among ordinary IDs.
var Strings = []string{
	"", "go_home", "living-light", `quote " backslash \ slash /`, "<b>&amp;</b>",
	"tab\tnewline\ncr\rbell\a\b\f\x00\x1f", "caf\u00e9 \u2028 \u2029 \U0001F600", "bad \xff\xfe utf8",
	"µs", "01a22ee711d60001cc5a9029-0-2",
}

// Raw are the json.RawMessage values a filled value gets: valid JSON,
// some of it not compact or with characters json.Marshal escapes.
var Raw = []string{
	`{"device":"living-light","action":"turn_on"}`, `{ "a" : [1, 2.5, "x y"] }`, `"<tag>&"`,
	`null`, `{"s":"\u2028"}`, "[\n1,\n2\n]", `{"n":-0.5e-3}`,
}

// Values are JSON documents that a filled map[string]any is decoded
// from, into the shapes step handlers and devices produce.
var Values = []string{
	`{}`, `{"power":"on","brightness":100,"color_temp":4000}`,
	`{"prior_state":{"fan":"auto","target":24.5,"list":[1,"two",null,true,{"x":[]}]},"ok":false,"none":null}`,
	`{"big":1e22,"small":1e-7,"neg":-0,"frac":0.1,"int":9007199254740993,"html":"<&>"}`,
	`{"nested":{"deeper":{"deepest":[[[]]]}},"empty":{},"u":"\u2028\u00e9"}`,
}

var (
	timeType  = reflect.TypeFor[time.Time]()
	rawType   = reflect.TypeFor[json.RawMessage]()
	valueType = reflect.TypeFor[map[string]any]()
)

// Filler sets values at random.
type Filler struct {
	R *rand.Rand
	// Types fills the values of types whose kind says too little, such
	// as a duration type that should hold minutes, not nanoseconds.
	Types map[reflect.Type]func(r *rand.Rand, v reflect.Value)
}

// Fill sets v, which must be settable, and everything reachable from its
// exported fields; a fifth of the values it meets are left zero.
func (f Filler) Fill(v reflect.Value) {
	if f.R.IntN(5) == 0 {
		v.SetZero()
		return
	}
	if fill, ok := f.Types[v.Type()]; ok {
		fill(f.R, v)
		return
	}
	switch v.Type() {
	case timeType:
		zones := []*time.Location{time.UTC, time.FixedZone("", 2*3600), time.FixedZone("", -(5*3600 + 30*60)), time.FixedZone("", 45)}
		t := time.Unix(f.R.Int64N(4e9), f.R.Int64N(1e9)).In(zones[f.R.IntN(len(zones))])
		v.Set(reflect.ValueOf(t))
		return
	case rawType:
		v.Set(reflect.ValueOf(json.RawMessage(Raw[f.R.IntN(len(Raw))])))
		return
	case valueType:
		v.Set(reflect.ValueOf(f.values()))
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				f.Fill(v.Field(i))
			}
		}
	case reflect.String:
		v.SetString(Strings[f.R.IntN(len(Strings))])
	case reflect.Int, reflect.Int64, reflect.Int32:
		v.SetInt(f.R.Int64N(2000) - 1000)
	case reflect.Uint64, reflect.Uint, reflect.Uint32:
		v.SetUint(f.R.Uint64N(1 << 40))
	case reflect.Float64:
		v.SetFloat([]float64{0, 1.5, 2, 0.1, 1e-7, 3e21, -12.25}[f.R.IntN(7)])
	case reflect.Bool:
		v.SetBool(f.R.IntN(2) == 0)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		f.Fill(p.Elem())
		v.Set(p)
	case reflect.Slice:
		n := f.R.IntN(4)
		s := reflect.MakeSlice(v.Type(), n, n)
		for i := range n {
			f.Fill(s.Index(i))
		}
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		for range f.R.IntN(4) {
			k := reflect.New(v.Type().Key()).Elem()
			f.Fill(k)
			e := reflect.New(v.Type().Elem()).Elem()
			f.Fill(e)
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	default:
		panic("randfill: unhandled kind " + v.Kind().String() + " of " + v.Type().String())
	}
}

// values decodes one of Values, with or without UseNumber, and sometimes
// adds the Go int and float kinds code puts in such maps.
func (f Filler) values() map[string]any {
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader([]byte(Values[f.R.IntN(len(Values))])))
	if f.R.IntN(2) == 0 {
		dec.UseNumber()
	}
	if err := dec.Decode(&m); err != nil {
		panic(err) // Values are valid JSON objects
	}
	if f.R.IntN(3) == 0 {
		m["int"], m["int64"], m["float"] = f.R.IntN(1000), int64(-7), f.R.Float64()*1e6
	}
	return m
}
