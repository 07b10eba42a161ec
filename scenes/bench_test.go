package scenes

import (
	"encoding/json"
	"testing"
	"time"
)

// compare runs raw and ours b.N times each and reports how many times
// slower ours is than the raw baseline measured in the same run.
func compare(b *testing.B, raw, ours func() error) {
	b.Helper()
	b.ReportAllocs()
	b.StopTimer()
	start := time.Now()
	for range b.N {
		if err := raw(); err != nil {
			b.Fatal(err)
		}
	}
	rawTime := time.Since(start)
	b.StartTimer()
	start = time.Now()
	for range b.N {
		if err := ours(); err != nil {
			b.Fatal(err)
		}
	}
	oursTime := time.Since(start)
	b.StopTimer()
	if rawTime > 0 {
		b.ReportMetric(oursTime.Seconds()/rawTime.Seconds(), "x-raw")
	}
}

// BenchmarkDecodeTrigger compares strict, validated decoding with plain
// json.Unmarshal into a map.
func BenchmarkDecodeTrigger(b *testing.B) {
	payload := []byte(`{"scene":"go_home","request_id":"r-123","source":"alexa","params":{"temperature":23}}`)
	compare(b,
		func() error { var m map[string]any; return json.Unmarshal(payload, &m) },
		func() error { _, err := DecodeTrigger(payload); return err })
}

// BenchmarkBuild compares building go_home's spec, registry checks of
// the trigger included, with only JSON-encoding the finished steps.
func BenchmarkBuild(b *testing.B) {
	c := shipped(b)
	trig := map[string]any{"temperature": 23}
	spec, err := c.Build("go_home", trig)
	if err != nil {
		b.Fatal(err)
	}
	compare(b,
		func() error { _, err := json.Marshal(spec.Steps); return err },
		func() error { _, err := c.Build("go_home", trig); return err })
}
