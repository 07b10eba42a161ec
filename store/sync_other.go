//go:build !linux

package store

import "os"

func datasync(f *os.File) error { return f.Sync() }

func preallocate(*os.File, int64) {}
