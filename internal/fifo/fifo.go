// Package fifo is a map bounded to a fixed number of keys that forgets
// the oldest key put when it is full: the memory of recent things (acks
// already seen, commands given up on) that a gateway keeps for a while
// and must never let grow.
//
// The driver keeps its own small ring of woken keys: it imports nothing
// of ours (docs/ARCHITECTURE.md).
package fifo

import "iter"

// Map is a map of at most Size keys; putting a new key into a full Map
// forgets the key put longest ago. It is not safe for concurrent use.
type Map[K comparable, V any] struct {
	entries map[K]entry[V]
	ring    []K
	used    []bool // whether ring[i] holds a key put there
	next    int
}

type entry[V any] struct {
	v    V
	slot int // where the key is in ring
}

// New makes a Map of at most size keys (at least 1).
func New[K comparable, V any](size int) *Map[K, V] {
	size = max(size, 1)
	return &Map[K, V]{entries: make(map[K]entry[V], size), ring: make([]K, size), used: make([]bool, size)}
}

// Put sets k's value. A key not in the Map takes the next slot,
// forgetting the key that held it, if it is still there.
func (m *Map[K, V]) Put(k K, v V) {
	if e, ok := m.entries[k]; ok {
		e.v = v
		m.entries[k] = e
		return
	}
	if m.used[m.next] {
		// The slot's key may have been deleted since, and even put again
		// in another slot: forget it only if it still lives here.
		old := m.ring[m.next]
		if e, ok := m.entries[old]; ok && e.slot == m.next {
			delete(m.entries, old)
		}
	}
	m.ring[m.next], m.used[m.next] = k, true
	m.entries[k] = entry[V]{v: v, slot: m.next}
	m.next = (m.next + 1) % len(m.ring)
}

// Get returns k's value and whether k is in the Map.
func (m *Map[K, V]) Get(k K) (V, bool) {
	e, ok := m.entries[k]
	return e.v, ok
}

// Delete forgets k and reports whether it was there.
func (m *Map[K, V]) Delete(k K) bool {
	if _, ok := m.entries[k]; !ok {
		return false
	}
	delete(m.entries, k)
	return true
}

// All yields the keys and values, oldest put first.
func (m *Map[K, V]) All() iter.Seq2[K, V] {
	return func(yield func(K, V) bool) {
		for i := range len(m.ring) {
			slot := (m.next + i) % len(m.ring)
			if !m.used[slot] {
				continue
			}
			k := m.ring[slot]
			if e, ok := m.entries[k]; ok && e.slot == slot && !yield(k, e.v) {
				return
			}
		}
	}
}

// Len is the number of keys in the Map.
func (m *Map[K, V]) Len() int { return len(m.entries) }
