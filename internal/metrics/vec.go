package metrics

import (
	"encoding/binary"
	"sync"
	"unicode/utf8"
)

// filler is a series of a vector: it writes its current value into a
// sample.
type filler interface{ fill(*sample) }

// vec holds a family's series, one per distinct label values, made at
// the first With and kept for good.
type vec[M filler] struct {
	desc *Desc
	make func() M

	mu   sync.RWMutex
	kids map[string]*child[M] // by lookup key (see with)
}

// child is one series: its metric and its labels, rendered once.
type child[M filler] struct {
	key    []string // label values in the order of the label names
	labels string   // name="value",... as written
	m      M
}

func newVec[M filler](d *Desc, make func() M) vec[M] {
	return vec[M]{desc: d, make: make, kids: map[string]*child[M]{}}
}

// with returns the series for the label values, given in declared order.
// Steady state, it allocates nothing: the lookup key is the value itself
// for one label, the values each prefixed by its length for more (so
// that no two lists of values share a key), built on the stack.
func (v *vec[M]) with(values []string) M {
	v.desc.check(values)
	if len(values) == 1 {
		v.mu.RLock()
		c := v.kids[values[0]]
		v.mu.RUnlock()
		if c != nil {
			return c.m
		}
		return v.add(values[0], values)
	}
	var buf [128]byte
	k := buf[:0]
	for _, s := range values {
		k = binary.AppendUvarint(k, uint64(len(s)))
		k = append(k, s...)
	}
	v.mu.RLock()
	c := v.kids[string(k)] // no allocation: the conversion is only for the lookup
	v.mu.RUnlock()
	if c != nil {
		return c.m
	}
	return v.add(string(k), values)
}

// add makes the series for a key With did not find. Label values that
// are not UTF-8 are written with U+FFFD instead of their bad bytes, so
// two such lists of values may name one series: they share its metric.
func (v *vec[M]) add(k string, values []string) M {
	key, text := v.desc.series(values)
	valid := true
	for _, s := range values {
		valid = valid && utf8.ValidString(s)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if c := v.kids[k]; c != nil { // made meanwhile
		return c.m
	}
	if !valid {
		for _, c := range v.kids {
			if c.labels == text {
				v.kids[k] = c
				return c.m
			}
		}
	}
	c := &child[M]{key: key, labels: text, m: v.make()}
	v.kids[k] = c
	return c.m
}

// collect emits every series. A series shared by several keys is
// emitted once per key; the Registry writes it once.
func (v *vec[M]) collect(s *Scrape) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	for _, c := range v.kids {
		smp := sample{key: c.key, labels: c.labels}
		c.m.fill(&smp)
		s.add(v.desc, smp)
	}
}
