package wal

import (
	"errors"
	"os"
	"path/filepath"
)

// SyncDir makes the creation or renaming of the file at path durable, so
// a log whose records were acknowledged does not vanish with its
// directory entry; the store uses it for the files a restore renames.
func SyncDir(path string) error {
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}
