package cudakern

import (
	"errors"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
)

func TestRopeTablesShareAndGrow(t *testing.T) {
	var c RopeTables
	spec := testSpec(chunk.RopeNeoX, 64, 0, chunk.RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 64})
	a, err := c.Get(spec, 100)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Get(spec, 50)
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Fatal("a smaller request did not share the table")
	}
	g, err := c.Get(spec, 101)
	if err != nil {
		t.Fatal(err)
	}
	if g == a || g.MaxPositions() != 200 {
		t.Fatalf("grown table has %d positions, want 200 (doubled)", g.MaxPositions())
	}
	// The grown table agrees with the old one where both exist.
	for p := 0; p < 100; p++ {
		c1, s1 := a.Row(p)
		c2, s2 := g.Row(p)
		for i := range c1 {
			if c1[i] != c2[i] || s1[i] != s2[i] {
				t.Fatalf("row %d differs after growth", p)
			}
		}
	}
	other := spec
	other.Salt = "tenant"
	o, err := c.Get(other, 10)
	if err != nil {
		t.Fatal(err)
	}
	if o == g {
		t.Fatal("different specs share a table")
	}
	if _, err := c.Get(spec, 0); !errors.Is(err, ErrInvalidSpec) {
		t.Fatalf("0 positions: err = %v", err)
	}
}

func TestRopeTablesDynamic(t *testing.T) {
	var c RopeTables
	spec := testSpec(chunk.RopeNeoX, 64, 0, chunk.RopeScaling{Type: "dynamic", Factor: 2, MaxPositions: 128})
	a, err := c.Get(spec, 100)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Get(spec, 101)
	if err != nil {
		t.Fatal(err)
	}
	if b.MaxPositions() != 128 {
		t.Fatalf("growth past max positions: %d", b.MaxPositions())
	}
	if a.InvFreq()[5] != b.InvFreq()[5] {
		t.Fatal("tables within max positions should have equal frequencies")
	}
	long, err := c.Get(spec, 300)
	if err != nil {
		t.Fatal(err)
	}
	if long.MaxPositions() != 300 || long.InvFreq()[5] >= b.InvFreq()[5] {
		t.Fatal("a longer sequence must lower the frequencies (larger base)")
	}
}

func TestRopeTablesConcurrent(t *testing.T) {
	var c RopeTables
	spec := testSpec(chunk.RopeGPTJ, 32, 0, chunk.RopeScaling{})
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 1; n < 400; n += 37 {
				tab, err := c.Get(spec, n+i)
				if err != nil || tab.MaxPositions() < n+i {
					t.Errorf("Get(%d): %v", n+i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
}
