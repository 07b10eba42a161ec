package conf

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Bytes is a size in a config file: a plain number of bytes, or a
// number with a unit: KiB, MiB, GiB (powers of 1024), kB, MB, GB
// (powers of 1000), as in "32MiB" or "1.5 GB".
type Bytes int64

var byteUnits = []struct {
	suffix string
	n      float64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"kB", 1e3}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1},
}

// UnmarshalText reads a size; TOML integers arrive as text too.
func (b *Bytes) UnmarshalText(text []byte) error {
	s := strings.TrimSpace(string(text))
	mult := 1.0
	for _, u := range byteUnits {
		if num, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = strings.TrimSpace(num), u.n
			break
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || !(v >= 0) || math.IsInf(v, 0) || v*mult > math.MaxInt64/2 {
		return fmt.Errorf("%q is not a size (a number of bytes, or with a unit: KiB, MiB, GiB, kB, MB, GB)", text)
	}
	*b = Bytes(v * mult)
	return nil
}

// MarshalText writes the size in the largest binary unit that divides it.
func (b Bytes) MarshalText() ([]byte, error) { return []byte(b.String()), nil }

func (b Bytes) String() string {
	for _, u := range []struct {
		suffix string
		n      int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if b != 0 && int64(b)%u.n == 0 {
			return strconv.FormatInt(int64(b)/u.n, 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(b), 10)
}
