package api

import "testing"

// The pool hands out buffers of the asked length, reuses a class's
// buffers, and drops buffers whose capacity is not a class.
func TestFramePool(t *testing.T) {
	p := newFramePool()
	for _, n := range []int{1, 255, 256, 257, 16 << 10, 16<<10 + 9, 4 << 20, 4<<20 + 1} {
		b := p.Get(n)
		if len(*b) != n {
			t.Fatalf("Get(%d): length %d", n, len(*b))
		}
		if n <= 4<<20 && cap(*b)&(cap(*b)-1) != 0 {
			t.Fatalf("Get(%d): capacity %d is not a power of two", n, cap(*b))
		}
		p.Put(b)
	}
	fp := p.(*framePool)
	b := p.Get(1000)
	(*b)[0] = 7
	p.Put(b)
	if got, ok := fp.classes[framePoolClass(1000)].Get().(*[]byte); ok && (cap(*got) != 1024 || len(*got) != 0) {
		t.Fatalf("pooled buffer of capacity %d length %d", cap(*got), len(*got))
	}
	odd := make([]byte, 1000)
	p.Put(&odd)
	if got, ok := fp.classes[framePoolClass(1000)].Get().(*[]byte); ok && cap(*got) == 1000 {
		t.Fatal("a buffer whose capacity is not a class was kept")
	}
}
