//go:build !linux

package store

import (
	"errors"
	"os"
)

func datasync(f *os.File) error { return f.Sync() }

func openDirect(string) (*os.File, error) { return nil, errors.ErrUnsupported }
