//go:build !unix

package store

import "os"

// unlockFile is a no-op where bbolt locks differently; closing the file
// releases the lock there.
func unlockFile(*os.File) {}
