//go:build !unix

package store

import "os"

// unlockFile is a no-op where bbolt locks differently; closing the file
// releases the lock there.
func unlockFile(*os.File) {}

// tryLockFile cannot tell here whether a store holds the file; Restore
// then relies on the caller having stopped the agent.
func tryLockFile(*os.File) (bool, error) { return true, nil }

// sameOwnerAndMode gives the file at path the mode of like.
func sameOwnerAndMode(path string, like *os.File) error {
	fi, err := like.Stat()
	if err != nil {
		return err
	}
	return os.Chmod(path, fi.Mode().Perm())
}
