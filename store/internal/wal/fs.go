package wal

import (
	"errors"
	"io"
	"os"
	"path/filepath"
)

// FS is the file system a log is kept on: OS in production. It is the
// seam the store's power-loss tests (store/internal/walfs) use to drop
// what a real machine loses when its power goes: writes not yet synced,
// the blocks of a write in progress, directory entries not yet synced.
type FS interface {
	// OpenFile opens the named file as os.OpenFile does; flag may hold
	// O_DIRECT and O_DSYNC, which an FS may refuse (EINVAL), as tmpfs
	// refuses O_DIRECT.
	OpenFile(name string, flag int, perm os.FileMode) (File, error)
	// ReadFile returns the file's contents, as os.ReadFile does.
	ReadFile(name string) ([]byte, error)
	// Head returns the file's first n bytes (fewer if it is shorter) and
	// its size: a log's header, without reading its records.
	Head(name string, n int) ([]byte, int64, error)
	// Remove removes the named file, as os.Remove does.
	Remove(name string) error
	// SyncDir makes the creation, renaming or removal of the named file
	// durable: it syncs the directory that holds it.
	SyncDir(name string) error
}

// File is an open file of an FS.
type File interface {
	// WriteAt writes p at off, as (*os.File).WriteAt does; opened with
	// O_DSYNC, it is durable when it returns.
	WriteAt(p []byte, off int64) (int, error)
	// Sync makes the file's data, and its size when that changed,
	// durable (fdatasync).
	Sync() error
	// Close closes the file, without syncing it.
	Close() error
}

// OS is the operating system's file system.
var OS FS = osFS{}

type osFS struct{}

func (osFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (osFS) ReadFile(name string) ([]byte, error) { return os.ReadFile(name) }

func (osFS) Head(name string, n int) ([]byte, int64, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, 0, err
	}
	defer func() { _ = f.Close() }() // read-only
	fi, err := f.Stat()
	if err != nil {
		return nil, 0, err
	}
	head := make([]byte, n)
	k, err := io.ReadFull(f, head)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return nil, 0, err
	}
	return head[:k], fi.Size(), nil
}
func (osFS) Remove(name string) error  { return os.Remove(name) }
func (osFS) SyncDir(name string) error { return SyncDir(name) }

type osFile struct{ *os.File }

func (f osFile) Sync() error { return datasync(f.File) }

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
