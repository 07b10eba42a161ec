package hub

import (
	"encoding/json"
	"testing"
)

// FuzzRolloutSpec: whatever POST /api/rollouts is given, the spec is
// refused with an error or cut into stages that start with a canary of
// at least one gateway, grow strictly and end with every target.
func FuzzRolloutSpec(f *testing.F) {
	for _, s := range []string{
		`{}`,
		`{"canary":2,"waves":[10,50,100]}`,
		`{"canary_percent":1,"factor":2,"cap":500}`,
		`{"canary_percent":100}`,
		`{"factor":1.1,"cap":1}`,
		`{"waves":[0.001,99.999]}`,
		`{"gateways":["a","b"],"abort_percent":100,"abort_min":0}`,
	} {
		f.Add([]byte(s), uint16(1000))
	}
	f.Fuzz(func(t *testing.T, body []byte, n16 uint16) {
		var spec RolloutSpec
		if json.Unmarshal(body, &spec) != nil {
			return
		}
		spec.defaults()
		if spec.check() != nil {
			return
		}
		n := int(n16 % 20000)
		st := spec.stages(n)
		if n == 0 {
			return
		}
		if len(st) == 0 || st[0] < 1 || st[len(st)-1] != n {
			t.Fatalf("stages %v of %d targets", st, n)
		}
		for i := 1; i < len(st); i++ {
			if st[i] <= st[i-1] {
				t.Fatalf("stages %v do not grow", st)
			}
		}
	})
}
