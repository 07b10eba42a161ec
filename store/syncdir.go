package store

import (
	"os"
	"path/filepath"
)

// syncDir makes the creation of a file in dir durable, so a log whose
// records were acknowledged does not vanish with its directory entry.
func syncDir(path string) error {
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
