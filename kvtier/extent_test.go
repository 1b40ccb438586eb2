package kvtier

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

// refAllocator is the extent allocator's reference: a bitmap of units and
// a linear scan for the smallest maximal free run that fits, lowest offset
// first.
type refAllocator struct {
	align int64
	inUse []bool
	sizes map[int64]int64
}

func (r *refAllocator) alloc(n int64) (int64, bool) {
	units := int((n + r.align - 1) / r.align)
	best, bestLen := -1, 0
	for i := 0; i < len(r.inUse); {
		if r.inUse[i] {
			i++
			continue
		}
		j := i
		for j < len(r.inUse) && !r.inUse[j] {
			j++
		}
		if l := j - i; l >= units && (best < 0 || l < bestLen) {
			best, bestLen = i, l
		}
		i = j
	}
	if best < 0 || n <= 0 {
		return 0, false
	}
	for u := best; u < best+units; u++ {
		r.inUse[u] = true
	}
	off := int64(best) * r.align
	r.sizes[off] = int64(units) * r.align
	return off, true
}

func (r *refAllocator) free(off int64) (int64, bool) {
	n, ok := r.sizes[off]
	if !ok {
		return 0, false
	}
	delete(r.sizes, off)
	for u := off / r.align; u < (off+n)/r.align; u++ {
		r.inUse[u] = false
	}
	return n, true
}

func (r *refAllocator) largestFree() int64 {
	best, run := 0, 0
	for _, used := range r.inUse {
		if used {
			run = 0
			continue
		}
		run++
		best = max(best, run)
	}
	return int64(best) * r.align
}

// TestExtentAllocatorModel drives the best-fit allocator and the bitmap
// reference with the same random allocs and frees: every offset, size,
// failure and largest free extent must agree, which holds only if free
// extents are always coalesced to maximal runs.
func TestExtentAllocatorModel(t *testing.T) {
	ops := 4000
	if testing.Short() || raceEnabled {
		ops = 1000
	}
	for seed := uint64(1); seed <= 20; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			align := int64(1) << rng.IntN(10) // 1 B .. 512 B
			units := 1 + rng.IntN(600)
			capacity := int64(units)*align + rng.Int64N(align) // a ragged tail is dropped
			a, err := newExtentAllocator(capacity, align)
			if err != nil {
				t.Fatal(err)
			}
			ref := &refAllocator{align: align, inUse: make([]bool, units), sizes: make(map[int64]int64)}
			var live []int64
			for i := 0; i < ops; i++ {
				if len(live) > 0 && rng.IntN(100) < 45 {
					k := rng.IntN(len(live))
					off := live[k]
					live[k] = live[len(live)-1]
					live = live[:len(live)-1]
					got, err := a.free(off)
					want, _ := ref.free(off)
					if err != nil || got != want {
						t.Fatalf("op %d: free(%d) = %d, %v; want %d", i, off, got, err, want)
					}
				} else {
					// Mostly small requests, sometimes huge ones that must fail.
					n := 1 + rng.Int64N(int64(units)*align/8+1)
					if rng.IntN(20) == 0 {
						n = rng.Int64N(capacity + 2*align)
					}
					got, gok := a.alloc(n)
					want, wok := ref.alloc(n)
					if got != want || gok != wok {
						t.Fatalf("op %d: alloc(%d) = %d, %v; reference %d, %v", i, n, got, gok, want, wok)
					}
					if gok {
						if got%align != 0 {
							t.Fatalf("op %d: unaligned offset %d", i, got)
						}
						live = append(live, got)
					}
				}
				if g, w := a.largestFree(), ref.largestFree(); g != w {
					t.Fatalf("op %d: largest free %d, reference %d", i, g, w)
				}
				var sum int64
				for _, n := range ref.sizes {
					sum += n
				}
				if a.usedSize != sum || len(a.used) != len(ref.sizes) {
					t.Fatalf("op %d: %d bytes in %d allocations, reference %d in %d", i, a.usedSize, len(a.used), sum, len(ref.sizes))
				}
			}
			// Freeing everything leaves one extent: the whole slab.
			for _, off := range live {
				if _, err := a.free(off); err != nil {
					t.Fatal(err)
				}
			}
			if a.bySize.Len() != 1 || a.largestFree() != a.capacity || a.usedSize != 0 {
				t.Fatalf("after freeing all: %d extents, largest %d of %d", a.bySize.Len(), a.largestFree(), a.capacity)
			}
		})
	}
}

func TestExtentAllocatorErrors(t *testing.T) {
	for _, tc := range []struct {
		name            string
		capacity, align int64
	}{
		{"align not a power of two", 4096, 3},
		{"zero align", 4096, 0},
		{"capacity under one unit", 255, 256},
		{"negative capacity", -1, 1},
	} {
		if _, err := newExtentAllocator(tc.capacity, tc.align); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
	a, err := newExtentAllocator(1024, 256)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int64{0, -5, 1025, 1 << 62} {
		if _, ok := a.alloc(n); ok {
			t.Errorf("alloc(%d) succeeded", n)
		}
	}
	off, ok := a.alloc(100)
	if !ok {
		t.Fatal("alloc(100) failed")
	}
	for _, bad := range []int64{off + 256, off + 1, -256} {
		if _, err := a.free(bad); !errors.Is(err, errBadFree) {
			t.Errorf("free(%d): %v", bad, err)
		}
	}
	if _, err := a.free(off); err != nil {
		t.Fatal(err)
	}
	if _, err := a.free(off); !errors.Is(err, errBadFree) {
		t.Errorf("double free: %v", err)
	}
}

// TestSlabDevice checks the DeviceMemory contract of a SlabDevice over
// host memory: aligned real addresses, bounds on every access, copies in
// and out at offsets, Full when no extent fits, and Close.
func TestSlabDevice(t *testing.T) {
	mem := NewHostSlab(10_000)
	base := mem.Base()
	d, err := NewSlabDevice(mem, SlabConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if d.Capacity() != 9984 { // 39 units of 256
		t.Fatalf("capacity %d", d.Capacity())
	}
	p, err := d.Alloc(1000)
	if err != nil {
		t.Fatal(err)
	}
	if p != base || d.Used() != 1024 {
		t.Fatalf("first allocation at %#x, %d used", uint64(p), d.Used())
	}
	q, err := d.Alloc(3000)
	if err != nil {
		t.Fatal(err)
	}
	if q != base+1024 {
		t.Fatalf("second allocation at %#x", uint64(q))
	}
	msg := []byte("pre-RoPE keys")
	if err := d.Write(q, 2900, msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if err := d.Read(q, 2900, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("read back %q, %v", got, err)
	}
	for _, tc := range []struct {
		name string
		p    DevicePtr
		off  int64
		n    int
	}{
		{"past the rounded end", q, 3072 - 4, 8},
		{"negative offset", q, -1, 1},
		{"inside, not a start", q + 256, 0, 1},
		{"below the slab", base - 256, 0, 1},
		{"above the slab", base + 1<<30, 0, 1},
		{"huge length", q, 8, 1 << 20},
	} {
		if err := d.Write(tc.p, tc.off, make([]byte, tc.n)); err == nil {
			t.Errorf("write %s: no error", tc.name)
		}
		if err := d.Read(tc.p, tc.off, make([]byte, tc.n)); err == nil {
			t.Errorf("read %s: no error", tc.name)
		}
	}
	// 5888 bytes free in one extent: 6000 does not fit.
	if _, err := d.Alloc(6000); !errors.Is(err, ErrDeviceFull) {
		t.Fatalf("oversized alloc: %v", err)
	}
	if err := d.Free(p); err != nil {
		t.Fatal(err)
	}
	if err := d.Free(p); err == nil {
		t.Fatal("double free succeeded")
	}
	if err := d.Free(base - 1); err == nil {
		t.Fatal("free outside the slab succeeded")
	}
	if d.LargestFree() != 9984-3072-1024 {
		t.Fatalf("largest free %d", d.LargestFree())
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Alloc(1); !errors.Is(err, ErrDeviceClosed) {
		t.Fatalf("alloc after close: %v", err)
	}
	if err := d.Read(q, 0, got); !errors.Is(err, ErrDeviceClosed) {
		t.Fatalf("read after close: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

// FuzzExtentAllocator drives the allocator with an op sequence decoded
// from the input (two bytes an op: a free of the k-th live allocation, or
// an alloc of up to 32 units plus a ragged tail) and checks every answer
// against the bitmap reference.
func FuzzExtentAllocator(f *testing.F) {
	f.Add([]byte{0x05, 0x00, 0x83, 0x10, 0x01, 0x00})
	f.Add([]byte{0x7f, 0xff, 0x7f, 0xff, 0x80, 0x00, 0x80, 0x01, 0x10, 0x02})
	f.Add(bytes.Repeat([]byte{0x03, 0x41}, 40))
	f.Fuzz(func(t *testing.T, ops []byte) {
		const align, units = 64, 128
		a, err := newExtentAllocator(units*align, align)
		if err != nil {
			t.Fatal(err)
		}
		ref := &refAllocator{align: align, inUse: make([]bool, units), sizes: make(map[int64]int64)}
		var live []int64
		for i := 0; i+1 < len(ops); i += 2 {
			op, arg := ops[i], ops[i+1]
			if op&0x80 != 0 && len(live) > 0 {
				k := int(arg) % len(live)
				off := live[k]
				live = append(live[:k], live[k+1:]...)
				got, err := a.free(off)
				want, _ := ref.free(off)
				if err != nil || got != want {
					t.Fatalf("free(%d) = %d, %v; want %d", off, got, err, want)
				}
				continue
			}
			n := int64(op&0x1f)*align + int64(arg)%align
			got, gok := a.alloc(n)
			want, wok := ref.alloc(n)
			if got != want || gok != wok {
				t.Fatalf("alloc(%d) = %d, %v; reference %d, %v", n, got, gok, want, wok)
			}
			if gok {
				live = append(live, got)
			}
			if a.largestFree() != ref.largestFree() {
				t.Fatalf("largest free %d, reference %d", a.largestFree(), ref.largestFree())
			}
		}
	})
}
