package wal

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

// DirectFlags open the log for writes that bypass the page cache and are
// durable on return. File systems without O_DIRECT (tmpfs) refuse them,
// and the log then uses buffered writes and fdatasync.
const DirectFlags = syscall.O_DIRECT | syscall.O_DSYNC
