package driver

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/internal/randfill"
)

// TestTxnCopyLeavesOriginal: what a transaction does to its copy (add
// context keys, replace outputs, change results, steps, labels, control)
// never shows in the committed snapshot it was copied from.
func TestTxnCopyLeavesOriginal(t *testing.T) {
	f := randfill.Filler{R: rand.New(rand.NewPCG(3, 4)), Types: map[reflect.Type]func(*rand.Rand, reflect.Value){
		reflect.TypeFor[Duration](): func(r *rand.Rand, v reflect.Value) { v.SetInt(r.Int64N(int64(3 * time.Hour))) },
	}}
	for range 200 {
		var m Mission
		f.Fill(reflect.ValueOf(&m).Elem())
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
