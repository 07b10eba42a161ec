package pagecheck

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
)

// Check reads the page structure of the bbolt file r, size bytes long.
// Every error it returns describes damage, in a message that names the
// page; the caller adds its own sentinel and the file's name.
func Check(r io.ReaderAt, size int64) error {
	c := pageChecker{r: r, size: uint64(size)}
	m, err := c.meta()
	if err != nil {
		return err
	}
	c.hwm = m.hwm
	c.seen = make([]bool, c.hwm)
	c.seen[0], c.seen[1] = true, true // the two meta pages
	if err := c.freelist(m.freelist); err != nil {
		return err
	}
	return c.tree(m.root, 0)
}

const (
	pageHeaderLen = 16
	elemLen       = 16 // branch and leaf elements alike
	bucketHdrLen  = 16 // a bucket's root page ID and sequence
	metaLen       = 64
	boltMagic     = 0xED0CDAED
	boltVersion   = 2
	branchPage    = 0x01
	leafPage      = 0x02
	freelistPage  = 0x10
	bucketLeaf    = 0x01
	noFreelist    = ^uint64(0)
	// maxTreeDepth bounds a descent: a real tree of this height would
	// hold more keys than any file.
	maxTreeDepth = 64
)

type pageChecker struct {
	r        io.ReaderAt
	size     uint64
	pageSize uint64
	hwm      uint64 // pages in use: ids below it are valid
	seen     []bool
}

type boltMeta struct {
	root, freelist, hwm, txid uint64
}

var le = binary.LittleEndian

// meta returns the meta page bbolt uses, found as bbolt finds it: the
// page size from meta page 0 if that page is valid, else from the first
// valid meta page at a power-of-two offset from 1 KiB to 16 MiB; then, of
// the two meta pages at that size that are valid (magic, version,
// checksum), the one with the higher transaction ID.
func (c *pageChecker) meta() (boltMeta, error) {
	var p [pageHeaderLen + metaLen]byte
	read := func(off uint64) (boltMeta, uint64, bool) {
		if _, err := c.r.ReadAt(p[:], int64(off)); err != nil {
			return boltMeta{}, 0, false
		}
		m := p[pageHeaderLen:]
		h := fnv.New64a()
		h.Write(m[:56])
		if le.Uint32(m) != boltMagic || le.Uint32(m[4:]) != boltVersion || le.Uint64(m[56:]) != h.Sum64() {
			return boltMeta{}, 0, false
		}
		bm := boltMeta{root: le.Uint64(m[16:]), freelist: le.Uint64(m[32:]), hwm: le.Uint64(m[40:]), txid: le.Uint64(m[48:])}
		return bm, uint64(le.Uint32(m[8:])), true
	}
	_, size, ok := read(0)
	for i := 0; !ok && i <= 14 && 1024<<i < c.size-1024; i++ {
		_, size, ok = read(1024 << i)
	}
	if !ok {
		return boltMeta{}, errors.New("no valid meta page")
	}
	if size < pageHeaderLen+metaLen || size > 1<<24 {
		return boltMeta{}, fmt.Errorf("page size %d", size)
	}
	c.pageSize = size
	var best boltMeta
	found := false
	for id := uint64(0); id < 2; id++ {
		if m, _, ok := read(id * c.pageSize); ok && (!found || m.txid > best.txid) {
			best, found = m, true
		}
	}
	switch {
	case !found:
		return boltMeta{}, fmt.Errorf("no valid meta page for page size %d", c.pageSize)
	case best.hwm < 2 || best.hwm > c.size/c.pageSize:
		return boltMeta{}, fmt.Errorf("the meta page counts %d pages in a file of %d bytes", best.hwm, c.size)
	case best.freelist == noFreelist:
		// Not a file this agent writes (it syncs its freelist), and one
		// bbolt's checker rebuilds the freelist for from a goroutine that
		// outlives the check if the tree is out of order.
		return boltMeta{}, errors.New("written without a freelist, not by this agent")
	}
	return best, nil
}

// page returns page id's bytes, with its overflow pages, once: the page
// must be in use, say it is page id, and fit in the file.
func (c *pageChecker) page(id uint64, flags uint16) ([]byte, error) {
	if id < 2 || id >= c.hwm {
		return nil, fmt.Errorf("page %d is outside the %d in use", id, c.hwm)
	}
	var hdr [pageHeaderLen]byte
	if _, err := c.r.ReadAt(hdr[:], int64(id*c.pageSize)); err != nil {
		return nil, fmt.Errorf("page %d: %w", id, err)
	}
	overflow := uint64(le.Uint32(hdr[12:]))
	switch {
	case le.Uint64(hdr[:]) != id:
		return nil, fmt.Errorf("page %d says it is page %d", id, le.Uint64(hdr[:]))
	case le.Uint16(hdr[8:])&flags == 0:
		return nil, fmt.Errorf("page %d has flags %#x where %#x were due", id, le.Uint16(hdr[8:]), flags)
	case id+overflow >= c.hwm:
		return nil, fmt.Errorf("page %d overflows %d pages past the %d in use", id, overflow, c.hwm)
	}
	for i := id; i <= id+overflow; i++ {
		if c.seen[i] {
			return nil, fmt.Errorf("page %d is reached twice", i)
		}
		c.seen[i] = true
	}
	p := make([]byte, (overflow+1)*c.pageSize)
	if _, err := c.r.ReadAt(p, int64(id*c.pageSize)); err != nil {
		return nil, fmt.Errorf("page %d: %w", id, err)
	}
	return p, nil
}

func (c *pageChecker) freelist(id uint64) error {
	p, err := c.page(id, freelistPage)
	if err != nil {
		return err
	}
	n, first := uint64(le.Uint16(p[10:])), uint64(pageHeaderLen)
	if n == 0xFFFF { // the real count is the first element
		if len(p) < pageHeaderLen+8 {
			return fmt.Errorf("freelist page %d too short", id)
		}
		n, first = le.Uint64(p[pageHeaderLen:]), pageHeaderLen+8
	}
	if n > (uint64(len(p))-first)/8 {
		return fmt.Errorf("freelist page %d lists %d pages it cannot hold", id, n)
	}
	for i := range n {
		if free := le.Uint64(p[first+8*i:]); free < 2 || free >= c.hwm {
			return fmt.Errorf("freelist page %d lists page %d, outside the %d in use", id, free, c.hwm)
		}
	}
	return nil
}

// tree checks the bucket tree whose root is page id.
func (c *pageChecker) tree(id uint64, depth int) error {
	if depth > maxTreeDepth {
		return fmt.Errorf("a tree deeper than %d", maxTreeDepth)
	}
	p, err := c.page(id, branchPage|leafPage)
	if err != nil {
		return err
	}
	return c.nodes(p, id, depth)
}

// nodes checks the elements of page p (a page of the file, or a bucket's
// inline page) and what they lead to.
func (c *pageChecker) nodes(p []byte, id uint64, depth int) error {
	if len(p) < pageHeaderLen {
		return fmt.Errorf("page %d shorter than its header", id)
	}
	flags, n := le.Uint16(p[8:]), int(le.Uint16(p[10:]))
	if flags != branchPage && flags != leafPage {
		return fmt.Errorf("page %d in a bucket's tree has flags %#x", id, flags)
	}
	if n > (len(p)-pageHeaderLen)/elemLen {
		return fmt.Errorf("page %d holds %d elements it has no room for", id, n)
	}
	for i := range n {
		e := pageHeaderLen + i*elemLen
		el := p[e : e+elemLen]
		if flags == branchPage {
			pos, ksize := uint64(le.Uint32(el)), uint64(le.Uint32(el[4:]))
			if uint64(e)+pos+ksize > uint64(len(p)) {
				return fmt.Errorf("page %d element %d lies outside it", id, i)
			}
			if err := c.tree(le.Uint64(el[8:]), depth+1); err != nil {
				return err
			}
			continue
		}
		eflags, pos, ksize, vsize := le.Uint32(el), uint64(le.Uint32(el[4:])), uint64(le.Uint32(el[8:])), uint64(le.Uint32(el[12:]))
		end := uint64(e) + pos + ksize + vsize
		if end > uint64(len(p)) {
			return fmt.Errorf("page %d element %d lies outside it", id, i)
		}
		if eflags&bucketLeaf == 0 {
			continue
		}
		v := p[end-vsize : end]
		if len(v) < bucketHdrLen {
			return fmt.Errorf("page %d element %d is a bucket too short for its header", id, i)
		}
		if root := le.Uint64(v); root != 0 {
			if err := c.tree(root, depth+1); err != nil {
				return err
			}
		} else if err := c.nodes(v[bucketHdrLen:], id, depth+1); err != nil { // an inline bucket
			return err
		}
	}
	return nil
}
