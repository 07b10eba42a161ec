package devices

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
)

// FuzzNormalizeOwned: normalizing a decoded map in place gives what the
// copying normalize gives, at any depth.
func FuzzNormalizeOwned(f *testing.F) {
	f.Add([]byte(`{"target":24,"mode":"cool","params":{"a":-0.5e-3,"b":0,"c":1E+2}}`))
	f.Add([]byte(`{"power":"on","brightness":100,"list":[1,"a",null,true,false,{"x":[]}],"o":{}}`))
	f.Add([]byte(`{"a":[1,[2.5,{"b":-3}],"x"],"c":{"d":{"e":1e400}},"f":18446744073709551616}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		decode := func() map[string]any {
			d := json.NewDecoder(bytes.NewReader(b))
			d.UseNumber()
			var m map[string]any
			if d.Decode(&m) != nil {
				return nil
			}
			return m
		}
		m := decode()
		if m == nil {
			return
		}
		want := normalizeMap(decode())
		normalizeOwned(m)
		if !reflect.DeepEqual(m, want) {
			t.Fatalf("%s: in place %#v, copied %#v", b, m, want)
		}
	})
}
