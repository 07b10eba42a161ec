//go:build lockorder

package store

import (
	"bytes"
	"fmt"
	"runtime"
	"strconv"
	"sync"
)

// held is every goroutine's locks, in the order taken.
var (
	heldMu sync.Mutex
	held   = map[uint64][]rank{}
)

// goid parses the running goroutine's ID from its stack header: slow,
// which is why only this build does it.
func goid() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	id, _ := strconv.ParseUint(string(b[:bytes.IndexByte(b, ' ')]), 10, 64)
	return id
}

// acquire panics if the goroutine holds a lock of r's rank or higher:
// taking r then could deadlock against a goroutine that keeps the order
// (or, for gate's shared hold taken twice, against a waiting Reclaim).
func (r rank) acquire() {
	if r == 0 {
		panic("store: lock without a rank")
	}
	g := goid()
	heldMu.Lock()
	defer heldMu.Unlock()
	hs := held[g]
	if n := len(hs); n > 0 && hs[n-1] >= r {
		panic(fmt.Sprintf("store: lock order: taking %s while holding %v", r, hs))
	}
	held[g] = append(hs, r)
}

// release forgets the goroutine's latest hold of r; a lock released by
// a goroutine that did not take it is a panic too, as the order could
// not be checked.
func (r rank) release() {
	g := goid()
	heldMu.Lock()
	defer heldMu.Unlock()
	hs := held[g]
	for i := len(hs) - 1; i >= 0; i-- {
		if hs[i] == r {
			hs = append(hs[:i], hs[i+1:]...)
			if len(hs) == 0 {
				delete(held, g)
			} else {
				held[g] = hs
			}
			return
		}
	}
	panic(fmt.Sprintf("store: lock order: releasing %s, which this goroutine does not hold (it holds %v)", r, hs))
}
