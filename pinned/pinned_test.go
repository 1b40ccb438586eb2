package pinned

import "testing"

type counter struct{ n int }

func (c *counter) Release() { c.n++ }

// Release frees the pin once and clears the Bytes; a second Release of the
// same variable does nothing.
func TestReleaseOnce(t *testing.T) {
	var c counter
	p := New([]byte("abc"), &c)
	if !p.Held() || string(p.Bytes()) != "abc" || p.Len() != 3 {
		t.Fatalf("lent %q held=%v", p.Bytes(), p.Held())
	}
	p.Release()
	p.Release()
	if c.n != 1 {
		t.Fatalf("released %d times, want 1", c.n)
	}
	if p.Bytes() != nil || p.Held() {
		t.Fatalf("after Release: %q held=%v", p.Bytes(), p.Held())
	}
}

// Owned, nil releasers and the zero Bytes release nothing and do not panic.
func TestNothingHeld(t *testing.T) {
	for name, p := range map[string]Bytes{
		"owned":       Owned([]byte("x")),
		"nil func":    NewFunc([]byte("x"), nil),
		"nil release": New([]byte("x"), nil),
		"zero":        {},
	} {
		if p.Held() {
			t.Errorf("%s: held", name)
		}
		p.Release()
		p.Release()
	}
}

// Then runs the added release after the lender's own, each once.
func TestThen(t *testing.T) {
	var order []string
	first := ReleaseFunc(func() { order = append(order, "pin") })
	then := ReleaseFunc(func() { order = append(order, "gate") })
	p := New([]byte("abc"), first).Then(then)
	p.Release()
	p.Release()
	if len(order) != 2 || order[0] != "pin" || order[1] != "gate" {
		t.Fatalf("release order %v, want [pin gate]", order)
	}

	order = nil
	q := Owned([]byte("abc")).Then(then)
	if !q.Held() {
		t.Fatal("an Owned Bytes with an added release is not held")
	}
	q.Release()
	if len(order) != 1 || order[0] != "gate" {
		t.Fatalf("release order %v, want [gate]", order)
	}
	if r := New(nil, first).Then(nil); r.r == nil {
		t.Fatal("Then(nil) dropped the lender's release")
	}
}
