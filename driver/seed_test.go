package driver

import (
	"os"
	"strconv"
)

func envSeed() uint64 {
	s, _ := strconv.ParseUint(os.Getenv("SORTIE_SEED"), 10, 64)
	return s
}
