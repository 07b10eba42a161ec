package jsonenc_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/internal/jsonenc"
	"github.com/sortie-edge/sortie/internal/randfill"
)

func FuzzAppendStringMatchesMarshal(f *testing.F) {
	for _, s := range randfill.Strings {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := jsonenc.AppendString([]byte("x"), s); !bytes.Equal(got[1:], want) || got[0] != 'x' {
			t.Fatalf("AppendString(%q) = %s, json.Marshal %s", s, got, want)
		}
	})
}

// FuzzAppendValueMatchesMarshal: any JSON a trigger or a device might
// send, decoded as our decoders decode it, encodes as json.Marshal
// encodes it, error or bytes.
func FuzzAppendValueMatchesMarshal(f *testing.F) {
	for _, s := range randfill.Values {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Add([]byte(`{"a":"\u0000\ud800","b":1E400}`), true)
	f.Add([]byte(`[1,"x",null,{"y":-0.0}]`), false)
	f.Fuzz(func(t *testing.T, doc []byte, useNumber bool) {
		var v any
		dec := json.NewDecoder(bytes.NewReader(doc))
		if useNumber {
			dec.UseNumber()
		}
		if dec.Decode(&v) != nil {
			return
		}
		want, werr := json.Marshal(v)
		got, gerr := jsonenc.AppendValue(nil, v)
		if (werr != nil) != (gerr != nil) || werr == nil && !bytes.Equal(got, want) {
			t.Fatalf("AppendValue %s (%v)\njson.Marshal %s (%v)", got, gerr, want, werr)
		}
	})
}

func TestAppendValueGoKinds(t *testing.T) {
	many := map[string]any{} // past the handful sorted on the stack
	for i := range 40 {
		many[fmt.Sprintf("k%02d", (i*17)%40)] = i
	}
	for _, v := range []any{
		many,
		map[string]any{"int": 7, "int64": int64(-3), "float": 0.25, "big": 1e21, "tiny": 1e-7, "nil map": map[string]any(nil), "nil slice": []any(nil)},
		json.Number("12.5e3"), json.Number(""), struct{ A int }{1}, []any{true, false, "<&>"},
	} {
		want, werr := json.Marshal(v)
		got, gerr := jsonenc.AppendValue(nil, v)
		if werr != nil || gerr != nil || !bytes.Equal(got, want) {
			t.Errorf("%#v: AppendValue %s (%v), json.Marshal %s (%v)", v, got, gerr, want, werr)
		}
	}
}

func TestAppendValueErrorsAsMarshal(t *testing.T) {
	for name, v := range map[string]any{
		"NaN":            math.NaN(),
		"infinity":       map[string]any{"x": math.Inf(1)},
		"channel":        []any{make(chan int)},
		"invalid number": json.Number("01"),
	} {
		_, werr := json.Marshal(v)
		_, gerr := jsonenc.AppendValue(nil, v)
		if werr == nil || gerr == nil {
			t.Errorf("%s: json.Marshal error %v, AppendValue error %v; want both to fail", name, werr, gerr)
		}
	}
}

func TestAppendTimeMatchesMarshal(t *testing.T) {
	for _, tm := range []time.Time{
		{}, time.Date(2026, 12, 1, 3, 4, 5, 678, time.UTC),
		time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("", -(5*3600+1800))),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("", 24*3600)),
	} {
		want, werr := json.Marshal(tm)
		got, gerr := jsonenc.AppendTime(nil, tm)
		if (werr != nil) != (gerr != nil) || werr == nil && !bytes.Equal(got, want) {
			t.Errorf("%v: AppendTime %s (%v), json.Marshal %s (%v)", tm, got, gerr, want, werr)
		}
	}
}

func TestRawMessageCompactsAndEscapes(t *testing.T) {
	for _, r := range append(randfill.Raw, `{"a":`, " 1 ") {
		want, werr := json.Marshal(json.RawMessage(r))
		e := jsonenc.New(nil)
		e.RawMessage(json.RawMessage(r))
		got, gerr := e.Bytes()
		if (werr != nil) != (gerr != nil) || werr == nil && !bytes.Equal(got, want) {
			t.Errorf("%q: RawMessage %s (%v), json.Marshal %s (%v)", r, got, gerr, want, werr)
		}
	}
}
