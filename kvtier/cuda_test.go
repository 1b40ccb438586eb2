//go:build cuda

package kvtier

import (
	"bytes"
	"math/rand/v2"
	"strconv"
	"testing"
)

// openCUDATest opens a CUDA slab of capacity bytes with small staging
// buffers, so that even the tier tests' small entries cross several of
// them, and closes it at the end of the test.
func openCUDATest(t testing.TB, capacity int64) *SlabDevice {
	t.Helper()
	d, err := OpenCUDA(CUDAConfig{Bytes: capacity, StagingBytes: 1000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Error(err)
		}
	})
	return d
}

// extraDeviceMakers adds the real device to the tier tests.
func extraDeviceMakers() []deviceMaker {
	return []deviceMaker{{"cuda", func(t testing.TB, capacity int64) testDevice { return openCUDATest(t, capacity) }}}
}

// TestCUDACopies moves random bytes through the device at unaligned
// offsets and lengths, across many staging chunks, and back.
func TestCUDACopies(t *testing.T) {
	d := openCUDATest(t, 64<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 999, 1000, 1001, 2000, 2001, 1 << 20, 3<<20 + 7} {
		p, err := d.Alloc(int64(n) + 64)
		if err != nil {
			t.Fatal(err)
		}
		src := make([]byte, n)
		for i := range src {
			src[i] = byte(rng.Uint32())
		}
		off := int64(rng.IntN(64))
		if err := d.Write(p, off, src); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, n)
		if err := d.Read(p, off, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, src) {
			t.Fatalf("%d bytes at offset %d came back changed", n, off)
		}
		if err := d.Free(p); err != nil {
			t.Fatal(err)
		}
	}
	if d.Used() != 0 {
		t.Fatalf("%d bytes still allocated", d.Used())
	}
}

// BenchmarkCUDACopy measures host-to-device and device-to-host bandwidth
// through the default staging buffers.
func BenchmarkCUDACopy(b *testing.B) {
	d, err := OpenCUDA(CUDAConfig{Bytes: 256 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	for _, size := range []int{256 << 10, 4 << 20, 32 << 20} {
		p, err := d.Alloc(int64(size))
		if err != nil {
			b.Fatal(err)
		}
		buf := make([]byte, size)
		b.Run(sizeName(size)+"/write", func(b *testing.B) {
			b.SetBytes(int64(size))
			for i := 0; i < b.N; i++ {
				if err := d.Write(p, 0, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(sizeName(size)+"/read", func(b *testing.B) {
			b.SetBytes(int64(size))
			for i := 0; i < b.N; i++ {
				if err := d.Read(p, 0, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
		if err := d.Free(p); err != nil {
			b.Fatal(err)
		}
	}
}

func sizeName(n int) string {
	if n >= 1<<20 {
		return strconv.Itoa(n>>20) + "MiB"
	}
	return strconv.Itoa(n>>10) + "KiB"
}
