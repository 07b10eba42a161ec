package mqttc

import (
	"testing"
	"time"
)

// TestBackoffDoublesCappedAndJittered: each wait lies in the upper half
// of a bound that doubles from the first wait up to the cap.
func TestBackoffDoublesCappedAndJittered(t *testing.T) {
	const first, most = 500 * time.Millisecond, 10 * time.Second
	bound := first
	for n := range 70 {
		for range 20 {
			if d := backoff(n, first, most); d < bound/2 || d > bound {
				t.Fatalf("backoff(%d) = %v, want in [%v, %v]", n, d, bound/2, bound)
			}
		}
		bound = min(2*bound, most)
	}
}
