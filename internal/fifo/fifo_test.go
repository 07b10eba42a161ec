package fifo

import "testing"

func TestMapForgetsTheOldestKeyWhenFull(t *testing.T) {
	m := New[string, int](3)
	for i, k := range []string{"a", "b", "c"} {
		m.Put(k, i)
	}
	m.Put("b", 10) // an update keeps its place
	m.Put("d", 3)  // forgets a, the oldest
	if _, ok := m.Get("a"); ok {
		t.Error("a was kept past the size")
	}
	if v, ok := m.Get("b"); !ok || v != 10 {
		t.Errorf("b = %v, %v", v, ok)
	}
	if m.Len() != 3 {
		t.Errorf("len %d, want 3", m.Len())
	}
}

func TestMapDeleteThenPutAgainIsNotForgottenByItsOldSlot(t *testing.T) {
	m := New[string, bool](2)
	m.Put("a", true)
	m.Put("b", true)
	if !m.Delete("a") || m.Delete("a") {
		t.Fatal("Delete did not report a's presence")
	}
	m.Put("a", true) // slot 0 again, the oldest slot's key gone
	m.Put("c", true) // takes slot 1: forgets b
	if _, ok := m.Get("a"); !ok {
		t.Error("a, put again, was forgotten")
	}
	if _, ok := m.Get("b"); ok {
		t.Error("b outlived its slot")
	}
	m.Delete("c")
	m.Put("d", true) // slot 0 held a: forgotten, c's slot is stale
	m.Put("e", true) // slot 1 held c, deleted: nothing to forget but itself
	if m.Len() != 2 {
		t.Errorf("len %d, want 2 (d and e)", m.Len())
	}
}

func FuzzMapStaysBounded(f *testing.F) {
	f.Add([]byte{1, 2, 3, 1, 0x81, 4}, uint8(3))
	f.Fuzz(func(t *testing.T, ops []byte, size uint8) {
		m := New[byte, int](int(size%8) + 1)
		model := map[byte]bool{}
		for _, op := range ops {
			k := op & 0x0f
			if op&0x80 != 0 {
				if m.Delete(k) != model[k] {
					t.Fatalf("Delete(%d) disagrees with the model", k)
				}
				delete(model, k)
				continue
			}
			m.Put(k, int(op))
			model[k] = true
			if m.Len() > int(size%8)+1 {
				t.Fatalf("len %d above the size %d", m.Len(), size%8+1)
			}
			for mk := range model {
				if _, ok := m.Get(mk); !ok {
					delete(model, mk) // forgotten: must have been the oldest
				}
			}
			if _, ok := m.Get(k); !ok {
				t.Fatalf("%d just put is missing", k)
			}
		}
	})
}
