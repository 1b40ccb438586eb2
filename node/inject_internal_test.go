package node

import (
	"bytes"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/peer"

	"github.com/kvmesh/kvmesh/inject"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvtier"
)

func TestLocalPeer(t *testing.T) {
	for _, tc := range []struct {
		addr net.Addr
		want bool
	}{
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 11), Port: 1}, true},
		{&net.TCPAddr{IP: net.IPv6loopback, Port: 1}, true},
		{&net.TCPAddr{IP: net.IPv4(192, 168, 1, 2), Port: 1}, false},
		{&net.UnixAddr{Name: "/run/kvmesh.sock", Net: "unix"}, true},
		{nil, false},
	} {
		ctx := t.Context()
		if tc.addr != nil {
			ctx = peer.NewContext(ctx, &peer.Peer{Addr: tc.addr})
		}
		if got := localPeer(ctx); got != tc.want {
			t.Errorf("%v: %v, want %v", tc.addr, got, tc.want)
		}
	}
}

// TestGPULocal: with a GPU tier, the injection path's Local lends the
// tier's entries to caches on its device only, at the slab's addresses
// with the header the tier checked, and the fetched bytes count as "gpu".
func TestGPULocal(t *testing.T) {
	ctx := t.Context()
	slab := kvtier.NewHostSlab(1 << 20)
	dev, err := kvtier.NewSlabDevice(slab, kvtier.SlabConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dev.Close() })
	st, err := kvtier.Open(kvtier.Config{DRAMBytes: 1 << 20, GPU: dev, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	key, blob := testutil.StandaloneBlob(t, rand.New(rand.NewPCG(29, 4)), testutil.Spec(), 12)
	if _, err := st.Put(ctx, blob, kvtier.PutOptions{}); err != nil {
		t.Fatal(err)
	}

	if _, ok := (&Node{store: st}).injectLocal().(inject.DeviceLocal); ok {
		t.Fatal("a node without a GPU tier lends device copies")
	}
	local, ok := (&Node{store: st, cfg: Config{GPUBytes: 1 << 20, GPUDevice: 2}}).injectLocal().(inject.DeviceLocal)
	if !ok {
		t.Fatal("a node with a GPU tier lends no device copies")
	}
	if _, err := local.GetDevice(ctx, key, 1, nil); !errors.Is(err, errOtherDevice) {
		t.Fatalf("a cache on device 1, the tier on 2: %v", err)
	}
	if n := st.Stats().Tiers[kvtier.TierGPU].Entries; n != 0 {
		t.Fatalf("%d entries moved to the GPU tier for a cache on another device", n)
	}
	dc, err := local.GetDevice(ctx, key, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	at, err := slab.At(dc.Ptr, len(blob))
	if err != nil || !bytes.Equal(at, blob) || dc.Header.Key != key {
		t.Fatalf("the device copy is not the entry (%v)", err)
	}
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fetched"}, []string{"source"})
	countingFetcher{c: c}.count(inject.Fetched{Device: &dc, Local: true}, nil)
	if got := readCounter(c.WithLabelValues("gpu")); got != float64(len(blob)) {
		t.Fatalf("gpu bytes %v, want %d", got, len(blob))
	}
	dc.Release()
	if p := st.Stats().Tiers[kvtier.TierGPU].PinnedBytes; p != 0 {
		t.Fatalf("%d bytes pinned after Release", p)
	}
}
