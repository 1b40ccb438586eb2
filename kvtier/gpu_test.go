package kvtier

import (
	"bytes"
	"errors"
	"testing"
	"time"
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
			d, err := NewSlabDevice(newHostSlab(1<<40, capacity), SlabConfig{})
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
