package driver

import (
	"container/heap"
	"sync"
	"time"
)

// entry is the driver's in-memory view of one active mission.
type entry struct {
	// mu serialises the read-modify-commit cycles of the mission's worker
	// and of control operations; it is not held while a step executes.
	mu      sync.Mutex
	m       *Mission  // latest committed copy; replaced, never mutated, under Driver.mu
	wake    time.Time // when the mission next needs the loop (zero: now)
	running bool      // a worker owns the mission; never two
	ready   int       // index in the ready heap, -1 when absent
	timer   int       // index in the timer heap, -1 when absent
	// backoff delays the next look after a failed commit, so a broken
	// disk is not hammered.
	backoff time.Time
	// woken is set by Wake and consumed by the next advance.
	woken bool
	// ranSince is Driver.wakes when the mission's step began executing:
	// a Wake it passed by while running is one for which Driver.lastWake
	// is later.
	ranSince uint64
	// gen counts workers that lost the mission to an expired lease; a
	// worker compares it with the value at its dispatch.
	gen uint64
	// idle means the mission's current step was begun (committed
	// STEP_RUNNING under our lease) but no worker has executed it yet, so
	// a pause or cancel may still take it back.
	idle bool
	// park is the current step's attempt, parked: its handler returned
	// Pending, and no worker holds it until Wake(park.Key) or park.Until
	// makes it due again. Set and cleared under Driver.mu; lives in
	// memory only.
	park *parking
	// bparks are the parked attempts of the branches of the group the
	// mission is in, by step index, and bwoken the group's waiting
	// branches whose key Wake named. Under Driver.mu, in memory only.
	bparks map[int]*parking
	bwoken map[int]bool
	// keys are what the entry is filed under in Driver.byKey for Wake:
	// its park's key, or the key of a not-ready wait, or those of its
	// group's branches.
	keys []string
}

// parking is a parked attempt: what the handler gave, and what the
// driver needs to resume the same attempt.
type parking struct {
	p        Parked
	deadline time.Time // the attempt's, from its first call
	attempt  int       // which attempt (Progress.Attempt): another means a new one
	idx      int       // the step (or undone step) index
	comp     bool      // a compensation
	inFlight bool      // its effect is under way: Stop waits for it
}

// readyHeap orders due missions: priority first, then due time, then
// creation (IDs sort by creation time).
type readyHeap []*entry

func (h readyHeap) Len() int { return len(h) }
func (h readyHeap) Less(i, j int) bool {
	a, b := h[i], h[j]
	if a.m.Priority != b.m.Priority {
		return a.m.Priority > b.m.Priority
	}
	if !a.wake.Equal(b.wake) {
		return a.wake.Before(b.wake)
	}
	return a.m.ID < b.m.ID
}
func (h readyHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].ready, h[j].ready = i, j
}
func (h *readyHeap) Push(x any) {
	e := x.(*entry)
	e.ready = len(*h)
	*h = append(*h, e)
}
func (h *readyHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.ready = -1
	return e
}

// timerHeap orders missions that are not yet due by wake time.
type timerHeap []*entry

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].wake.Before(h[j].wake) }
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].timer, h[j].timer = i, j
}
func (h *timerHeap) Push(x any) {
	e := x.(*entry)
	e.timer = len(*h)
	*h = append(*h, e)
}
func (h *timerHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.timer = -1
	return e
}

// scheduler holds the two heaps. It is guarded by Driver.mu.
type scheduler struct {
	ready  readyHeap
	timers timerHeap
}

// remove takes e out of whichever heap holds it.
func (s *scheduler) remove(e *entry) {
	if e.ready >= 0 {
		heap.Remove(&s.ready, e.ready)
	}
	if e.timer >= 0 {
		heap.Remove(&s.timers, e.timer)
	}
}

// place puts e in the ready heap if its wake time has come, else in the
// timer heap. A zero wake time with wait=true means "only when woken".
func (s *scheduler) place(e *entry, now time.Time, sleeping bool) {
	s.remove(e)
	if sleeping {
		return
	}
	if !e.wake.After(now) {
		heap.Push(&s.ready, e)
		return
	}
	heap.Push(&s.timers, e)
}

// promote moves every timer that is due into the ready heap.
func (s *scheduler) promote(now time.Time) {
	for len(s.timers) > 0 && !s.timers[0].wake.After(now) {
		e := heap.Pop(&s.timers).(*entry)
		heap.Push(&s.ready, e)
	}
}

// next is the earliest timer, or zero.
func (s *scheduler) next() time.Time {
	if len(s.timers) == 0 {
		return time.Time{}
	}
	return s.timers[0].wake
}

// popReady takes the most urgent due mission.
func (s *scheduler) popReady() *entry {
	if len(s.ready) == 0 {
		return nil
	}
	return heap.Pop(&s.ready).(*entry)
}

// hasReady says whether a due mission is waiting for a worker.
func (s *scheduler) hasReady() bool { return len(s.ready) > 0 }
