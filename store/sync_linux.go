package store

import (
	"os"
	"syscall"
)

// datasync flushes f's data, and its size only when that changed: the
// log is preallocated, so an append usually costs one device flush.
func datasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if err != syscall.EINTR {
			return err
		}
	}
}

// preallocate reserves n bytes for f. It is only an optimisation: a file
// system without fallocate just grows the file as it is written.
func preallocate(f *os.File, n int64) {
	_ = syscall.Fallocate(int(f.Fd()), 0, 0, n)
}
