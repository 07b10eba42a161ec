//go:build !linux

package wal

import "os"

func datasync(f *os.File) error { return f.Sync() }

// DirectFlags is zero where the log does not write O_DIRECT.
const DirectFlags = 0
