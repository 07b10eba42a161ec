//go:build unix

package store

import (
	"os"
	"syscall"
)

// unlockFile drops bbolt's flock on f. Closing f alone is not enough
// after bbolt panicked mid-Open: its mmap still references the open file,
// and with it the lock.
func unlockFile(f *os.File) {
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
}
