package inject

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/chunk"
	"github.com/kvmesh/kvmesh/cudakern"
	"github.com/kvmesh/kvmesh/pagedkv"
	"github.com/kvmesh/kvmesh/pinned"
)

// arrival is an entry arriving layer by layer, as a replica's stream
// delivers it: dst holds the head at first; feed copies the next layers
// from src, fail ends the arrival.
type arrival struct {
	src, dst []byte
	hd       chunk.Header

	mu      sync.Mutex
	n       int   // layers in place
	err     error // why no more will come
	changed chan struct{}
}

func newArrival(t testing.TB, src []byte) *arrival {
	hd, err := chunk.ParseHeader(src, chunk.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	a := &arrival{src: src, dst: make([]byte, len(src)), hd: hd, changed: make(chan struct{})}
	copy(a.dst, src[:hd.PayloadStart])
	return a
}

// feed puts layers up to n in place.
func (a *arrival) feed(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for ; a.n < n; a.n++ {
		ref := a.hd.Layers[a.n]
		at := a.hd.PayloadStart + int(ref.Offset)
		copy(a.dst[at:at+int(ref.Length)], a.src[at:])
	}
	close(a.changed)
	a.changed = make(chan struct{})
}

func (a *arrival) fail(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.err = err
	close(a.changed)
	a.changed = make(chan struct{})
}

func (a *arrival) Ready(ctx context.Context, l int) error {
	for {
		a.mu.Lock()
		n, err, ch := a.n, a.err, a.changed
		a.mu.Unlock()
		switch {
		case l < n:
			return nil
		case err != nil:
			return err
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// arrivingFetcher answers with entries still arriving: the ones the test
// put, by content.
type arrivingFetcher struct {
	mu       sync.Mutex
	arrivals map[chunk.ID]*arrival
}

func (f *arrivingFetcher) Fetch(_ context.Context, key chunk.Key) (Fetched, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a := f.arrivals[key.Content]
	if a == nil {
		return Fetched{Match: chunk.MatchMiss}, nil
	}
	return Fetched{Blob: pinned.Owned(a.dst), Arriving: a, Match: chunk.MatchExact}, nil
}

// arrivingSetup is a service over an arrivingFetcher, a registered
// in-process cache filled with a pattern, and two chunks (a and b) of
// codec c ready to arrive.
type arrivingSetup struct {
	s      *Service
	id     CacheID
	mem    [][]byte
	lay    pagedkv.CacheLayout
	spec   chunk.ModelSpec
	blobs  [2][]byte
	arr    [2]*arrival
	chunks []pagedkv.InjectChunk
}

func newArrivingSetup(t *testing.T, c chunk.Codec, corrupt func(blob []byte, hd *chunk.Header)) *arrivingSetup {
	rng := rand.New(rand.NewPCG(11, uint64(c)))
	spec := testSpec(chunk.BF16)
	f := &arrivingFetcher{arrivals: map[chunk.ID]*arrival{}}
	su := &arrivingSetup{s: newService(t, f, spec, nil), spec: spec}
	su.lay = pagedkv.CacheLayout{Order: pagedkv.NHD, NumBlocks: 8, BlockSize: 16, KVHeads: spec.KVHeads, HeadDim: spec.HeadDim, DType: chunk.BF16}
	d := Descriptor{Fingerprint: spec.Fingerprint(), Layers: spec.Layers, MaxPositions: 4096}
	su.id, su.mem = registerMem(t, su.s, inProc, d, su.lay)
	fillPattern(su.mem, 0x33)
	slots := slotPlan(rng, su.lay.Slots(), []int{9, 14}, false)
	for i := range su.blobs {
		tokens := randTokens(rng, len(slots[i]))
		e := synthEntry(rng, spec, tokens, chunk.StandaloneContext())
		su.blobs[i] = encode(t, e, c)
		su.arr[i] = newArrival(t, su.blobs[i])
		if i == 0 && corrupt != nil {
			src := append([]byte(nil), su.blobs[i]...)
			corrupt(src, &su.arr[i].hd)
			su.arr[i].src = src
		}
		f.arrivals[e.Key.Content] = su.arr[i]
		su.chunks = append(su.chunks, pagedkv.InjectChunk{Key: chunk.Key{Context: chunk.StandaloneContext()}, Tokens: tokens, Pos: 40 * (i + 1), Slots: slots[i]})
	}
	return su
}

// want is the cache after injecting chunk i's layers [0, layers[i]) the
// direct way into the pattern.
func (su *arrivingSetup) want(t *testing.T, layers [2]int) [][]byte {
	rope, err := cudakern.NewRopeTable(su.spec, 4096)
	if err != nil {
		t.Fatal(err)
	}
	inj := cudakern.NewInjector(cudakern.Config{Workers: 1})
	defer inj.Close()
	want := layersOf(su.spec.Layers, su.lay)
	fillPattern(want, 0x33)
	for i, blob := range su.blobs {
		full := cloneLayers(want)
		directInject(t, inj, rope, blob, su.lay, 0, su.spec.KVHeads, su.chunks[i].Pos, su.chunks[i].Slots, full)
		for l := range layers[i] {
			want[l] = full[l]
		}
	}
	return want
}

// check: chunk 1 is written whole; chunk 0, whose layer failed (it did
// not arrive or failed its checksum), is not written at that layer, and at
// every other layer either not written or written with its right bytes.
// The pipeline works on a few layers at once, so layers on either side of
// the failed one may have been written before the failure was seen; a
// MISS chunk's slots are prefilled by the engine anyway, what must never
// reach the cache is a byte that was not verified.
func (su *arrivingSetup) check(t *testing.T, what string, failed int) {
	t.Helper()
	all := su.spec.Layers
	none, whole := su.want(t, [2]int{0, all}), su.want(t, [2]int{all, all})
	for l := range all {
		if l != failed && bytes.Equal(su.mem[l], whole[l]) {
			continue
		}
		equalLayers(t, fmt.Sprintf("%s: layer %d", what, l), su.mem[l:l+1], none[l:l+1])
	}
}

// TestInjectArriving: entries handed over with only their head in place
// are planned from the head alone (before any layer arrived), each layer
// is written once it arrived, in layer order, and the cache ends equal to
// injecting the whole entries.
func TestInjectArriving(t *testing.T) {
	for _, c := range []chunk.Codec{chunk.CodecRaw, chunk.CodecLossless} {
		t.Run(c.String(), func(t *testing.T) {
			su := newArrivingSetup(t, c, nil)
			var events []int
			done := make(chan struct{})
			planned := false
			defer func() {
				if planned {
					<-done // the feeder has finished
				}
			}()
			req := &Request{Cache: su.id, Chunks: su.chunks,
				OnPlan: func(res []Result) {
					planned = true
					for i, r := range res {
						if r.Match != chunk.MatchExact {
							t.Errorf("plan: chunk %d %v", i, r.Match)
						}
					}
					// Nothing has arrived yet; feed one layer at a time.
					go func() {
						defer close(done)
						for l := 1; l <= su.spec.Layers; l++ {
							su.arr[1].feed(l)
							su.arr[0].feed(l)
						}
					}()
				},
				OnLayer: func(l int) { events = append(events, l) },
			}
			resp, err := su.s.Inject(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range resp.Results {
				if r.Match != chunk.MatchExact {
					t.Fatalf("chunk %d: %v (%v)", i, r.Match, r.Reason)
				}
			}
			for l, got := range events {
				if got != l {
					t.Fatalf("layer events %v", events)
				}
			}
			if len(events) != su.spec.Layers {
				t.Fatalf("layer events %v", events)
			}
			// The pipeline waited for layers that had not arrived.
			if resp.Timings.Arrive <= 0 {
				t.Errorf("timings %+v, want arrive filled", resp.Timings)
			}
			all := su.spec.Layers
			equalLayers(t, "arrived", su.mem, su.want(t, [2]int{all, all}))
		})
	}
}

// TestInjectArrivingCorruptLayer: a layer that arrives with bytes its
// checksum refuses is never written; its chunk is a MISS (the engine
// prefills it), and the other chunk is whole.
func TestInjectArrivingCorruptLayer(t *testing.T) {
	for _, c := range []chunk.Codec{chunk.CodecRaw, chunk.CodecLossless} {
		t.Run(c.String(), func(t *testing.T) {
			su := newArrivingSetup(t, c, func(blob []byte, hd *chunk.Header) {
				blob[hd.PayloadStart+int(hd.Layers[1].Offset)+3] ^= 0x40
			})
			for _, a := range su.arr {
				a.feed(su.spec.Layers)
			}
			resp, err := su.s.Inject(t.Context(), &Request{Cache: su.id, Chunks: su.chunks})
			if err != nil {
				t.Fatal(err)
			}
			if r := resp.Results[0]; r.Match != chunk.MatchMiss || !errors.Is(r.Reason, chunk.ErrCorrupt) {
				t.Fatalf("corrupt chunk: %v (%v)", r.Match, r.Reason)
			}
			if r := resp.Results[1]; r.Match != chunk.MatchExact {
				t.Fatalf("other chunk: %v (%v)", r.Match, r.Reason)
			}
			su.check(t, "corrupt layer 1", 1)
		})
	}
}

// TestInjectArrivingStops: an entry whose stream fails after a layer is a
// MISS, none of its later layers written (the request goes on); a request whose
// context ends while it waits for a layer returns the context's error.
func TestInjectArrivingStops(t *testing.T) {
	su := newArrivingSetup(t, chunk.CodecRaw, nil)
	broken := errors.New("stream broke")
	su.arr[0].feed(1)
	su.arr[0].fail(broken)
	su.arr[1].feed(su.spec.Layers)
	resp, err := su.s.Inject(t.Context(), &Request{Cache: su.id, Chunks: su.chunks})
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.Results[0]; r.Match != chunk.MatchMiss || !errors.Is(r.Reason, broken) {
		t.Fatalf("broken stream: %v (%v)", r.Match, r.Reason)
	}
	su.check(t, "stopped after layer 0", 1)

	su = newArrivingSetup(t, chunk.CodecRaw, nil)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	_, err = su.s.Inject(ctx, &Request{Cache: su.id, Chunks: su.chunks, OnPlan: func([]Result) { cancel() }})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled while waiting: %v", err)
	}
}
