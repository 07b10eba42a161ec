//go:build !linux

package wal

import "os"

func datasync(f *os.File) error { return f.Sync() }

// directFlags is zero where the log does not write O_DIRECT.
const directFlags = 0
