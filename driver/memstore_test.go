package driver

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"testing"
)

// memStore is an in-memory Store for unit tests of the loop. It keeps
// JSON copies, as a real store does, so aliasing bugs show up. It also
// checks the invariants every store must see: versions grow by one and
// event sequences have no gaps.
type memStore struct {
	mu       sync.Mutex
	t        testing.TB
	missions map[string][]byte
	events   map[string][]Event
	keys     map[string]string
	state    map[string]*Mission // last saved, shallow: read only for Version and State
	saves    int
	failNext error
}

func newMemStore(t testing.TB) *memStore {
	return &memStore{t: t, missions: map[string][]byte{}, events: map[string][]Event{}, keys: map[string]string{}, state: map[string]*Mission{}}
}

func (s *memStore) enc(m *Mission) []byte {
	b, err := json.Marshal(m)
	if err != nil {
		s.t.Errorf("marshal mission: %v", err)
	}
	return b
}

func dec(b []byte) *Mission {
	var m Mission
	if err := json.Unmarshal(b, &m); err != nil {
		panic(err)
	}
	return &m
}

func (s *memStore) checkEvents(id string, events []Event) error {
	last := uint64(0)
	if evs := s.events[id]; len(evs) > 0 {
		last = evs[len(evs)-1].Seq
	}
	for _, ev := range events {
		if ev.Seq != last+1 {
			return fmt.Errorf("event seq %d after %d", ev.Seq, last)
		}
		last = ev.Seq
	}
	return nil
}

func (s *memStore) Create(_ context.Context, m *Mission, events []Event) (*Mission, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if k := m.Meta.RequestKey; k != "" {
		if id, ok := s.keys[k]; ok {
			return dec(s.missions[id]), false, nil
		}
		s.keys[k] = m.ID
	}
	if _, ok := s.missions[m.ID]; ok {
		return nil, false, fmt.Errorf("create %s: %w", m.ID, ErrConflict)
	}
	if err := s.checkEvents(m.ID, events); err != nil {
		s.t.Errorf("create %s: %v", m.ID, err)
	}
	s.missions[m.ID] = s.enc(m)
	s.state[m.ID] = &Mission{Version: m.Version, State: m.State}
	s.events[m.ID] = append(s.events[m.ID], events...)
	return nil, true, nil
}

func (s *memStore) Save(_ context.Context, m *Mission, events []Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.failNext; err != nil {
		s.failNext = nil
		return err
	}
	old, ok := s.missions[m.ID]
	if !ok {
		return ErrNotFound
	}
	_ = old
	if prev := s.state[m.ID]; prev.Version != m.Version-1 {
		return fmt.Errorf("save %s v%d over v%d: %w", m.ID, m.Version, prev.Version, ErrConflict)
	} else if retried := prev.State == StateFailed && m.State == StateRunning; prev.State.Terminal() && !retried && m.State != prev.State {
		s.t.Errorf("mission %s left terminal state %s for %s", m.ID, prev.State, m.State)
	}
	if err := s.checkEvents(m.ID, events); err != nil {
		s.t.Errorf("save %s: %v", m.ID, err)
	}
	if len(events) > 0 && events[len(events)-1].Seq != m.Seq {
		s.t.Errorf("save %s: mission seq %d, last event %d", m.ID, m.Seq, events[len(events)-1].Seq)
	}
	s.saves++
	s.missions[m.ID] = s.enc(m)
	s.state[m.ID] = &Mission{Version: m.Version, State: m.State}
	s.events[m.ID] = append(s.events[m.ID], events...)
	return nil
}

func (s *memStore) Get(_ context.Context, id string) (*Mission, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.missions[id]
	if !ok {
		return nil, ErrNotFound
	}
	return dec(b), nil
}

func (s *memStore) Active(context.Context) ([]*Mission, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*Mission
	for _, b := range s.missions {
		if m := dec(b); !m.State.Terminal() {
			out = append(out, m)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

func (s *memStore) List(_ context.Context, f Filter) ([]*Mission, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*Mission
	for _, b := range s.missions {
		if m := dec(b); f.Match(m) {
			out = append(out, m)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID > out[j].ID })
	return out, "", nil
}

func (s *memStore) Timeline(_ context.Context, id string) ([]Event, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.missions[id]; !ok {
		return nil, ErrNotFound
	}
	return append([]Event(nil), s.events[id]...), nil
}

func (s *memStore) Lookup(_ context.Context, key string) (*Mission, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, ok := s.keys[key]
	if !ok {
		return nil, ErrNotFound
	}
	return dec(s.missions[id]), nil
}
