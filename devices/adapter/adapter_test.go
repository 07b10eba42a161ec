package adapter

import "testing"

func TestToleranceCoversTheRoundTripOfConvertedUnits(t *testing.T) {
	// Every kelvin from 2000 to 6500 through whole mireds and back lands
	// within the tolerance of where it started.
	for k := 2000.0; k <= 6500; k++ {
		m := float64(int(1e6/k + 0.5))
		back := float64(int(1e6/m + 0.5))
		if d := back - k; d > Tolerance("color_temp", k) || -d > Tolerance("color_temp", k) {
			t.Fatalf("%v K -> %v mireds -> %v K is beyond the tolerance %v", k, m, back, Tolerance("color_temp", k))
		}
	}
	if Tolerance("power", 1) != 0 || Tolerance("locked", 1) != 0 {
		t.Error("keys that are not converted must match exactly")
	}
}
