//go:build !linux

package wal

import (
	"errors"
	"os"
)

func datasync(f *os.File) error { return f.Sync() }

func openDirect(string) (*os.File, error) { return nil, errors.ErrUnsupported }
