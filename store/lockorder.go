package store

import "sync"

// The lock order of a DB. A goroutine takes its locks in increasing
// rank and never takes a lock of a rank it holds, or lower:
//
//	gate (shared: every call, in enter; exclusive: Reclaim)
//	  wmu   the commit leader's checks and log append; Prune
//	    ckMu  one checkpoint at a time; AckOutbox; Reclaim
//	      ovMu  the overlay, held briefly, never across a log append
//	mu    the commit queue and closed flag: a leaf, held briefly, after
//	      gate at most (enter, Reclaim, the commit queue)
//
// bbolt's own locks come after all of them: a bbolt transaction may be
// begun with any held (a checkpoint's under ckMu, Prune's under wmu, a
// batch's checks read under ovMu), and no store lock is taken inside
// one. Building with -tags lockorder checks the order at every Lock
// (lockorder_check.go): `make lockorder` runs the store's tests so.
type rank uint8

const (
	rankGate rank = iota + 1
	rankW
	rankCk
	rankOv
	rankMu
)

var rankNames = [...]string{rankGate: "gate", rankW: "wmu", rankCk: "ckMu", rankOv: "ovMu", rankMu: "mu"}

func (r rank) String() string {
	if int(r) < len(rankNames) && rankNames[r] != "" {
		return rankNames[r]
	}
	return "unranked"
}

// mutex is a sync.Mutex with its place in the lock order. Without the
// lockorder tag its checks are empty and inlined away.
type mutex struct {
	sync.Mutex
	rank rank
}

func (m *mutex) Lock()   { m.rank.acquire(); m.Mutex.Lock() }
func (m *mutex) Unlock() { m.rank.release(); m.Mutex.Unlock() }

// rwMutex is mutex for a sync.RWMutex; a shared hold counts as a hold.
type rwMutex struct {
	sync.RWMutex
	rank rank
}

func (m *rwMutex) Lock()    { m.rank.acquire(); m.RWMutex.Lock() }
func (m *rwMutex) Unlock()  { m.rank.release(); m.RWMutex.Unlock() }
func (m *rwMutex) RLock()   { m.rank.acquire(); m.RWMutex.RLock() }
func (m *rwMutex) RUnlock() { m.rank.release(); m.RWMutex.RUnlock() }
