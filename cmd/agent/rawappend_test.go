package main

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"unsafe"
)

// rawAppender writes what one durable step needs at least: a 1.5 KB
// record (a step's result and the next step's begin, as the store's log
// writes them) in a whole 4096-byte block, as O_DIRECT requires, at the
// next offset of a preallocated file, opened O_DIRECT|O_DSYNC where the
// file system takes it (O_DSYNC alone where it does not: tmpfs) — the
// store's log append without the store. Unlike a bbolt commit it means
// the same on every machine: one device write and its flush.
type rawAppender struct {
	f    *os.File
	blk  []byte
	off  int64
	size int64
}

const rawBlock = 4096

func newRawAppender(b testing.TB, dir string) *rawAppender {
	b.Helper()
	path := filepath.Join(dir, "raw.log")
	const size = 4 << 20
	// Preallocated with real blocks, as the log is: the appends then
	// write data, not file system metadata.
	if err := os.WriteFile(path, make([]byte, size), 0o600); err != nil {
		b.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|directFlag|syscall.O_DSYNC, 0)
	if errors.Is(err, syscall.EINVAL) {
		f, err = os.OpenFile(path, os.O_RDWR|syscall.O_DSYNC, 0)
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = f.Close() })
	buf := make([]byte, 2*rawBlock)
	skip := rawBlock - int(uintptr(unsafe.Pointer(&buf[0]))%rawBlock)
	blk := buf[skip : skip+rawBlock : skip+rawBlock]
	for i := range 1536 {
		blk[i] = byte(i)
	}
	return &rawAppender{f: f, blk: blk, size: size}
}

// append writes the next block and returns when it is durable.
func (r *rawAppender) append() error {
	if _, err := r.f.WriteAt(r.blk, r.off); err != nil {
		return err
	}
	r.off = (r.off + rawBlock) % r.size
	return nil
}
