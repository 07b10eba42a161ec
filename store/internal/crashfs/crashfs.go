// Package crashfs is an in-memory wal.FS whose power can be cut, for
// tests only: what a machine keeps after a power cut is what was synced,
// plus whatever of the rest the disk happened to write. It is modelled on
// what bbolt's robustness tests do with a device-mapper target that drops
// unsynced writes (tests/dmflakey); nothing here is theirs.
//
// The model, per file: every write lands in what reads see at once, and
// on "disk" only once a Sync covers it (or at once when the file was
// opened O_DSYNC). Truncation is a write of the size. Per directory: a
// created or removed name is durable once SyncDir covers it. When the
// power is cut, every file keeps its synced bytes; of the writes not yet
// synced, Drop mode keeps only some 512-byte sectors of the last one (a
// torn write) and loses the others, and Scatter mode keeps a random
// subset of the sectors of each, as a disk that wrote back part of its
// cache would. Directory entries not yet synced are lost in Drop mode and
// kept or lost at random in Scatter mode. Sectors are atomic: a sector is
// old or new, never a mix (the log's CRCs would catch a mix anyway).
//
// The cut comes at a chosen operation (CutAt) or when the test calls Cut;
// from then on every operation fails with ErrPowerCut, as if the process
// had died with the machine, and Restart returns the file system the
// machine boots with.
package crashfs

import (
	"bytes"
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"

	"github.com/sortie-edge/sortie/store/internal/wal"
)

// ErrPowerCut is what every operation returns once the power is cut.
var ErrPowerCut = errors.New("power cut (simulated)")

// Sector is the unit a disk writes atomically.
const Sector = 512

// Mode chooses what survives of the writes not yet synced.
type Mode int

const (
	// Drop keeps none of them but some sectors of the last one.
	Drop Mode = iota
	// Scatter keeps a random subset of the sectors of every one of them.
	Scatter
)

// FS is the file system. It is safe for concurrent use.
type FS struct {
	mu       sync.Mutex
	rng      *rand.Rand
	mode     Mode
	noDirect bool
	names    map[string]*inode // what the process sees
	durable  map[string]*inode // what the directories hold on disk
	ops      int               // operations counted so far
	seq      int               // writes issued so far
	cutAt    int               // the operation that cuts the power; 0: none
	onCut    func()
	dead     bool
	image    map[string]content // after the cut: what the disk holds
}

type inode struct {
	data    content // what reads see
	synced  content // what the disk holds
	pending []write
}

// write is one unsynced write, sector by sector; a truncation is one
// with trunc set and off the new size.
type write struct {
	off     int64
	sectors []sector
	trunc   bool
	seq     int // the order of writes across files
}

// sector is part of a disk sector written: the file's bytes from off,
// nil for zeros (most of a log's preallocation).
type sector struct {
	off int64
	n   int
	p   []byte
}

// bytes returns what s writes.
func (s sector) bytes() []byte {
	if s.p == nil {
		return zeros[:s.n]
	}
	return s.p
}

var zeros [Sector]byte

// content is a file's bytes, kept by sector with the all-zero sectors
// left out: a log is megabytes of zeros around a few blocks of records,
// and copying it whole at every sync and cut would be most of a test's
// time.
type content struct {
	size    int64
	sectors map[int64][]byte // sector index -> its bytes, Sector long
}

func (c *content) write(p []byte, off int64) {
	for len(p) > 0 {
		i, at := off/Sector, off%Sector
		n := min(int64(len(p)), Sector-at)
		s := c.sectors[i]
		if s == nil && !allZero(p[:n]) {
			if c.sectors == nil {
				c.sectors = map[int64][]byte{}
			}
			s = make([]byte, Sector)
			c.sectors[i] = s
		}
		if s != nil {
			copy(s[at:], p[:n])
		}
		p, off = p[n:], off+n
		c.size = max(c.size, off)
	}
}

func (c *content) truncate(n int64) {
	for i, s := range c.sectors {
		switch {
		case i*Sector >= n:
			delete(c.sectors, i)
		case i*Sector+Sector > n:
			clear(s[n-i*Sector:])
		}
	}
	c.size = n
}

func (c *content) clone() content {
	out := content{size: c.size, sectors: make(map[int64][]byte, len(c.sectors))}
	for i, s := range c.sectors {
		out.sectors[i] = slices.Clone(s)
	}
	return out
}

func (c *content) bytes() []byte {
	b := make([]byte, c.size)
	for i, s := range c.sectors {
		copy(b[i*Sector:], s)
	}
	return b
}

// allZero reports whether p, at most a sector, is zeros.
func allZero(p []byte) bool { return bytes.Equal(p, zeros[:len(p)]) }

// apply makes w part of c.
func (c *content) apply(w write) {
	if w.trunc {
		c.truncate(w.off)
		return
	}
	for _, s := range w.sectors {
		c.write(s.bytes(), s.off)
	}
}

// split cuts a write into the disk's sectors, aligned to the file's
// offsets.
func split(p []byte, off int64) []sector {
	var out []sector
	for len(p) > 0 {
		n := min(int64(len(p)), Sector-off%Sector)
		sec := sector{off: off, n: int(n)}
		if !allZero(p[:n]) {
			sec.p = slices.Clone(p[:n])
		}
		out = append(out, sec)
		p, off = p[n:], off+n
	}
	return out
}

// Options configures New.
type Options struct {
	// Seed makes the choices of torn sectors and surviving writes.
	Seed uint64
	// Mode is what survives of unsynced writes.
	Mode Mode
	// NoDirect refuses O_DIRECT at open, as tmpfs does.
	NoDirect bool
}

// New returns an empty file system.
func New(o Options) *FS {
	return &FS{
		rng: rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15)), mode: o.Mode, noDirect: o.NoDirect,
		names: map[string]*inode{}, durable: map[string]*inode{},
	}
}

var _ wal.FS = (*FS)(nil)

// CutAt arranges for the power to be cut during the n-th operation from
// now (1 is the next one), after which fn runs, before the operation
// returns ErrPowerCut. Every call but ReadFile and Close counts. fn runs
// with the FS locked: it must not call the FS.
func (c *FS) CutAt(n int, fn func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cutAt, c.onCut = c.ops+n, fn
}

// Ops returns how many operations have been counted.
func (c *FS) Ops() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ops
}

// Cut cuts the power now, between operations, and reports whether it was
// still on; the function given to CutAt, if any, runs as at a cut there.
func (c *FS) Cut() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return false
	}
	c.cutLocked(c.onCut)
	return true
}

// Dead reports whether the power has been cut.
func (c *FS) Dead() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dead
}

// Restart returns the file system the machine boots with after the cut,
// which must have happened, and whose Mode and NoDirect it keeps; seed
// drives its own choices.
func (c *FS) Restart(seed uint64) *FS {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.dead {
		panic("crashfs: Restart before the power was cut")
	}
	n := New(Options{Seed: seed, Mode: c.mode, NoDirect: c.noDirect})
	for name, disk := range c.image {
		ino := &inode{data: disk.clone(), synced: disk.clone()}
		n.names[name], n.durable[name] = ino, ino
	}
	return n
}

// Names returns the files the process sees, sorted.
func (c *FS) Names() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for name := range c.names {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// op counts an operation; when it is the one chosen, it cuts the power,
// with torn the write in progress, if it is one. It returns ErrPowerCut
// when the power is, or just went, off.
func (c *FS) op(torn *inode, w write) error {
	if c.dead {
		return ErrPowerCut
	}
	c.ops++
	if c.ops != c.cutAt {
		return nil
	}
	if torn != nil {
		torn.pending = append(torn.pending, w)
	}
	c.cutLocked(c.onCut)
	return ErrPowerCut
}

// cutLocked computes what the disk holds and stops the file system.
func (c *FS) cutLocked(fn func()) {
	c.dead = true
	// Files are visited in name order, so a seed replays the same cut.
	names := make([]string, 0, len(c.names)+len(c.durable))
	for name := range c.names {
		names = append(names, name)
	}
	for name := range c.durable {
		if c.names[name] == nil {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	c.image = map[string]content{}
	for _, name := range names {
		ino := c.durable[name]
		if now := c.names[name]; now != ino && (c.mode == Scatter && c.rng.IntN(2) == 0) {
			ino = now // the unsynced creation or removal reached the disk
		}
		if ino == nil {
			continue
		}
		c.image[name] = c.land(ino)
	}
	if fn != nil {
		fn()
	}
}

// land returns the file's bytes on disk: the synced ones, and the
// sectors of unsynced writes the mode lets through.
func (c *FS) land(ino *inode) content {
	disk := ino.synced.clone()
	for _, w := range ino.pending {
		// Drop tears the last write issued, whichever file it went to.
		if c.mode == Drop && w.seq != c.seq {
			continue
		}
		if w.trunc {
			if c.rng.IntN(2) == 0 {
				disk.truncate(w.off)
			}
			continue
		}
		for _, s := range w.sectors {
			if c.rng.IntN(2) == 0 {
				disk.write(s.bytes(), s.off)
			}
		}
	}
	return disk
}

// OpenFile opens name. It honours O_CREATE, O_EXCL and O_TRUNC; with
// O_DSYNC writes are durable on return, and O_DIRECT (refused with
// EINVAL under NoDirect) requires sector-aligned writes.
func (c *FS) OpenFile(name string, flag int, _ os.FileMode) (wal.File, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	name = filepath.Clean(name)
	if err := c.op(nil, write{}); err != nil {
		return nil, err
	}
	direct := flag&oDirect != 0
	if direct && c.noDirect {
		return nil, &fs.PathError{Op: "open", Path: name, Err: syscall.EINVAL}
	}
	ino := c.names[name]
	switch {
	case ino == nil && flag&os.O_CREATE == 0:
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	case ino != nil && flag&os.O_CREATE != 0 && flag&os.O_EXCL != 0:
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrExist}
	case ino == nil:
		ino = &inode{}
		c.names[name] = ino
	}
	if flag&os.O_TRUNC != 0 && ino.data.size > 0 {
		ino.data.truncate(0)
		c.seq++
		ino.pending = append(ino.pending, write{trunc: true, off: 0, seq: c.seq})
	}
	return &file{fs: c, ino: ino, name: name, direct: direct, dsync: flag&oDSync != 0}, nil
}

// ReadFile returns what reads see of name.
func (c *FS) ReadFile(name string) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return nil, ErrPowerCut
	}
	ino := c.names[filepath.Clean(name)]
	if ino == nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	return ino.data.bytes(), nil
}

// Head returns the first n bytes of what reads see of name, and its size.
func (c *FS) Head(name string, n int) ([]byte, int64, error) {
	data, err := c.ReadFile(name)
	if err != nil {
		return nil, 0, err
	}
	return data[:min(n, len(data))], int64(len(data)), nil
}

// Remove removes name from what the process sees; the directory on disk
// keeps it until SyncDir.
func (c *FS) Remove(name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	name = filepath.Clean(name)
	if err := c.op(nil, write{}); err != nil {
		return err
	}
	if c.names[name] == nil {
		return &fs.PathError{Op: "remove", Path: name, Err: fs.ErrNotExist}
	}
	delete(c.names, name)
	return nil
}

// SyncDir makes the entries of name's directory durable as the process
// sees them.
func (c *FS) SyncDir(name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.op(nil, write{}); err != nil {
		return err
	}
	dir := filepath.Dir(filepath.Clean(name))
	for n := range c.durable {
		if filepath.Dir(n) == dir && c.names[n] == nil {
			delete(c.durable, n)
		}
	}
	for n, ino := range c.names {
		if filepath.Dir(n) == dir {
			c.durable[n] = ino
		}
	}
	return nil
}

type file struct {
	fs            *FS
	ino           *inode
	name          string
	direct, dsync bool
	closed        bool
}

func (f *file) WriteAt(p []byte, off int64) (int, error) {
	c := f.fs
	c.mu.Lock()
	defer c.mu.Unlock()
	if f.closed {
		return 0, os.ErrClosed
	}
	if f.direct && (off%Sector != 0 || len(p)%Sector != 0) {
		return 0, &fs.PathError{Op: "write", Path: f.name, Err: syscall.EINVAL}
	}
	c.seq++
	w := write{off: off, sectors: split(p, off), seq: c.seq}
	if err := c.op(f.ino, w); err != nil {
		return 0, err
	}
	f.ino.data.write(p, off)
	if f.dsync {
		f.ino.synced.write(p, off)
	} else {
		f.ino.pending = append(f.ino.pending, w)
	}
	return len(p), nil
}

func (f *file) Sync() error {
	c := f.fs
	c.mu.Lock()
	defer c.mu.Unlock()
	if f.closed {
		return os.ErrClosed
	}
	if err := c.op(nil, write{}); err != nil {
		return err
	}
	// The pending writes, in order, rather than a copy of the file: a
	// log is megabytes of which a sync covers a block.
	for _, w := range f.ino.pending {
		f.ino.synced.apply(w)
	}
	f.ino.pending = nil
	return nil
}

func (f *file) Close() error {
	c := f.fs
	c.mu.Lock()
	defer c.mu.Unlock()
	if f.closed {
		return os.ErrClosed
	}
	f.closed = true
	return nil
}
