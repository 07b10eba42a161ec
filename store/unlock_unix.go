//go:build unix

package store

import (
	"errors"
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

// sameOwnerAndMode gives the file at path the owner and mode of like, so
// that a file made by root for a service's user stays readable by it.
func sameOwnerAndMode(path string, like *os.File) error {
	fi, err := like.Stat()
	if err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		if err := os.Chown(path, int(st.Uid), int(st.Gid)); err != nil && !errors.Is(err, os.ErrPermission) {
			return err
		}
	}
	return os.Chmod(path, fi.Mode().Perm())
}
