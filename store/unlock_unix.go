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

// tryLockFile takes the lock bbolt takes on a store file, without
// waiting: false means a store holds it.
func tryLockFile(f *os.File) (bool, error) {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if err == syscall.EWOULDBLOCK {
		return false, nil
	}
	return err == nil, err
}
