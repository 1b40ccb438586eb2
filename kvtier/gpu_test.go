package kvtier

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
)

// slowDevice is a host device whose copies take a while, as a real
// device's do, so that the tests' goroutines meet the Store while it has
// released its lock around them.
type slowDevice struct{ *HostDevice }

func (d slowDevice) Write(p DevicePtr, off int64, src []byte) error {
	time.Sleep(200 * time.Microsecond)
	return d.HostDevice.Write(p, off, src)
}

func (d slowDevice) Read(p DevicePtr, off int64, dst []byte) error {
	time.Sleep(200 * time.Microsecond)
	return d.HostDevice.Read(p, off, dst)
}

// testDevice is a DeviceMemory the tests can ask how much it holds.
type testDevice interface {
	DeviceMemory
	Used() int64
}

type deviceMaker struct {
	name string
	open func(t testing.TB, capacity int64) testDevice
}

// deviceMakers are the devices the GPU tier tests run against: the host
// stand-in, the slab allocator over host memory, and with the cuda build
// tag the real device.
func deviceMakers() []deviceMaker {
	return append([]deviceMaker{
		{"host", func(_ testing.TB, capacity int64) testDevice { return NewHostDevice(capacity) }},
		{"slow", func(_ testing.TB, capacity int64) testDevice { return slowDevice{NewHostDevice(capacity)} }},
		{"slab", func(t testing.TB, capacity int64) testDevice {
			d, err := NewSlabDevice(NewHostSlab(capacity), SlabConfig{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = d.Close() })
			return d
		}},
	}, extraDeviceMakers()...)
}

func TestGPUTier(t *testing.T) {
	for _, m := range deviceMakers() {
		t.Run(m.name, func(t *testing.T) { testGPUTier(t, m.open(t, 10000)) })
	}
}

func testGPUTier(t *testing.T, dev testDevice) {
	ctx := t.Context()
	s := openTest(t, Config{DRAMBytes: 8 * 4096, DiskDir: t.TempDir(), DiskBytes: 1 << 20, GPU: dev})
	bs := blobs(t, 12, 12) // 3264 bytes each (3328 rounded up to 256): three fit on the device
	for _, b := range bs {
		if _, err := s.Put(ctx, b, PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	read := func(h *DeviceHandle) []byte {
		b := make([]byte, h.Size)
		if err := dev.Read(h.Ptr, 0, b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	// Promote everything through the device, one at a time: the device
	// never holds more than its capacity, victims go back to DRAM.
	for i, b := range bs {
		h, err := s.GetDevice(ctx, keyOf(t, b))
		if err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
		if !bytes.Equal(read(h), b) {
			t.Fatalf("entry %d: device holds other bytes", i)
		}
		h.Release()
		if dev.Used() > dev.Capacity() {
			t.Fatalf("device over capacity: %d", dev.Used())
		}
		checkBudgets(t, s)
	}
	st := checkBudgets(t, s)
	if st.Tiers[TierGPU].Promotions != uint64(len(bs)) || st.Tiers[TierGPU].Demotions == 0 || st.Entries != len(bs) {
		t.Fatalf("gpu stats: %+v entries %d", st.Tiers[TierGPU], st.Entries)
	}
	// A host read of a GPU entry is a copy; a second GetDevice is a hit.
	last := bs[len(bs)-1]
	if got, tier, err := s.get(ctx, keyOf(t, last)); err != nil || tier != TierGPU || !bytes.Equal(got.Bytes(), last) {
		t.Fatalf("host read: tier %v, %v", tier, err)
	}
	h, err := s.GetDevice(ctx, keyOf(t, last))
	if err != nil {
		t.Fatal(err)
	}
	// Pinned on the device: it survives everything else passing through.
	for _, b := range bs[:6] {
		h2, err := s.GetDevice(ctx, keyOf(t, b))
		if err != nil {
			t.Fatal(err)
		}
		h2.Release()
	}
	if !bytes.Equal(read(h), last) {
		t.Fatal("pinned device entry changed")
	}
	h.Release()
	// Every entry still reads back exactly, wherever it went.
	for _, b := range bs {
		h := mustGet(t, s, b)
		h.Release()
	}
	h0, err := s.GetDevice(ctx, keyOf(t, bs[0]))
	if err != nil {
		t.Fatal(err)
	}
	h0.Release()
	big := makeBlob(t, testFP, 77, 200, testStandalone, 2)
	if _, err := s.Put(ctx, big, PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetDevice(ctx, keyOf(t, big)); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("oversized device promotion: %v", err)
	}
}

// TestGPUTierVerifies: an entry enters the GPU tier only from host bytes
// whose layers match their checksums, and its handle carries the header
// parsed then; the copy lies at real addresses of the slab (a HostSlab),
// as a device kernel reads it. An entry in a codec not asked for stays.
func TestGPUTierVerifies(t *testing.T) {
	ctx := t.Context()
	mem := NewHostSlab(1 << 20)
	dev, err := NewSlabDevice(mem, SlabConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dev.Close() })
	s := openTest(t, Config{DRAMBytes: 64 * 4096, GPU: dev})
	bs := blobs(t, 2, 12)
	for _, b := range bs {
		if _, err := s.Put(ctx, b, PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	good, bad := keyOf(t, bs[0]), keyOf(t, bs[1])

	if _, err := s.GetDevice(ctx, good, chunk.CodecInt8, chunk.CodecFP8); !errors.Is(err, ErrWrongCodec) {
		t.Fatalf("a raw entry asked for in int8 or fp8: %v", err)
	}
	h, err := s.GetDevice(ctx, good, chunk.CodecRaw)
	if err != nil {
		t.Fatal(err)
	}
	want, err := chunk.ParseHeader(bs[0], chunk.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if h.Header == nil || !reflect.DeepEqual(*h.Header, want) {
		t.Fatalf("handle header %+v, want %+v", h.Header, want)
	}
	at, err := mem.At(uint64(h.Ptr), int(h.Size))
	if err != nil || !bytes.Equal(at, bs[0]) {
		t.Fatalf("the bytes at the handle's address differ from the entry (%v)", err)
	}
	if got := s.Stats().Tiers[TierGPU].PinnedBytes; got != h.Size {
		t.Fatalf("%d bytes pinned on the GPU, want %d", got, h.Size)
	}
	h.Release()
	h.Release() // a second Release does nothing
	h2, err := s.GetDevice(ctx, good)
	if err != nil || h2.Header != h.Header {
		t.Fatalf("a GPU hit lends another header (%v)", err)
	}
	h2.Release()

	// One flipped payload bit in DRAM: the entry does not enter the tier.
	b, err := s.Get(ctx, bad)
	if err != nil {
		t.Fatal(err)
	}
	b.Bytes()[len(b.Bytes())-1] ^= 1
	b.Release()
	if _, err := s.GetDevice(ctx, bad); !errors.Is(err, chunk.ErrCorrupt) {
		t.Fatalf("a corrupt entry promoted: %v", err)
	}
	if got, tier, err := s.get(ctx, bad); err != nil || tier != TierDRAM {
		t.Fatalf("the corrupt entry: tier %v, %v; want it left in DRAM", tier, err)
	} else {
		got.Release()
	}
	st := checkBudgets(t, s)
	if st.Tiers[TierGPU].PinnedBytes != 0 || st.Tiers[TierDRAM].PinnedBytes != 0 {
		t.Fatalf("pins left: gpu %d, dram %d", st.Tiers[TierGPU].PinnedBytes, st.Tiers[TierDRAM].PinnedBytes)
	}
	if st.Tiers[TierGPU].Bytes != int64(len(bs[0])) {
		t.Fatalf("GPU tier holds %d bytes, want the good entry's %d", st.Tiers[TierGPU].Bytes, len(bs[0]))
	}
}
